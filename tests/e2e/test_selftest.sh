#!/usr/bin/env bash
# dflash-selftest on the golden cases: qwen3-tiny-a, the Qwen3.5 hybrid qwen35-tiny-a and the Qwen3.8-shaped
# qwen38-tiny-a pass on the CPU backend, with the FP8 rows where a case has fp8.safetensors (a wrong one
# fails); bad usage is exit 2.
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
grep -Eq "^fp8.hidden\[3\] .* PASS$" "$out" || fail "qwen35: no passing fp8 row (its fp8.safetensors)"

# The FP8 part (issue 46): the dense case's target under --target-precision fp8 against its fp8.safetensors
# (transformers' FP8 arithmetic), and the same case with that golden's hidden states scaled by 1.1 fails
"$BIN" "$DATA/golden/qwen3-tiny-a" --backend cpu >"$out" 2>&1 || fail "qwen3-tiny-a (fp8 rows) exited non-zero"
for row in 'fp8.hidden\[0\]' 'fp8.hidden\[5\]' 'fp8.final_norm' 'fp8.shift'; do
  grep -Eq "^${row} .* PASS$" "$out" || fail "fp8 row $row missing or not PASS"
done
tmp=$(mktemp -d); trap 'rm -rf "$tmp" "$out"' EXIT
cp -r "$DATA/golden/qwen3-tiny-a" "$tmp/case"
python3 - "$tmp/case/fp8.safetensors" <<'PY' || fail "could not rewrite fp8.safetensors"
import array, json, struct, sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
t = json.loads(b[8:8 + n])["fp8.hidden"]
assert t["dtype"] == "F32"
lo, hi = (8 + n + o for o in t["data_offsets"])
a = array.array("f", bytes(b[lo:hi]))
b[lo:hi] = array.array("f", (x * 1.1 for x in a)).tobytes()
open(p, "wb").write(b)
PY
"$BIN" "$tmp/case" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 1 ] || fail "a wrong FP8 golden exited $rc, expected 1"
grep -Eq "^fp8.hidden\[0\] .* FAIL$" "$out" || fail "a wrong FP8 golden: fp8.hidden[0] did not fail"
grep -Eq "^target.hidden\[0\] .* PASS$" "$out" || fail "a wrong FP8 golden failed the bf16 rows too"

# fp8.shift: a golden whose FP8 forward moves 0.4x as far from the unquantized one (golden.safetensors'
# target.*) as the real one does fails it (r ~ 2.5), as a forward that skipped the quantization would (r ~ 0)
cp "$DATA/golden/qwen3-tiny-a/fp8.safetensors" "$tmp/case/fp8.safetensors"
python3 - "$tmp/case" <<'PY' || fail "could not rewrite fp8.safetensors (shift)"
import array, json, struct, sys
def tensors(p):
    b = bytearray(open(p, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    return b, {k: tuple(8 + n + o for o in v["data_offsets"]) for k, v in json.loads(b[8:8 + n]).items()
               if k != "__metadata__"}
f8, f8t = tensors(sys.argv[1] + "/fp8.safetensors")
g, gt = tensors(sys.argv[1] + "/golden.safetensors")
for name in ("hidden", "final_norm"):
    lo, hi = f8t["fp8." + name]
    glo, ghi = gt["target." + name]
    q, plain = array.array("f", bytes(f8[lo:hi])), array.array("f", bytes(g[glo:ghi]))
    assert len(q) == len(plain)
    f8[lo:hi] = array.array("f", (p + 0.4 * (x - p) for x, p in zip(q, plain))).tobytes()
open(sys.argv[1] + "/fp8.safetensors", "wb").write(f8)
PY
"$BIN" "$tmp/case" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 1 ] || fail "an FP8 golden with 0.4x the shift exited $rc, expected 1"
grep -Eq "^fp8.shift .* FAIL$" "$out" || fail "an FP8 golden with 0.4x the shift: fp8.shift did not fail"

# Qwen3.8-shaped (Qwen3_5ForConditionalGeneration with the release's keys, 8 layers)
"$BIN" "$DATA/golden/qwen38-tiny-a" --backend cpu >"$out" 2>&1; rc=$?
[ $rc -eq 0 ] || fail "qwen38-tiny-a exited $rc, expected 0"
grep -q '^# case: qwen38-tiny-a' "$out" || fail "no qwen38 case metadata line"
for row in 'target.hidden\[0\]' 'target.hidden\[7\]' 'target.final_norm' 'target.logits'; do
  grep -Eq "^${row} .* PASS$" "$out" || fail "qwen38 row $row missing or not PASS"
done
grep -q ' FAIL$' "$out" && fail "a qwen38 row failed"
grep -q '^# fp8 part: skipped (the case has no fp8.safetensors)' "$out" || fail "qwen38: no fp8-skipped note"

"$BIN" "$DATA/golden/qwen3-tiny-a" --backend tpu >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "--backend tpu exited $rc, expected 2"
"$BIN" >"$out" 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no CASE_DIR exited $rc, expected 2"
echo "PASS: dflash-selftest"
