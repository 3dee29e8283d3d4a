#!/usr/bin/env bash
# The default job (jobs/default/run.sh: tiny target, 2 targets + 1 drafter + 1 idle under mpirun) runs to
# the end and learns clearly -- comparing the first and last tenth of the steps in metrics.h5, the loss falls
# by 10 % or more and the streak ends above 0.3 -- and it is reproducible: a second run prints the same
# summary and records the same losses (--batch-order fixed in train.cfg), so the README's output is what a
# user sees. And the first run's build compiles no CUDA code where no GPU is visible.
source "$(dirname "$0")/lib.sh"

# ---- the first run's build: a cmake that records its arguments and stops stands in (a build takes minutes)
shim="$WORK/shim"
mkdir -p "$shim"
printf '#!/bin/sh\necho "$@" >> "%s/cmake.args"\nexit 1\n' "$shim" >"$shim/cmake"
for gpu in none one; do
  if [ $gpu = none ]; then
    printf '#!/bin/sh\necho "NVIDIA-SMI has failed because it could not communicate with the driver" >&2\nexit 9\n' >"$shim/nvidia-smi"
  else
    printf '#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-00000000-0000-0000-0000-000000000000)"\n' >"$shim/nvidia-smi"
  fi
  chmod +x "$shim/cmake" "$shim/nvidia-smi"
  rm -f "$shim/cmake.args"
  if PATH="$shim:$PATH" BUILD_DIR="$WORK/fresh-build" RUN_DIR="$WORK/fresh-run" "$DFLASH_SRC/jobs/default/run.sh" \
    >"$WORK/build-$gpu.log" 2>&1; then
    fail "run.sh went on past a failed configure"
  fi
  configure=$(head -1 "$shim/cmake.args" 2>/dev/null || true)
  note "GPU $gpu: cmake $configure"
  case $gpu in
    none) [[ " $configure " == *" -DDFLASH_CUDA=OFF "* ]] || fail "no GPU visible, yet CUDA is not switched off: $configure" ;;
    one) [[ " $configure " == *" -DCMAKE_CUDA_ARCHITECTURES=native "* && " $configure " != *"DFLASH_CUDA=OFF"* ]] ||
      fail "a GPU visible, yet not built for it: $configure" ;;
  esac
done

# ---- the README's second command (tools/test.sh) after it: the build it configures does not inherit the
# first run's -DDFLASH_CUDA=OFF from the shared build/ cache (a copy of tools/ with a setup.sh that does
# nothing; the same recording cmake)
mkdir -p "$WORK/repo/tools"
cp "$DFLASH_SRC/tools/test.sh" "$DFLASH_SRC/tools/build.sh" "$WORK/repo/tools/"
printf '#!/bin/sh
exit 0
' >"$WORK/repo/tools/setup.sh"
chmod +x "$WORK/repo/tools/"*.sh
rm -f "$shim/cmake.args"
if PATH="$shim:$PATH" BUILD_DIR="$WORK/fresh-build" "$WORK/repo/tools/test.sh" >"$WORK/test-sh.log" 2>&1; then
  fail "tools/test.sh went on past a failed configure"
fi
configure=$(head -1 "$shim/cmake.args" 2>/dev/null || true)
note "tools/test.sh: cmake $configure"
[[ " $configure " == *" -DDFLASH_CUDA=AUTO "* ]] ||
  fail "tools/test.sh leaves DFLASH_CUDA to the cache (jobs/default/run.sh may have left OFF there): $configure"

# ---- two runs: learning, and the same output twice ---------------------------------------------------
run_default() {  # run_default NAME: jobs/default/run.sh into $WORK/NAME (its own tiny target, made afresh)
  set +e
  RUN_DIR="$WORK/$1" BUILD_DIR="$DFLASH_BIN" timeout -k 5 500 "$DFLASH_SRC/jobs/default/run.sh" >"$WORK/$1.log" 2>&1
  RC=$?
  set -e
  expect_rc 0 "$1"
}
run_default default
expect_log default "step=25 "
expect_log default "[default job] loss"
[ -s "$WORK/default/drafter/model.safetensors" ] || fail "no exported drafter"
"$PY" - "$WORK/default/metrics.h5" <<'PYEOF' || fail "the default job did not learn clearly (see above)"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
steps = f['steps/step'][:]
n = max(1, len(steps) // 10)
first = {k: float(np.mean(f['steps/' + k][:n])) for k in ('loss', 'acc', 'streak')}
last = {k: float(np.mean(f['steps/' + k][-n:])) for k in ('loss', 'acc', 'streak')}
print(len(steps), 'steps; first tenth', first, 'last tenth', last)
assert len(steps) >= 200, 'too few steps'
assert last['loss'] <= 0.9 * first['loss'], 'loss fell less than 10 %'
assert last['acc'] > 2 * first['acc'] and last['acc'] > first['acc'] + 0.02, 'acc did not rise'
assert last['streak'] > 0.3, 'the streak ended at or below 0.3'
# every rank's time split was recorded, the idle rank included
roles = set(f['ranks/role'][:].tolist())
assert roles == {0, 1, 2}, roles
PYEOF

run_default again
summary() { grep '^\[default job\] \(loss\|acc\|streak\)' "$WORK/$1.log"; }
[ "$(summary default | wc -l)" -eq 3 ] || fail "no three summary lines"
[ "$(summary default)" = "$(summary again)" ] ||
  { summary default; summary again; fail "two runs of the default job printed different summaries"; }
"$PY" - "$WORK/default/metrics.h5" "$WORK/again/metrics.h5" <<'PYEOF' || fail "two runs recorded different steps"
import sys, h5py, numpy as np
a, b = (h5py.File(p, 'r') for p in sys.argv[1:3])
for k in ('step', 'loss', 'acc', 'streak', 'grad_norm', 'lr', 'tokens'):
    assert np.array_equal(a['steps/' + k][:], b['steps/' + k][:]), k
print('two runs: identical', len(a['steps/step']), 'steps')
PYEOF
summary default
echo "PASS"
