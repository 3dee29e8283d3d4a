#!/usr/bin/env bash
# Gradient buckets (--grad-bucket-mb, docs/pipeline.md "Gradients"). With two drafters and --batch-order
# fixed, summing the gradient in many small buckets, launched while the backward runs, trains exactly the
# model of one allreduce after the backward: each bucket is prescaled by the drafter's weight sum as the
# whole gradient was, and a sum of two is one IEEE addition, so losses, grad norms and the exported drafter
# are identical bit for bit. With three drafters the MPI library picks the association of each sum: the
# losses stay within fp32 reassociation. A negative cap is refused (exit 2).
source "$(dirname "$0")/lib.sh"
common=(--batch-order fixed --draft-layers 2 --log-every 4)
run_job one 4 200 --topology 2-2 --max-steps 8 --grad-bucket-mb 0 "${common[@]}"
expect_rc 0 one
expect_log one "gradient allreduce: 1 bucket(s)"
run_job many 4 200 --topology 2-2 --max-steps 8 --grad-bucket-mb 0.01 "${common[@]}"
expect_rc 0 many
n=$(sed -n 's/.*gradient allreduce: \([0-9]*\) bucket(s).*/\1/p' "$WORK/many.log" | head -1)
[ "${n:-0}" -gt 4 ] || fail "many: expected several buckets, the log says '${n:-nothing}'"
note "many: $n buckets"
cmp -s "$WORK/one/drafter/model.safetensors" "$WORK/many/drafter/model.safetensors" ||
  fail "2 drafters: the drafter trained with $n buckets differs from the one-bucket run's"
run_job three_one 4 200 --topology 1-3 --max-steps 6 --grad-bucket-mb 0 "${common[@]}"
expect_rc 0 three_one
run_job three_many 4 200 --topology 1-3 --max-steps 6 --grad-bucket-mb 0.01 "${common[@]}"
expect_rc 0 three_many
"$PY" - "$WORK" <<'PYEOF' || fail "bucketed and one-piece gradient sums trained different models"
import sys, h5py, numpy as np
w = sys.argv[1]
f = {n: h5py.File(f'{w}/{n}/metrics.h5', 'r') for n in ('one', 'many', 'three_one', 'three_many')}
for k in ('loss', 'acc', 'grad_norm', 'tokens'):
    u, v = f['one']['steps/' + k][:], f['many']['steps/' + k][:]
    assert len(u) == 8 and np.array_equal(u, v), ('2 drafters', k, u, v)
for k in ('loss', 'grad_norm'):
    u, v = f['three_one']['steps/' + k][:], f['three_many']['steps/' + k][:]
    assert len(u) == 6 and np.allclose(u, v, rtol=1e-5, atol=0), ('3 drafters', k, u, v)
same = np.array_equal(f['three_one']['steps/loss'][:], f['three_many']['steps/loss'][:])
print('2 drafters: identical; 3 drafters: losses', 'identical' if same else 'within 1e-5 relative')
PYEOF
run_job bad 1 30 --grad-bucket-mb -1
expect_rc 2 bad
expect_log bad "--grad-bucket-mb"
echo "PASS"
