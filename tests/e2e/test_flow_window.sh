#!/usr/bin/env bash
# Credit windows: one slot per drafter (fewer credits than targets: they must rotate), more slots than
# the run has batches, and 3 targets on 2 slots. Each run trains on every batch of one epoch: the
# drafter's steps equal the batches the targets sent, and q_hs never exceeds the window.
source "$(dirname "$0")/lib.sh"
all_batches_trained() {  # NAME WINDOW
  local m="$WORK/$1/metrics.h5"
  h5check "$m" "len(f['steps/step']) > 0"
  h5check "$m" "int(f['ranks/batches'][:][f['ranks/role'][:] == 0].sum()) == len(f['steps/step'])"
  h5check "$m" "int(f['queues/q_hs'][:].max()) <= $2"
  # every token of the tiny dataset, once (no record is longer than the budgets: --long-record error)
  h5check "$m" "int(f['steps/tokens'][:].sum()) == $DATA_TOKENS"
}
# The dataset's own token count, read from the file the jobs train on (not the generator's current output).
DATA_TOKENS=$("$PY" -c "import h5py, sys; print(h5py.File(sys.argv[1], 'r')['tokens'].shape[0])" "$(tiny_dir)/data.h5")
[ "$DATA_TOKENS" -gt 0 ] || fail "could not read the tiny dataset's token count"
run_job w1 4 180 --topology 2-1 --hs-queue-depth 1 --token-budget 2048 --log-every 2
expect_rc 0 w1
all_batches_trained w1 1
run_job w64 4 180 --topology 2-1 --hs-queue-depth 64 --token-budget 4096 --log-every 1
expect_rc 0 w64
all_batches_trained w64 64
h5check "$WORK/w64/metrics.h5" "len(f['steps/step']) < 64"  # the window really exceeded the batch count
run_job w32 4 180 --topology 3-1 --hs-queue-depth 2 --token-budget 2048 --log-every 2
expect_rc 0 w32
all_batches_trained w32 2
echo "PASS"
