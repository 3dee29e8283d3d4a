#!/usr/bin/env bash
# --optimizer-state bf16 on the CPU (docs/pipeline.md "Optimizer state"): the default job's run
# (jobs/default/train.cfg: 2-1 through mpirun, 8 epochs = 327 optimizer steps, --batch-order fixed, seed 0) at
# lr LR, once with the fp32 state and once with the bf16 state, on the same data and seed.
#   - the bf16 run's loss tracks the fp32 one: the mean loss over the last 50 steps within TOL relative, and
#     both at least 8 % below the first 50 steps' mean;
#   - its state is bf16: the f32 export of its weights holds bf16 values only (the fp32 run's does not);
#   - a bf16 checkpoint resumed in bf16 gives the straight run's steps and drafter bit for bit (the bits of
#     the stochastic rounding are a function of seed, step and element);
#   - an fp32 checkpoint resumes with --optimizer-state bf16 (the option may change on a resume).
# Tolerance from measurement (this machine, 2026-12-04, the runs are deterministic: the CPU and the fixed
# batch order): last-50 means, lr 0.005: fp32 5.5417, bf16 5.5442 (+0.04 %; +0.59 % with another hash of
# the same (seed, step, element), dflash/stochastic_round.h before one mix64 per element); with the stochastic rounding
# replaced by truncation (round toward zero: round_bf16 ignoring its bits) 5.6685 (+2.29 %): this test then
# fails, as checked by hand. At the default job's own lr 0.01 the bf16 run ends +3.7 % (5.5930 against
# 5.3934), the fp32 run with --adam-eps perturbed by 1 % +0.59 %: that lr sits where this job is sensitive
# (README: 0.015 and up learn far less), so the test uses 0.005 (at 0.002: +0.55 %, but the loss falls only
# 8.2 %). TOL 1.5 % lies between the stochastic rounding's 0.04-0.59 % and truncation's 2.29 %.
source "$(dirname "$0")/lib.sh"
LR=0.005
TOL=0.015
JOB=(--topology 2-1 --epochs 8 --lr $LR --warmup-steps 10 --min-lr-ratio 0.5 --batch-order fixed --max-anchors 512
     --log-every 25 --seed 0 --export-dtype f32 --checkpoint-every 150)
run_job fp32 4 400 "${JOB[@]}"
expect_rc 0 fp32
run_job bf16 4 400 "${JOB[@]}" --optimizer-state bf16
expect_rc 0 bf16
expect_log bf16 "[dflash] optimizer state: bf16 weights and AdamW moments, stochastic rounding"
! grep -qF "[dflash] optimizer state:" "$WORK/fp32.log" || fail "the fp32 run printed the bf16 state's line"

"$PY" - "$WORK/fp32/metrics.h5" "$WORK/bf16/metrics.h5" "$TOL" <<'PYEOF' || fail "the bf16 state's loss does not track the fp32 state's (see above)"
import sys, h5py, numpy as np
a, b = (h5py.File(p, 'r')['steps/loss'][:] for p in sys.argv[1:3])
tol = float(sys.argv[3])
assert len(a) >= 300 and len(a) == len(b), (len(a), len(b))
first = {k: float(np.mean(x[:50])) for k, x in (('fp32', a), ('bf16', b))}
last = {k: float(np.mean(x[-50:])) for k, x in (('fp32', a), ('bf16', b))}
rel = (last['bf16'] - last['fp32']) / last['fp32']
print(len(a), 'steps; first 50', first, 'last 50', last, f'relative {rel * 100:+.2f} %')
for k in first:
    assert last[k] <= 0.92 * first[k], f'{k}: the loss fell less than 8 %'
assert abs(rel) <= tol, f'last-50 mean loss of the bf16 state {rel * 100:+.2f} % off the fp32 state (tolerance {tol * 100} %)'
PYEOF

# The exported f32 weights: bf16 values (low 16 bits zero) in the bf16 run only.
"$PY" - "$WORK/bf16/drafter/model.safetensors" "$WORK/fp32/drafter/model.safetensors" <<'PYEOF' || fail "the bf16 run's weights are not bf16 values"
import sys, json, struct, numpy as np
def low_bits_nonzero(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    count = total = 0
    for name, t in header.items():
        if name == '__metadata__':
            continue
        assert t['dtype'] == 'F32', (name, t['dtype'])
        b, e = t['data_offsets']
        u = np.frombuffer(data[b:e], dtype=np.uint32)
        count += int(np.count_nonzero(u & 0xffff))
        total += u.size
    return count, total
bf, total = low_bits_nonzero(sys.argv[1])
fp, _ = low_bits_nonzero(sys.argv[2])
print(f'weights with low 16 bits set: bf16 run {bf} of {total}, fp32 run {fp}')
assert bf == 0 and fp > total // 2
PYEOF

# bf16 -> bf16 resume: the straight run's steps after 150 and its drafter, bit for bit.
run_job resumed 4 400 "${JOB[@]}" --optimizer-state bf16 --resume "$WORK/bf16/checkpoints/step-00000150"
expect_rc 0 resumed
expect_log resumed "resuming from $WORK/bf16/checkpoints/step-00000150"
"$PY" - "$WORK/bf16/metrics.h5" "$WORK/resumed/metrics.h5" <<'PYEOF' || fail "the resumed bf16 run differs from the straight one"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
assert b['steps/step'][0] == 151 and list(b['steps/step'][:]) == list(a['steps/step'][150:])
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    assert np.array_equal(a['steps/' + k][150:], b['steps/' + k][:]), k
print('steps 151 ..', b['steps/step'][-1], 'identical')
PYEOF
cmp -s "$WORK/bf16/drafter/model.safetensors" "$WORK/resumed/drafter/model.safetensors" ||
  fail "the drafter exported after the bf16 resume differs from the straight run's"

# fp32 -> bf16: allowed (checkpoints are fp32 in both modes), the state rounded once on load.
run_job switched 4 200 "${JOB[@]}" --optimizer-state bf16 --max-steps 160 --resume "$WORK/fp32/checkpoints/step-00000150"
expect_rc 0 switched
expect_log switched "resuming from $WORK/fp32/checkpoints/step-00000150"
expect_log switched "[dflash] optimizer state: bf16"
h5check "$WORK/switched/metrics.h5" "list(f['steps/step'][:]) == list(range(151, 161))"
echo "PASS"
