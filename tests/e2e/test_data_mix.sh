#!/usr/bin/env bash
# Mixing datasets (issue 31, docs/data.md "Mixing datasets"): two files of one tokenizer (the tiny data split
# into a.h5, 200 records, and b.h5, 120) trained as `--data a.h5:0.7 --data b.h5:0.3`.
# 1. The mix trains: the startup line gives each file's share and slots (224 + 96 = the 320 records), the
#    target sends every slot of the epoch exactly once, metrics.h5 records the list and the epoch's tokens.
# 2. With --batch-order fixed, a 2-1 run stopped at a checkpoint (--inject-stop-step: exit 75) and resumed
#    with --resume auto logs the losses of the uninterrupted run bit for bit and exports the same drafter.
# 3. A resume with another weight is refused (exit 2, naming --data and the slot table); one with a file
#    rewritten at its path (exit 3, naming the file's fields).
# 4. A repeated --data without weights is refused (exit 2): it used to keep the last file silently.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/a.h5" "$WORK/b.h5" 120
A="$WORK/a.h5" B="$WORK/b.h5"
MIX=(--data "$A:0.7" --data "$B:0.3")

# 1. One epoch of the mix on 1-1.
mkdir -p "$WORK/trace_mix"
run_job mix 2 180 --topology 1-1 "${MIX[@]}" --epochs 1 --seed 3 --log-every 5 --inject-trace-dir "$WORK/trace_mix"
expect_rc 0 mix
expect_log mix "[dflash] data: mix of 2 datasets: $A 70% (200 records -> 224 slots), $B 30% (120 records -> 96 slots); 320 slots,"
expect_log mix "--data=$A:0.7,$B:0.3"
"$PY" - "$WORK/trace_mix" "$WORK/mix/metrics.h5" "$WORK/mix.log" <<'PY' || fail "the mix's epoch is not its 320 slots once each"
import glob, re, sys, h5py
sent = []
for path in glob.glob(sys.argv[1] + "/trace.rank*"):
    for line in open(path):
        w = line.split()
        if w[0] == "sent":
            assert int(w[4]) == 0, line
            sent += [int(x) for x in w[5:]]
assert sorted(sent) == list(range(320)), sorted(sent)[:20]
tokens = int(re.search(r"320 slots, (\d+) tokens per epoch", open(sys.argv[3]).read()).group(1))
with h5py.File(sys.argv[2], "r") as f:
    assert int(f.attrs["dataset_tokens"]) == tokens, (f.attrs["dataset_tokens"], tokens)
print("# 320 slots sent once each;", tokens, "tokens per epoch")
PY

# 2. Stopped at step N/2 and resumed with --resume auto: the straight run's losses bit for bit.
N=12
COMMON=(--topology 2-1 "${MIX[@]}" --batch-order fixed --max-steps $N --seed 5 --log-every 1)
run_job straight 3 180 "${COMMON[@]}"
expect_rc 0 straight
run_job stopped 3 180 "${COMMON[@]}" --inject-stop-step $((N / 2))
expect_rc 75 stopped
expect_log stopped "test hook --inject-stop-step $((N / 2)): checkpointed at step $((N / 2))"
cp "$WORK/stopped.log" "$WORK/stopped1.log"
run_job stopped 3 180 "${COMMON[@]}" --resume auto --inject-delay-target-ms 20 --hs-queue-depth 1
expect_rc 0 stopped
expect_log stopped "resuming from $WORK/stopped/checkpoints/step-0000000$((N / 2))"
"$PY" - "$WORK/straight/metrics.h5" "$WORK/stopped/metrics.h5" "$N" <<'PY' || fail "the resumed mix's losses differ from the straight run's"
import sys, h5py, numpy as np
a, b, n = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r"), int(sys.argv[3])
assert list(a["steps/step"][:]) == list(range(1, n + 1)), a["steps/step"][:]
assert list(b["steps/step"][:]) == list(range(1, n + 1)), b["steps/step"][:]
for k in ("loss", "acc", "grad_norm", "lr", "tokens"):
    assert np.array_equal(a["steps/" + k][:], b["steps/" + k][:]), (k, a["steps/" + k][:], b["steps/" + k][:])
print("# steps 1 ..", n, "identical across the stop; last loss", b["steps/loss"][-1])
PY
cmp -s "$WORK/straight/drafter/model.safetensors" "$WORK/stopped/drafter/model.safetensors" ||
  fail "the drafter exported after resuming the mix differs from the straight run's"

# 3. Another weight on resume: refused, naming it; a file rewritten at its path: refused, naming its fields.
half="$WORK/stopped/checkpoints/step-0000000$((N / 2))"
run_job reweighted 3 60 --topology 2-1 --data "$A:0.6" --data "$B:0.4" --batch-order fixed --max-steps $N --seed 5 --resume "$half"
expect_rc 2 reweighted
expect_log reweighted "--data: saved '$A:0.7,$B:0.3', now '$A:0.6,$B:0.4'"
expect_log reweighted "slot_table differ"
cp "$B" "$WORK/b-orig.h5"
split_eval_set "$WORK/b-orig.h5" "$B" "$WORK/b-rest.h5" 20  # b.h5 now holds 100 of its records
run_job rewritten 3 60 "${COMMON[@]}" --resume "$half"
expect_rc 3 rewritten
expect_log rewritten "the dataset (--data) at the same path is not what the checkpoint was trained on"
expect_log rewritten "d1.records 120 -> 100"

# 4. A repeated --data without weights: refused before anything starts.
run_job repeated 2 60 --topology 1-1 --data "$A" --data "$WORK/b-orig.h5"
expect_rc 2 repeated
expect_log repeated "--data is given 2 times, and $A, $WORK/b-orig.h5 without a weight: a mix of datasets needs a weight on each file"
[ ! -e "$WORK/repeated" ] || fail "a refused --data list created --out"
echo "PASS"
