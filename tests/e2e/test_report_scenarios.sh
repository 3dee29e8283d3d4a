#!/usr/bin/env bash
# dflash-report on synthetic runs written through the project's MetricsWriter (dflash-synth-metrics):
# every scenario in tests/report/ must give the expected --json numbers and verdict claims, the C++ model
# (auto_topology, used by --topology auto) must agree with the report's Python model row by row, the text
# tables and the PNG dashboard must be produced, and bad input must end with exit 3 (2 for bad options).
set -euo pipefail
BIN=${DFLASH_BIN:?}; SRC=${DFLASH_SRC:?}
REPORT="$SRC/tools/dflash-report"
SYNTH="$BIN/dflash-synth-metrics"
[ -x "$SYNTH" ] || { echo "missing $SYNTH (build the dflash-synth-metrics target)"; exit 1; }
PY=python3; /usr/bin/python3 -c "import h5py, numpy, matplotlib" 2>/dev/null && PY=/usr/bin/python3
$PY -c "import h5py, numpy, matplotlib" 2>/dev/null || { echo "SKIPPED: needs python3-h5py python3-numpy python3-matplotlib (tools/setup.sh)"; exit 77; }
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

for sc in "$SRC"/tests/report/scenario*.json; do
  name=$(basename "$sc" .json)
  echo "== $name"
  "$SYNTH" "$sc" "$TMP/$name.h5"
  budget=$($PY -c "import json,sys; print(json.load(open(sys.argv[1])).get('power_budget_w', ''))" "$sc")
  "$REPORT" "$TMP/$name.h5" --json ${budget:+--power-budget-w $budget} > "$TMP/$name.json"
  "$SYNTH" --predict "$TMP/$name.json" > "$TMP/$name.cxx.json"
  $PY "$SRC/tests/report/check_report.py" "$sc" "$TMP/$name.json" "$TMP/$name.cxx.json"
  # the text report and the dashboard
  "$REPORT" "$TMP/$name.h5" --png "$TMP/$name.png" ${budget:+--power-budget-w $budget} > "$TMP/$name.txt"
  for section in "OBSERVED PIPELINE" "SERVICE RATES" "POWER" "WHAT-IF" "VERDICT" "b/s" "Ktok/s"; do
    grep -q "$section" "$TMP/$name.txt" || { echo "FAIL: text report lacks '$section'"; cat "$TMP/$name.txt"; exit 1; }
  done
  head -c 8 "$TMP/$name.png" | od -An -c | grep -q "P   N   G" || { echo "FAIL: $name.png is not a PNG"; exit 1; }
done

# A run directory works as well as its metrics.h5.
mkdir -p "$TMP/run" && cp "$TMP/scenario3_cpu_2-1.h5" "$TMP/run/metrics.h5"
"$REPORT" "$TMP/run" > /dev/null

# Errors: a missing file and a non-HDF5 file are input errors (3), bad options are 2.
set +e
"$REPORT" "$TMP/nope.h5" 2> "$TMP/err1"; rc1=$?
echo "not hdf5" > "$TMP/bad.h5"; "$REPORT" "$TMP/bad.h5" 2> "$TMP/err2"; rc2=$?
"$REPORT" "$TMP/scenario1_drafter_bound.h5" --power-budget-w -5 2> /dev/null; rc3=$?
set -e
[ $rc1 -eq 3 ] && grep -q "no such file" "$TMP/err1" || { echo "FAIL: missing file gave rc=$rc1: $(cat "$TMP/err1")"; exit 1; }
[ $rc2 -eq 3 ] && grep -q "not a readable HDF5" "$TMP/err2" || { echo "FAIL: bad file gave rc=$rc2: $(cat "$TMP/err2")"; exit 1; }
[ $rc3 -eq 2 ] || { echo "FAIL: bad option gave rc=$rc3"; exit 1; }
echo "PASS: report scenarios"
