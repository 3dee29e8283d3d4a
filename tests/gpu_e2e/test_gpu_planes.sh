#!/usr/bin/env bash
# The data planes on the GPU machine. Every plane this machine can run delivers bit-identical batches
# (dflash-plane-bench checks each warm-up batch byte for byte against what the target's seed makes, and
# every batch's order); a plane that cannot work here is refused before any model loads (exit 2) with
# its reason. DFLASH_REQUIRE_PLANES=host,cuda-mpi makes a skipped cuda-mpi a failure (the run under the
# CUDA-aware Open MPI of tools/build_cuda_openmpi.sh sets it).
source "$(dirname "$0")/gpu_lib.sh"
set +e
timeout -k 5 300 mpirun -np 2 --oversubscribe "$DFLASH_BIN/dflash-plane-bench" --planes host,cuda-mpi,nccl \
  --require "${DFLASH_REQUIRE_PLANES:-host}" --layers 2 --tokens 4096 --hidden 1024 --iters 4 --warmup 3 >"$WORK/bench.log" 2>&1
RC=$?
set -e
cat "$WORK/bench.log"
[ $RC -eq 0 ] || fail "dflash-plane-bench: exit $RC"
grep -q "^  host .* ok$" "$WORK/bench.log" || fail "the host plane did not deliver checked batches"
grep -q "# all checks passed" "$WORK/bench.log" || fail "a plane's check failed"
# The bench writer's shape (bench/README.md, "Output format"): metadata, the header with its units line, and
# with --json one JSON line per case.
grep -q "^# device: " "$WORK/bench.log" || fail "no device line"
grep -A1 "^# case " "$WORK/bench.log" | grep -q "(GB/s)" || fail "no units under the table header"
timeout -k 5 120 mpirun -np 2 --oversubscribe "$DFLASH_BIN/dflash-plane-bench" --planes host --require host --layers 2 \
  --tokens 1024 --hidden 256 --iters 2 --warmup 1 --json >"$WORK/bench_json.log" 2>&1 || fail "dflash-plane-bench --json"
python3 - "$WORK/bench_json.log" <<'PY' || fail "--json did not print one JSON line per case"
import json, sys
cases = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert [c["case"] for c in cases] == ["d2d-copy", "host"] or cases[-1]["case"] == "host", cases
assert cases[-1]["check"] == "ok" and cases[-1]["gb_per_s"] > 0 and cases[-1]["bench"] == "dflash-plane-bench", cases
PY
if grep -q "CUDA-aware: compile-time yes, run-time yes" "$WORK/bench.log"; then
  grep -q "^  cuda-mpi .* ok$" "$WORK/bench.log" || fail "the MPI is CUDA-aware but cuda-mpi did not deliver checked batches"
else
  run_job refuse_cuda_mpi 2 120 --backend cuda --topology 1-1 --data-plane cuda-mpi --max-steps 2
  expect_rc 2 refuse_cuda_mpi
  expect_log refuse_cuda_mpi "--data-plane cuda-mpi: this MPI library is not CUDA-aware"
fi
if [ "$(nvidia-smi -L | grep -c '^GPU')" -lt 2 ]; then
  run_job refuse_nccl 2 120 --backend cuda --topology 1-1 --data-plane nccl --max-steps 2
  expect_rc 2 refuse_nccl
  expect_log refuse_nccl "share a GPU, and NCCL refuses two ranks of a communicator on one GPU"
  run_job auto 2 300 --backend cuda --topology 1-1 --max-steps 4
  expect_rc 0 auto
  expect_log auto "(auto: a target and a drafter share a GPU (NCCL needs one each)"
fi
echo "PASS"
