#!/usr/bin/env bash
# --hs-dtype fp8 on the GPU (docs/fp8.md "The FP8 wire"): the target quantizes its captures on the device
# (kernels/fp8_rows.cu), the batch travels as e4m3 codes + row scales, the drafter dequantizes into bf16.
#  - 1-1 on the host plane (both ranks on one GPU) with bf16 and with fp8, --batch-order fixed: both finish, the
#    fp8 losses are finite, track bf16's (per step <= 3 % relative) and differ from them (the wire changed);
#  - colocated (the local plane, the target on a second stream) with fp8 trains what 1-1 with fp8 trains, bit
#    for bit (deterministic kernels, as test_gpu_colocated.sh holds for bf16), the same exported drafter;
#  - the startup line names the FP8 wire and a batch about half of bf16's.
# DFLASH_TEST_PLANE picks the split's plane (default host; nccl needs a GPU per rank, cuda-mpi a CUDA-aware MPI).
source "$(dirname "$0")/gpu_lib.sh"
plane=${DFLASH_TEST_PLANE:-host}
common=(--backend cuda --batch-order fixed --max-steps 16 --seed 2 --lr 0.02 --log-every 4 --hs-queue-depth 2)
run_job bf16 2 300 --topology 1-1 "${common[@]}" --data-plane "$plane"
expect_rc 0 bf16
expect_log bf16 "BF16 on the wire"
run_job fp8 2 300 --topology 1-1 "${common[@]}" --data-plane "$plane" --hs-dtype fp8
expect_rc 0 fp8
expect_log fp8 "FP8 (e4m3, a float32 scale per token row) on the wire"
run_job coloc 1 300 --topology colocated "${common[@]}" --hs-dtype fp8
expect_rc 0 coloc
expect_log coloc "local plane"
"$PY" - "$WORK" <<'PYEOF' || fail "the FP8 wire on the GPU"
import re, sys, h5py, numpy as np
w = sys.argv[1]
def steps(name, k='loss'):
    return h5py.File(f'{w}/{name}/metrics.h5', 'r')['steps/' + k][:]
b, f = steps('bf16'), steps('fp8')
assert len(b) == len(f) == 16 and np.all(np.isfinite(f)), (b, f)
assert np.array_equal(steps('bf16', 'tokens'), steps('fp8', 'tokens')), 'the runs trained on different batches'
rel = np.abs(f - b) / np.abs(b)
print(f'fp8 wire vs bf16: relative loss difference max {rel.max():.5f} mean {rel.mean():.5f}')
assert rel.max() > 0, 'identical to bf16: the features did not travel in fp8'
assert rel.max() <= 0.03, rel
for k in ('step', 'loss', 'acc', 'grad_norm', 'lr', 'tokens', 'anchors'):
    assert np.array_equal(steps('fp8', k), steps('coloc', k)), ('colocated fp8 differs from 1-1 fp8', k)
def mib(name):
    return float(re.search(r'on the wire, ([0-9.]+) MiB per full batch', open(f'{w}/{name}.log').read()).group(1))
print(f'a full batch: bf16 {mib("bf16")} MiB, fp8 {mib("fp8")} MiB')
assert 0.45 < mib('fp8') / mib('bf16') < 0.6
PYEOF
cmp -s "$WORK/fp8/drafter/model.safetensors" "$WORK/coloc/drafter/model.safetensors" ||
  fail "colocated fp8 exported another drafter than 1-1 fp8"
echo "PASS"
