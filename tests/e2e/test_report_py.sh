#!/usr/bin/env bash
# dflash-report's Python unit tests (tests/report/test_*.py): metrics files written with h5py, no job:
# CPU wording, oversubscription, --json's schema_version, several runs side by side, --version, the dashboard
# (test_report.py); the exports with Debian's python3, i.e. the built-in TensorBoard writer and CSV, the
# tests that need tensorboard/tensorboardX/wandb skipping (test_export.py; test_report_export.sh runs it
# with the project venv that has them).
set -euo pipefail
SRC=${DFLASH_SRC:-$(cd "$(dirname "$0")/../.." && pwd)}
PY=python3; /usr/bin/python3 -c "import h5py, numpy, matplotlib" 2>/dev/null && PY=/usr/bin/python3
$PY -c "import h5py, numpy, matplotlib" 2>/dev/null || { echo "SKIPPED: needs python3-h5py python3-numpy python3-matplotlib (tools/setup.sh)"; exit 77; }
$PY -m unittest discover -v -s "$SRC/tests/report" -p 'test_*.py'
