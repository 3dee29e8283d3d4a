# Shared by the GPU end-to-end tests (label gpu): the e2e helpers plus a GPU check. Each rank binds GPU
# local rank % visible devices: on the one-GPU machine every rank shares it (host or cuda-mpi planes,
# host-MPI gradient sums); on two GPUs a target and a drafter get one each and NCCL comes in
# (test_gpu_two_gpus.sh needs that and skips, with its reason, on one GPU).
source "$(dirname "$0")/../e2e/lib.sh"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIPPED: no NVIDIA GPU visible (these tests run on the GPU machine: ctest -L gpu)"
  exit 77
fi
export NCCL_NVLS_ENABLE=0
# The GPU machine's python with h5py is the one on PATH (its /usr/bin/python3 has no h5py).
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import h5py' 2>/dev/null; then PY=$(command -v "$p"); break; fi
done
