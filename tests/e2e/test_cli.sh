#!/usr/bin/env bash
# Command-line conventions: --version on every program, --help with placeholders and without the test hooks
# (--help-all has them), a repeated option resolved last-wins (the job scripts pass their defaults before
# "$@", so `sbatch train-1node.sbatch --topology 6-1` must mean 6-1), and --dry-run: the resolved options,
# every rank's role and the schedule, printed once, exit 0, nothing loaded or written; a world that does not
# fit --topology fails the dry run as it would the job (exit 4).
source "$(dirname "$0")/lib.sh"

for prog in dflash-train dflash-prep dflash-make-tiny dflash-make-random dflash-selftest dflash-synth-metrics dflash-eval; do
  [ -x "$DFLASH_BIN/$prog" ] || { note "$prog not built: skipped"; continue; }
  out=$("$DFLASH_BIN/$prog" --version 2>&1) || fail "$prog --version exited $?: $out"
  [[ "$out" =~ ^$prog\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "$prog --version printed '$out'"
done
out=$("$DFLASH_SRC/tools/dflash-report" --version) || fail "dflash-report --version"
[[ "$out" =~ ^dflash-report\ [0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "dflash-report --version printed '$out'"
[ "${out#dflash-report }" = "$("$TRAIN" --version | cut -d' ' -f2)" ] || fail "dflash-report and dflash-train versions differ"

"$TRAIN" --help >"$WORK/help.log"
expect_log help "--target DIR"
expect_log help "--lr LR (=6e-4)"
grep -q -- "--inject-fail-rank" "$WORK/help.log" && fail "--help shows the test hooks"
"$TRAIN" --help-all >"$WORK/helpall.log"
expect_log helpall "--inject-fail-rank RANK"

# --dry-run through the mpirun launcher script, with the topology given twice as a job script does.
tiny=$(tiny_dir)
set +e
NP=4 DFLASH_TRAIN="$TRAIN" DFLASH_BACKEND=cpu timeout 60 "$DFLASH_SRC/jobs/mpirun/train.sh" --topology 1-1 \
  --target "$tiny/target" --data "$tiny/data.h5" --out "$WORK/dry" --epochs 2 --topology 2-1 --draft-layers 1 --dry-run \
  >"$WORK/dry.log" 2>&1
RC=$?
set -e
expect_rc 0 dry
expect_log dry "--dry-run: nothing is loaded"
expect_log dry "topology 2-1 on 1 node(s) x 4 rank(s), backend cpu: 2 target(s), 1 drafter(s), 1 idle"
expect_log dry "--topology=2-1"
expect_log dry "--resume=auto"
expect_log dry "schedule: 2 epoch(s)"
expect_log dry "lr: "
expect_log dry "memory per rank, fixed part (float32 in host memory; the target's activations come on top): target"
grep -qE "drafter [0-9.]+ (MiB|GiB) \([1-9][0-9]* parameters x 16 B of state" "$WORK/dry.log" || fail "dry: no drafter memory line"
for role in target drafter idle; do grep -qE "^\[dflash\] +[0-9]+ +0 +[0-9]+ +$role " "$WORK/dry.log" || fail "dry: no $role row"; done
[ "$(grep -c -- '--dry-run: nothing is loaded' "$WORK/dry.log")" -eq 1 ] || fail "dry: printed by more than one rank"
[ ! -e "$WORK/dry" ] || fail "dry: --out was created"
grep -q '^\[[0-9.smhd]*\] step=' "$WORK/dry.log" && fail "dry: it trained"

# A dry run of a world too small for the split fails as the job would.
run_job drysmall 2 60 --topology 2-1 --dry-run
expect_rc 4 drysmall
expect_log drysmall "--topology 2-1 needs 3 ranks per node"
echo "PASS"
