#!/usr/bin/env bash
# --topology colocated on one GPU (docs/pipeline.md "The colocated layout"): the target and the drafter in
# one process, the target's forward on a second stream writing the captures into the drafter's device slots
# (the local plane: no transfer, no host staging). As one plain process (no mpirun: the one-GPU user's
# command) and through mpirun -np 1 it trains what the 1-1 split (two ranks sharing the GPU, host plane)
# trains: with --batch-order fixed and deterministic kernels the same losses and the same exported drafter,
# bit for bit; through mpirun -np 2 (two colocated ranks on one GPU, host-MPI gradient sums) what 2-2 trains.
source "$(dirname "$0")/gpu_lib.sh"
common=(--backend cuda --batch-order fixed --max-steps 16 --checkpoint-every 8 --seed 2 --lr 0.02 --log-every 4)
run_job split11 2 300 --topology 1-1 "${common[@]}"
expect_rc 0 split11
run_job coloc_mpirun 1 300 --topology colocated "${common[@]}"
expect_rc 0 coloc_mpirun
expect_log coloc_mpirun "local plane"
expect_log coloc_mpirun "| colocated"
tiny=$(tiny_dir)
printf 'target = %s\ndata = %s\nout = %s\ndraft-layers = 1\ntoken-budget = 512\npeer-timeout = 20\n' \
  "$tiny/target" "$tiny/data.h5" "$WORK/coloc_plain" >"$WORK/coloc_plain.cfg"
set +e
(unset OMPI_COMM_WORLD_SIZE SLURM_STEP_NUM_TASKS SLURM_NTASKS
 timeout -k 5 300 "$TRAIN" --config "$WORK/coloc_plain.cfg" --topology colocated "${common[@]}" >"$WORK/coloc_plain.log" 2>&1)
RC=$?
set -e
expect_rc 0 coloc_plain
run_job split22 4 400 --topology 2-2 "${common[@]}"
expect_rc 0 split22
run_job coloc2 2 400 --topology colocated "${common[@]}"
expect_rc 0 coloc2
"$PY" - "$WORK" <<'PYEOF' || fail "colocated on the GPU does not train what the split trains"
import sys, h5py, numpy as np
w = sys.argv[1]
def same(x, y):
    a, b = h5py.File(f'{w}/{x}/metrics.h5', 'r'), h5py.File(f'{w}/{y}/metrics.h5', 'r')
    assert np.array_equal(a['steps/tokens'][:], b['steps/tokens'][:]), (x, y, 'other batches')
    la, lb = a['steps/loss'][:], b['steps/loss'][:]
    print(f'{y} vs {x}: loss max |diff| {np.abs(la - lb).max():.3g}')
    assert np.array_equal(la, lb), (x, y, la - lb)
same('split11', 'coloc_mpirun')
same('split11', 'coloc_plain')
same('split22', 'coloc2')
PYEOF
for pair in "split11 coloc_mpirun" "split11 coloc_plain" "split22 coloc2"; do
  set -- $pair
  cmp "$WORK/$1/drafter/model.safetensors" "$WORK/$2/drafter/model.safetensors" || fail "$2's exported drafter is not $1's"
done
echo "PASS"
