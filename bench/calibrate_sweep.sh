#!/usr/bin/env bash
# The cost model's calibration sweep (docs/cost_model.md "Recalibrating"): runs the existing bench drivers at
# the shapes src/plan/calibration_points.cpp lists, on the GPU machine, and keeps every log and the lines the
# fit reads (RESULT lines, forward medians, plane and gradient-sum tables) in OUT/summary.txt.
#
#   bash bench/calibrate_sweep.sh BUILD OUT [what...]
# BUILD: a CUDA build directory (bench/ holds bench_target_forward, bench_hybrid_forward, drafter_bench;
#   the top holds dflash-plane-bench, dflash-drafters-bench and dflash-make-random), e.g.
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a
#   cmake --build build-gpu -j2 --target bench_target_forward bench_hybrid_forward drafter_bench \
#         dflash-plane-bench dflash-drafters-bench dflash-make-random
# what (default: peak target drafter): any of
#   peak     the bf16 GEMM ceilings (bench_target_forward --gemm-peak, drafter_bench --gemm-peak)
#   target   the target forwards: 8B 4x4096 all 36 layers and the CE cut (--no-final-norm), 8B --mixed (the
#            quadratic term), 27B hybrid 8x4096 and its CE cut, and 8B 8x2048 (a second record length)
#   drafter  the drafter steps: 8B CE/KL at S 3072 x 512 anchors, fp32 and bf16 state; 8B at S 16384 with
#            512 and 3072 anchors (issue 44's two densities); 27B S 4096 x 512; 27B DFlash2 block 8; 27B
#            DFlash block 8; one attention probe per head dim
#   planes   the data planes between two ranks (mpirun -np 2; nccl needs two GPUs): the 8B batch shape
#   allreduce  the gradient sum between two drafters (mpirun -np 2, two GPUs): dflash-drafters-bench on a
#            random Qwen3-8B checkpoint (written under OUT/ by dflash-make-random, 16 GB)
# Each driver's medians come with their phase breakdowns: the fit takes gemm_tflops from the GEMM phases,
# target_attention_tflops from the forward's attention phase, drafter_attention_tflops and
# drafter_block_overhead_us from the drafter's attention phase at two contexts (S 3072 and 16384),
# linear_attention_tflops from the hybrid's GDN phase, memory_tbps from AdamW and the elementwise phases, the
# links from the plane and gradient-sum tables (docs/cost_model.md "Recalibrating" says how).
set -u
BUILD=${1:?usage: bench/calibrate_sweep.sh BUILD OUT [peak target drafter planes allreduce]}
OUT=${2:?usage: bench/calibrate_sweep.sh BUILD OUT [what...]}
shift 2
WHAT=${*:-peak target drafter}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
B=$BUILD/bench
[ -x "$B/bench_target_forward" ] || B=$BUILD  # a flat directory of binaries (bench/drafter_run.sh's style)
log() { tee -a "$OUT/$1.txt"; }
run() {  # run LOGNAME CMD...: print the command, run it, keep its output
  local name=$1; shift
  echo "## $*" | log "$name"
  "$@" 2>&1 | log "$name"
}
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"

for w in $WHAT; do
  case $w in
    peak)
      run peak "$B/bench_target_forward" --gemm-peak
      run peak "$B/drafter_bench" --gemm-peak ;;
    target)
      run target "$B/bench_target_forward" --model 8b
      run target "$B/bench_target_forward" --model 8b --no-final-norm
      run target "$B/bench_target_forward" --model 8b --mixed
      run target "$B/bench_target_forward" --model 8b --seqlens 2048,2048,2048,2048,2048,2048,2048,2048
      run target "$B/bench_hybrid_forward" --model 27b
      run target "$B/bench_hybrid_forward" --model 27b --no-final-norm ;;
    drafter)
      run drafter "$B/drafter_bench" --model 8b --objective ce --context 3072 --anchors 512
      run drafter "$B/drafter_bench" --model 8b --objective ce --context 3072 --anchors 512 --optimizer-state bf16
      run drafter "$B/drafter_bench" --model 8b --objective kl --context 3072 --anchors 512
      run drafter "$B/drafter_bench" --model 8b --objective ce --context 16384 --anchors 512
      run drafter "$B/drafter_bench" --model 8b --objective ce --context 16384 --anchors 3072
      run drafter "$B/drafter_bench" --model 27b --context 4096 --anchors 512
      run drafter "$B/drafter_bench" --model 27b --context 4096 --anchors 512 --optimizer-state bf16
      run drafter "$B/drafter_bench" --model 27b --context 4096 --anchors 512 --block 8
      run drafter "$B/drafter_bench" --model 27b --context 4096 --anchors 512 --draft-arch dflash2
      run drafter "$B/drafter_bench" --model 27b --context 4096 --anchors 512 --draft-arch dflash2 --optimizer-state bf16
      run drafter "$B/drafter_bench" --attention-probe
      run drafter "$B/drafter_bench" --attention-probe --model 27b --context 4096 ;;
    planes)
      # 5 captured layers x 16384 tokens x 4096: the 8B batch (0.67 GB); a plane that cannot run here is listed
      # with its reason (nccl: one GPU)
      run planes mpirun -np 2 -x NCCL_NVLS_ENABLE=0 "$BUILD/dflash-plane-bench" --planes host,cuda-mpi,nccl \
        --layers 5 --tokens 16384 --hidden 4096 ;;
    allreduce)
      [ -d "$OUT/qwen3-8b/target" ] || run allreduce "$BUILD/dflash-make-random" "$OUT/qwen3-8b" --preset qwen3-8b
      run allreduce mpirun -np 2 -x NCCL_NVLS_ENABLE=0 "$BUILD/dflash-drafters-bench" --target "$OUT/qwen3-8b/target" \
        --tokens 16384 --seq-len 4096 --anchors 512 ;;
    *) echo "unknown part '$w' (peak target drafter planes allreduce)" >&2; exit 2 ;;
  esac
done

# The lines the fit reads, in one file.
grep -hE "^## |RESULT|forward median|TFLOP/s|GB/s|step: median|breakdown|    [A-Za-z].* ms|gradient sum|sum alone|  (d2d-copy|nccl|host|cuda-mpi|nccl-raw) " \
  "$OUT"/*.txt > "$OUT/summary.txt" 2>/dev/null
echo "calibration sweep: logs and $OUT/summary.txt"
