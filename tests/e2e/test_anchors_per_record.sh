#!/usr/bin/env bash
# --anchors-per-record N (include/dflash/anchors.h): up to N anchors in each record of a packed batch, the
# batch's total bounded by --max-anchors.
#  - on the tiny data (records of 24-96 tokens, ~8 per 512-token batch) 4 per record trains several times the
#    anchors of the per-batch rule at 4 (metrics.h5 /steps/anchors), and never more than 4 per record;
#  - an explicit cap below the draws bounds every step (subsampled: exactly the cap where the draws exceed it);
#  - without --max-anchors the cap is the reference's density, N per 3072 tokens of --token-budget, in the
#    resolved options and the [dflash] anchors line (the job's and --dry-run's); the dry run's drafter memory
#    grows with it;
#  - dflash-report's what-if over the anchors reads the run's rule;
#  - a resume continues the anchor draws: the resumed steps are the straight run's bit for bit.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
N=6
COMMON=(--topology 1-1 --batch-order fixed --max-steps $N --seed 3 --log-every 1)

run_job perbatch 2 120 "${COMMON[@]}" --max-anchors 4
expect_rc 0 perbatch
expect_log perbatch "[dflash] anchors: up to 4 per packed batch (--max-anchors)"
run_job perrec 2 120 "${COMMON[@]}" --anchors-per-record 4 --max-anchors 4096 --checkpoint-every $((N / 2))
expect_rc 0 perrec
expect_log perrec "[dflash] anchors: up to 4 per record (--anchors-per-record), at most 4096 per packed batch"
note "anchors per step: per batch $(h5eval "$WORK/perbatch/metrics.h5" "list(f['steps/anchors'][:])"), per record $(
  h5eval "$WORK/perrec/metrics.h5" "list(f['steps/anchors'][:])")"
h5check "$WORK/perbatch/metrics.h5" "len(f['steps/anchors']) == $N and all(f['steps/anchors'][:] == 4)"
h5check "$WORK/perrec/metrics.h5" "len(f['steps/anchors']) == $N and all(f['steps/anchors'][:] >= 3 * 4)"
# never more than 4 per record: at most 4 x (the records a 512-token batch of records >= 24 tokens can hold)
h5check "$WORK/perrec/metrics.h5" "all(f['steps/anchors'][:] <= 4 * (512 // 24))"

if $PY -c "import h5py, numpy, matplotlib" 2>/dev/null; then  # dflash-report prices more or fewer anchors
  "$DFLASH_SRC/tools/dflash-report" "$WORK/perrec/metrics.h5" >"$WORK/perrec.txt" || fail "dflash-report on perrec"
  grep -q "^ANCHORS WHAT-IF" "$WORK/perrec.txt" || fail "dflash-report: no anchors what-if"
  grep -q "up to 4 per record, at most 4096 per batch" "$WORK/perrec.txt" || fail "dflash-report: not the run's anchor rule"
  grep -q "Anchors: " "$WORK/perrec.txt" || fail "dflash-report: the verdict says nothing of the anchors"
fi

run_job capped 2 120 "${COMMON[@]}" --anchors-per-record 4 --max-anchors 6
expect_rc 0 capped
h5check "$WORK/capped/metrics.h5" "all(f['steps/anchors'][:] == 6)"

# The default cap, in the options and the anchors line of the job and of --dry-run.
run_job defcap 2 120 "${COMMON[@]}" --anchors-per-record 4 --token-budget 6144 --max-steps 2
expect_rc 0 defcap
expect_log defcap "--max-anchors=8"
expect_log defcap "[dflash] anchors: up to 4 per record (--anchors-per-record), at most 8 per packed batch"
dry() {  # dry NAME ARGS...: a dry run; prints the cap and the block-activation MiB of its memory line
  local name=$1
  shift
  run_job "$name" 2 60 --topology 1-1 --dry-run "$@" >/dev/null
  expect_rc 0 "$name"
  sed -n 's/.*block activations for --max-anchors \([0-9]*\) x 16 rows \([0-9.]*\) MiB = .*/\1 \2/p' "$WORK/$name.log"
}
dry1=$(dry dry1 --anchors-per-record 512 --token-budget 3072)
dry2=$(dry dry2 --anchors-per-record 512 --token-budget 6144)
read -r cap1 mib1 <<<"$dry1"
read -r cap2 mib2 <<<"$dry2"
[ "$cap1" = 512 ] && [ "$cap2" = 1024 ] || fail "dry runs: default caps $cap1 and $cap2, expected 512 and 1024"
expect_log dry2 "--max-anchors=1024"
expect_log dry2 "[dflash] anchors: up to 512 per record (--anchors-per-record), at most 1024 per packed batch"
"$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(b - 2 * a) <= 0.2 else 1)" \
  "$mib1" "$mib2" || fail "dry runs: block activations $mib1 MiB at 512 anchors, $mib2 MiB at 1024 (not twice)"
run_job badneg 2 60 --topology 1-1 --anchors-per-record -1 --dry-run
expect_rc 2 badneg
expect_log badneg "anchors-per-record"

# A resume draws the anchors the straight run drew: the same losses, bit for bit.
half="$WORK/perrec/checkpoints/step-0000000$((N / 2))"
[ -f "$half/manifest.json" ] || fail "no checkpoint at step $((N / 2)) in $WORK/perrec/checkpoints"
run_job resumed 2 120 "${COMMON[@]}" --anchors-per-record 4 --max-anchors 4096 --resume "$half"
expect_rc 0 resumed
expect_log resumed "resuming from $half"
expect_resumed_like_straight perrec resumed $N
h5check "$WORK/resumed/metrics.h5" "list(f['steps/anchors'][:]) == list(h5py.File('$WORK/perrec/metrics.h5', 'r')['steps/anchors'][$N // 2:])"
run_job refused 2 60 "${COMMON[@]}" --anchors-per-record 8 --max-anchors 4096 --resume "$half"
expect_rc 2 refused
expect_log refused "--anchors-per-record: saved '4', now '8'"
echo "PASS"
