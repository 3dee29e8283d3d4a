#!/usr/bin/env bash
# GPU metrics on the CPU backend: nothing is invented. A 1-1 run plus an idle rank: /gpus says
# available = 0 with the reason and holds no series, no gpu_ranks / gpu_idle_power_w, no pwr= on the
# status line, "-" power in the startup table. The run facts dflash-report reads are there:
# dataset_tokens (= the data file's offsets[-1]) and drafter_grad_bytes (= 4 bytes per trained parameter
# of the exported drafter).
source "$(dirname "$0")/lib.sh"
run_job gpu 3 120 --topology 1-1 --max-steps 4 --log-every 2
expect_rc 0 gpu
M="$WORK/gpu/metrics.h5"
expect_log gpu "GPU power: not measured (CPU backend: no NVML)"
grep -q "pwr=" "$WORK/gpu.log" && fail "gpu: a status line shows power on the CPU backend"
expect_log gpu "step=4 "
[ "$(grep -cE '^\[dflash\] +[0-9]+ +(target|drafter|idle) .* -$' "$WORK/gpu.log")" -eq 3 ] ||
  { grep '^\[dflash\] ' "$WORK/gpu.log" | head >&2; fail "gpu: startup table rows lack the '-' power column"; }

h5check "$M" "'gpus' in f and int(f['gpus'].attrs['available']) == 0"
h5check "$M" "f['gpus'].attrs['reason'] in ('CPU backend: no NVML', b'CPU backend: no NVML')"
h5check "$M" "len(f['gpus'].keys()) == 0"
h5check "$M" "'gpu_ranks' not in f.attrs and 'gpu_idle_power_w' not in f.attrs"

TINY=$(tiny_dir)
want_tokens=$(h5eval "$TINY/data.h5" "int(f['offsets'][-1])")
h5check "$M" "int(f.attrs['dataset_tokens']) == $want_tokens and $want_tokens > 0"
# The drafter's trainable parameters = the tensors of its release export (the target's embedding and
# lm_head are shared, not exported); fp32 gradients.
params=$("$PY" -c "
import json, struct, sys
with open(sys.argv[1], 'rb') as fh:
    n = struct.unpack('<Q', fh.read(8))[0]
    header = json.loads(fh.read(n))
total = 0
for k, v in header.items():
    if k == '__metadata__': continue
    c = 1
    for d in v['shape']: c *= d
    total += c
print(total)
" "$WORK/gpu/drafter/model.safetensors")
h5check "$M" "int(f.attrs['drafter_grad_bytes']) == 4 * $params and $params > 0"

# The whole GPU path with a stand-in libnvidia-ml (tests/support/fake_nvml.cpp: device i draws
# 100 + 10 i W, uses 1024 + i MiB, 50 % busy), read through the test hook DFLASH_TEST_NVML_LIBRARY:
# readings travel with the targets' batches and the drafters' reports to the writer; the idle rank's
# GPU has no column but is in gpu_idle_power_w (the startup mean of all four: 115 W).
FAKE="$DFLASH_BIN/tests/libdflash_fake_nvml.so"
[ -f "$FAKE" ] || fail "no $FAKE (built with dflash_unit_tests)"
DFLASH_TEST_NVML_LIBRARY="$FAKE" run_job fake 4 120 --topology 2-1 --max-steps 6 --log-every 2
expect_rc 0 fake
expect_log fake "pwr=330W"
[ "$(grep -c 'pwr=330W' "$WORK/fake.log")" -eq 3 ] || fail "fake: not every status line shows pwr=330W"
grep -q "GPU power: not measured" "$WORK/fake.log" && fail "fake: startup says not measured"
for r in 0:100 1:110 2:120 3:130; do
  grep -qE "^\[dflash\] +${r%%:*} +(target|drafter|idle) .* ${r#*:} W$" "$WORK/fake.log" ||
    fail "fake: startup table lacks rank ${r%%:*} at ${r#*:} W"
done
M="$WORK/fake/metrics.h5"
h5check "$M" "int(f['gpus'].attrs['available']) == 1"
h5check "$M" "f['gpus/power_w'].shape == (3, 3) and f['gpus/time_s'].shape == (3,)"
h5check "$M" "np.allclose(f['gpus/power_w'][:], [[100, 110, 120]] * 3)"
h5check "$M" "np.allclose(f['gpus/mem_used_mib'][:], [[1024, 1025, 1026]] * 3)"
h5check "$M" "np.allclose(f['gpus/util_pct'][:], 50)"
h5check "$M" "np.all(np.diff(f['gpus/time_s'][:]) > 0)"
h5check "$M" "f.attrs['gpu_ranks'] in ('[0,1,2]', b'[0,1,2]')"
h5check "$M" "abs(float(f.attrs['gpu_idle_power_w']) - 115.0) < 1e-3"
# dflash-report reads it: per-role power from the columns, idle draw from gpu_idle_power_w.
"$DFLASH_SRC/tools/dflash-report" "$M" --json >"$WORK/fake.json" 2>"$WORK/fake.report.err" ||
  { cat "$WORK/fake.report.err" >&2; fail "fake: dflash-report failed"; }
"$PY" - "$WORK/fake.json" <<'PYEOF' || fail "fake: dflash-report's power section"
import json, sys
p = json.load(open(sys.argv[1]))["power"]
assert p["available"], p
assert abs(p["target_w"] - 105) < 1e-6 and abs(p["drafter_w"] - 120) < 1e-6, p
assert abs(p["idle_w"] - 115) < 1e-6 and "gpu_idle_power_w" in p["idle_source"], p
assert abs(p["total_w"] - 330) < 1e-6, p
PYEOF

# Resuming continues /gpus (same columns); a segment without readings appends none and still runs.
R=(--topology 1-1 --max-steps 8 --log-every 2 --out "$WORK/res")
DFLASH_TEST_NVML_LIBRARY="$FAKE" run_job res 2 120 "${R[@]}" --checkpoint-every 2 --keep-checkpoints 5
expect_rc 0 res
h5check "$WORK/res/metrics.h5" "f['gpus/power_w'].shape == (4, 2)"
DFLASH_TEST_NVML_LIBRARY="$FAKE" run_job res2 2 120 "${R[@]}" --resume "$WORK/res/checkpoints/step-00000004" \
  --checkpoint-dir "$WORK/res2.ck"
expect_rc 0 res2
expect_log res2 "pwr=210W"
h5check "$WORK/res/metrics.h5" "f['gpus/power_w'].shape == (6, 2) and np.allclose(f['gpus/power_w'][:], [[100, 110]] * 6)"
run_job res3 2 120 "${R[@]}" --resume "$WORK/res/checkpoints/step-00000006" --checkpoint-dir "$WORK/res3.ck"
expect_rc 0 res3
grep -q "pwr=" "$WORK/res3.log" && fail "res3: power shown without readings"
h5check "$WORK/res/metrics.h5" "f['gpus/power_w'].shape == (6, 2) and int(f['gpus'].attrs['available']) == 1"
h5check "$WORK/res/metrics.h5" "f['steps/step'][-1] == 8"
echo "PASS"
