#!/usr/bin/env bash
# --topology colocated (docs/pipeline.md "The colocated layout"): every rank runs a target and a drafter in
# one process, the captures handed to its own drafter through the local plane. With --batch-order fixed a
# colocated run on N ranks trains exactly what the N-N split on 2N ranks trains (target i feeds drafter i in
# both): the same /steps and /eval numbers bit for bit and a byte-identical exported drafter.
#  - colocated on 2 ranks (mpirun) against 2-2 on 4, to the end of the data, with --eval-data and checkpoints;
#  - colocated as one plain process (no mpirun: a singleton MPI world, the one-GPU user's command) against 1-1;
#  - metrics.h5, the startup, the status line and dflash-report (its what-if row and verdict) name the layout;
#    a different seed changes the losses (the check can fail);
#  - --dry-run counts a colocated rank's memory as the target's and the drafter's together, and says whether it
#    fits (Qwen3-8B's recipe on one GPU: an H200 holds it, 80 GiB only with --optimizer-state bf16).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
COMMON=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --batch-order fixed --seed 5 --log-every 4
        --checkpoint-every 6 --eval-every 6 --peer-timeout 120)  # 4 ranks on a loaded 2-core CI machine

run_job split22 4 400 --topology 2-2 "${COMMON[@]}"
expect_rc 0 split22
run_job coloc2 2 400 --topology colocated "${COMMON[@]}"
expect_rc 0 coloc2
expect_log coloc2 "topology colocated"
expect_log coloc2 "local plane"
ls -d "$WORK/coloc2/checkpoints/"step-* >/dev/null 2>&1 || fail "coloc2 wrote no checkpoint"
h5check "$WORK/coloc2/metrics.h5" "f.attrs['topology'] in ('colocated', b'colocated')"
grep -qE '^\[[0-9]+s\] step=[0-9]+ .* \| colocated \| q_pre=' "$WORK/coloc2.log" || fail "coloc2: no '| colocated' status line"
"$DFLASH_SRC/tools/dflash-report" "$WORK/coloc2/metrics.h5" >"$WORK/coloc2.report" 2>&1 || { cat "$WORK/coloc2.report" >&2; fail "dflash-report on a colocated run failed"; }
grep -q "run: topology colocated on 1 node(s) x 2 rank(s)" "$WORK/coloc2.report" || fail "dflash-report does not name the colocated layout"
grep -qE '^ \*colocated ' "$WORK/coloc2.report" || fail "dflash-report's what-if lacks the run's colocated row"

# One plain process: the singleton MPI world a user with one GPU starts (no mpirun).
singleton() {  # singleton NAME ARGS...: like run_job with np 1, without mpirun
  local name=$1
  shift
  printf 'target = %s\ndata = %s\nout = %s\ndraft-layers = 1\ntoken-budget = 512\npeer-timeout = 120\nbackend = cpu\n' \
    "$tiny/target" "$tiny/data.h5" "$WORK/$name" >"$WORK/$name.cfg"
  set +e
  (unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS SLURM_NTASKS
   timeout -k 5 300 "$TRAIN" --config "$WORK/$name.cfg" "$@" >"$WORK/$name.log" 2>&1)
  RC=$?
  set -e
  note "$name: exit $RC"
}
ONE=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --seed 5 --max-steps 8 --log-every 4 --eval-every 4 --peer-timeout 120)
run_job split11 2 300 --topology 1-1 "${ONE[@]}"
expect_rc 0 split11
singleton coloc1 --topology colocated "${ONE[@]}"
expect_rc 0 coloc1
singleton coloc1s7 --topology colocated "${ONE[@]}" --seed 7
expect_rc 0 coloc1s7

"$PY" - "$WORK" <<'PYEOF' || fail "colocated does not train what the split trains"
import sys, h5py, numpy as np
w = sys.argv[1]
def same(x, y):
    a, b = h5py.File(f'{w}/{x}/metrics.h5', 'r'), h5py.File(f'{w}/{y}/metrics.h5', 'r')
    for k in ('step', 'loss', 'acc', 'grad_norm', 'lr', 'tokens', 'anchors'):
        u, v = a['steps/' + k][:], b['steps/' + k][:]
        assert len(u) >= 4 and np.array_equal(u, v), (x, y, k, u, v)
    for k in ('step', 'loss', 'acc'):
        u, v = a['eval/' + k][:], b['eval/' + k][:]
        assert len(u) >= 1 and np.array_equal(u, v), (x, y, 'eval', k, u, v)
    return len(a['steps/loss'])
n2 = same('split22', 'coloc2')
n1 = same('split11', 'coloc1')
s5 = h5py.File(f'{w}/coloc1/metrics.h5', 'r')['steps/loss'][:]
s7 = h5py.File(f'{w}/coloc1s7/metrics.h5', 'r')['steps/loss'][:]
assert not np.array_equal(s5, s7), 'seed 7 gave the losses of seed 5'
print(f'colocated on 2 ranks = 2-2 on 4 ({n2} steps, to the end of the data); one process = 1-1 ({n1} steps)')
PYEOF
for pair in "split22 coloc2" "split11 coloc1"; do
  set -- $pair
  cmp -s "$WORK/$1/drafter/model.safetensors" "$WORK/$2/drafter/model.safetensors" ||
    fail "the drafter $2 exported differs from $1's"
done

qwen3_8b_config "$WORK/qwen3-8b"
records_h5 "$WORK/records3072.h5" 151936 40 3072
# The 8B recipe at the reference trainers' anchor density (3072 a batch, where both roles pass 80 GB; the recipe
# itself draws 2048 a batch: 71.4 GiB)
Q8=(--ranks 1 --topology colocated --backend cuda --config "$DFLASH_SRC/jobs/recipes/qwen3-8b.cfg" --target "$WORK/qwen3-8b"
    --data "$WORK/records3072.h5" --anchors-per-record 512 --max-anchors 3072)
dry dryh200 "${Q8[@]}" --gpu h200
expect_rc 0 dryh200
expect_log dryh200 "colocated rank(s) 0: 84.7 GiB fixed, 55.7 GiB left for the activations"
expect_log dryh200 "a colocated rank holds both: 84.7 GiB fixed (target + drafter)"
dry dry80 "${Q8[@]}" --gpu 80
expect_rc 2 dry80
expect_log dry80 "colocated rank(s) 0 need 84.7 GiB of fixed memory, more than the GPU's 80.0 GiB"
expect_log dry80 "--optimizer-state bf16 makes it fit (76.9 GiB fixed"
dry dry80bf16 "${Q8[@]}" --gpu 80 --optimizer-state bf16
expect_rc 0 dry80bf16
echo "PASS"
