#!/usr/bin/env bash
# The default job (jobs/default/run.sh: tiny target, 2 targets + 1 drafter + 1 idle under mpirun) runs to
# the end and learns: comparing the first and last tenth of the steps in metrics.h5, the loss falls and
# acc and streak rise clearly.
source "$(dirname "$0")/lib.sh"
run_dir="$WORK/default"
set +e
RUN_DIR="$run_dir" BUILD_DIR="$DFLASH_BIN" timeout -k 5 400 "$DFLASH_SRC/jobs/default/run.sh" >"$WORK/default.log" 2>&1
RC=$?
set -e
expect_rc 0 default
expect_log default "step=25 "
expect_log default "[default job] loss"
[ -s "$run_dir/drafter/model.safetensors" ] || fail "no exported drafter"
"$PY" - "$run_dir/metrics.h5" <<'PYEOF' || fail "the default job did not learn (see above)"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
steps = f['steps/step'][:]
n = max(1, len(steps) // 10)
first = {k: float(np.mean(f['steps/' + k][:n])) for k in ('loss', 'acc', 'streak')}
last = {k: float(np.mean(f['steps/' + k][-n:])) for k in ('loss', 'acc', 'streak')}
print(len(steps), 'steps; first tenth', first, 'last tenth', last)
assert len(steps) >= 200, 'too few steps'
assert last['loss'] < first['loss'] - 0.3, 'loss did not fall'
assert last['acc'] > 2 * first['acc'] and last['acc'] > first['acc'] + 0.02, 'acc did not rise'
assert last['streak'] > first['streak'] + 0.1, 'streak did not rise'
# every rank's time split was recorded, the idle rank included
roles = set(f['ranks/role'][:].tolist())
assert roles == {0, 1, 2}, roles
PYEOF
echo "PASS"
