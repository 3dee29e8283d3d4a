#!/usr/bin/env bash
# dflash-selftest on the golden cases: qwen3-tiny-a, the Qwen3.5 hybrid qwen35-tiny-a and the Qwen3.8-shaped
# qwen38-tiny-a pass on the CPU backend; bad usage is exit 2.
set -u
BIN="${DFLASH_BIN:?DFLASH_BIN not set}/dflash-selftest"
DATA="${DFLASH_TEST_DATA:?DFLASH_TEST_DATA not set}"
[ -x "$BIN" ] || { echo "FAIL: $BIN not built"; exit 1; }
out=$(mktemp); trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }

"$BIN" "$DATA/golden/qwen3-tiny-a" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "qwen3-tiny-a exited $rc, expected 0"
grep -q '^# case: qwen3-tiny-a' "$out" || fail "no case metadata line"
grep -q '^# backend: cpu' "$out" || fail "no backend metadata line"
for row in 'target.hidden\[0\]' 'target.hidden\[5\]' 'target.final_norm' 'target.logits'; do
  grep -Eq "^${row} .* PASS$" "$out" || fail "row $row missing or not PASS"
done
grep -q ' FAIL$' "$out" && fail "a row failed"

"$BIN" "$DATA/golden/qwen35-tiny-a" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "qwen35-tiny-a exited $rc, expected 0"
grep -q '^# case: qwen35-tiny-a' "$out" || fail "no qwen35 case metadata line"
grep -q 'Qwen3.5/3.6 hybrid' "$out" || fail "no hybrid-architecture note"
for row in 'target.hidden\[0\]' 'target.hidden\[3\]' 'target.final_norm' 'target.logits'; do
  grep -Eq "^${row} .* PASS$" "$out" || fail "qwen35 row $row missing or not PASS"
done
grep -q ' FAIL$' "$out" && fail "a qwen35 row failed"

# Qwen3.8-shaped (Qwen3_5ForConditionalGeneration with the release's keys, 8 layers)
"$BIN" "$DATA/golden/qwen38-tiny-a" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "qwen38-tiny-a exited $rc, expected 0"
grep -q '^# case: qwen38-tiny-a' "$out" || fail "no qwen38 case metadata line"
for row in 'target.hidden\[0\]' 'target.hidden\[7\]' 'target.final_norm' 'target.logits'; do
  grep -Eq "^${row} .* PASS$" "$out" || fail "qwen38 row $row missing or not PASS"
done
grep -q ' FAIL$' "$out" && fail "a qwen38 row failed"

"$BIN" "$DATA/golden/qwen3-tiny-a" --backend tpu >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "--backend tpu exited $rc, expected 2"
"$BIN" >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no CASE_DIR exited $rc, expected 2"
echo "PASS: dflash-selftest"
