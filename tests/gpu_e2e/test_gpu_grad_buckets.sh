#!/usr/bin/env bash
# Gradient buckets in the GPU job: 1-2, --backend cuda, the target and both drafters on the machine's GPUs
# (one GPU: all three share it, and the drafters sum through host MPI staged in pinned memory; two GPUs:
# the drafters sit on different GPUs and sum through NCCL). The gradient summed in many buckets launched
# during the backward (--grad-bucket-mb 0.01) must train the model of one sum after it (--grad-bucket-mb 0)
# on the same batches (--batch-order fixed): the same tokens, losses and grad norms within 1e-4 relative
# (the two runs recompute their gradients; bf16 kernels need not repeat to the bit), and the log must show
# the buckets.
source "$(dirname "$0")/gpu_lib.sh"
common=(--backend cuda --topology 1-2 --batch-order fixed --draft-layers 2 --max-steps 12 --log-every 4 --seed 5)
run_job one 3 300 "${common[@]}" --grad-bucket-mb 0
expect_rc 0 one
expect_log one "gradient allreduce: 1 bucket(s)"
run_job many 3 300 "${common[@]}" --grad-bucket-mb 0.01
expect_rc 0 many
n=$(sed -n 's/.*gradient allreduce: \([0-9]*\) bucket(s).*/\1/p' "$WORK/many.log" | head -1)
[ "${n:-0}" -gt 4 ] || fail "many: expected several buckets, the log says '${n:-nothing}'"
note "many: $n buckets; $(grep -o 'gradients: [^;]*$' "$WORK/many.log" | head -1)"
"$PY" - "$WORK/one/metrics.h5" "$WORK/many/metrics.h5" <<'PYEOF' || fail "bucketed and one-piece gradient sums trained different models"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
assert np.array_equal(a['steps/tokens'][:], b['steps/tokens'][:]), 'the runs trained on different batches'
for k in ('loss', 'grad_norm'):
    u, v = a['steps/' + k][:], b['steps/' + k][:]
    assert len(u) == 12 and np.allclose(u, v, rtol=1e-4, atol=0), (k, u, v)
    print(k, 'identical' if np.array_equal(u, v) else 'max rel diff %.2e' % (np.abs(u - v) / np.abs(u)).max())
PYEOF
echo "PASS"
