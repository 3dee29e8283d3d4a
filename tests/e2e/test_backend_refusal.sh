#!/usr/bin/env bash
# --backend refusals through real mpirun, each with its own exit code and message, before any model loads:
#  - an unknown backend: exit 2 naming the choices;
#  - --backend cuda in a build without the CUDA backend: exit 2 "this build has no CUDA backend";
#  - --backend cuda in a CUDA build on a machine without a GPU (CI): exit 5 "sees no CUDA device".
# On a machine with a GPU the CUDA job itself is the GPU tests' business (ctest -L gpu).
source "$(dirname "$0")/lib.sh"
run_job unknown 2 60 --topology 1-1 --backend tpu --max-steps 2
expect_rc 2 unknown
expect_log unknown "cpu or cuda"
# dflash-plane-bench is built only with the CUDA backend (bench/CMakeLists.txt), next to dflash-train.
if [ ! -x "$DFLASH_BIN/dflash-plane-bench" ]; then
  run_job cuda 2 60 --topology 1-1 --backend cuda --max-steps 2
  expect_rc 2 cuda
  expect_log cuda "this build has no CUDA backend"
elif ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  run_job cuda 2 60 --topology 1-1 --backend cuda --max-steps 2
  expect_rc 5 cuda
  expect_log cuda "--backend cuda, but this rank sees no CUDA device"
else
  note "a GPU is visible: the CUDA job runs in the GPU tests instead"
fi
grep -q "step=" "$WORK/unknown.log" && fail "a refused job trained"
echo "PASS"
