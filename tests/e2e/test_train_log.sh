#!/usr/bin/env bash
# OUT/train.log (issue 31; include/dflash/run_log.h): the job writes its own log -- the startup table, the
# resolved options, the status lines, the end -- the same lines mpirun prints; a resumed job appends to it;
# a job that fails after --out is locked leaves its FATAL message there (the lost peer's, here); a job that
# fails its input checks writes no train.log (it never touches --out). A link planted at train.log is refused.
source "$(dirname "$0")/lib.sh"
COMMON=(--topology 2-1 --seed 3 --log-every 5 --max-steps 20 --checkpoint-every 10)

run_job run 3 300 "${COMMON[@]}"
expect_rc 0 run
log="$WORK/run/train.log"
[ -f "$log" ] || fail "no $log"
for want in "[dflash] dflash-train " "[dflash]   rank  role" "[dflash] options: " "step=20 loss=" "[dflash] done in"; do
  grep -qF -- "$want" "$log" || { cat "$log" >&2; fail "train.log lacks '$want'"; }
done
# Every line mpirun printed that starts with [dflash] or a status line is in the log.
missing=$(grep -E '^\[dflash\]|^\[[0-9]+s\] step=' "$WORK/run.log" | grep -vxFf "$log" | head -3 || true)
[ -z "$missing" ] || fail "train.log lacks lines mpirun printed: $missing"

run_job run 3 300 "${COMMON[@]}" --max-steps 30 --resume auto
expect_rc 0 run
[ "$(grep -c '^\[dflash\] dflash-train ' "$log")" = 2 ] || fail "the resumed job did not append to train.log"
grep -qF "step=30 loss=" "$log" || fail "train.log lacks the resumed job's status lines"

# A drafter that hangs at step 3: the targets' FATAL message (lost peer, exit 7) ends up in the log.
run_job lost 3 120 "${COMMON[@]}" --peer-timeout 5 --inject-fail-rank 2 --inject-fail-step 3 --inject-fail-mode hang
expect_rc 7 lost
grep -q "dflash FATAL" "$WORK/lost/train.log" || { tail "$WORK/lost/train.log" >&2; fail "the FATAL message is not in train.log"; }

# Bad input: no --out at all.
run_job bad 3 60 "${COMMON[@]}" --data /nonexistent.h5
expect_rc 3 bad
[ ! -e "$WORK/bad/train.log" ] || fail "a job that failed its input checks wrote $WORK/bad/train.log"

mkdir -p "$WORK/link"
ln -s /tmp/elsewhere.log "$WORK/link/train.log"
run_job link 3 60 "${COMMON[@]}"
expect_rc 2 link
[ ! -e /tmp/elsewhere.log ] || fail "train.log was written through a link"
echo "PASS"
