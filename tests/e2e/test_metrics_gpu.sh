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
echo "PASS"
