#!/usr/bin/env bash
# A rank lost mid-run ends the job within the deadline, naming the lost rank:
#  - a target that goes silent (SIGSTOP: alive, holds credits, sends nothing): the drafter's deadline
#    fires -> exit 7 "target rank 1";
#  - a drafter that goes silent: the targets wait for credits past the deadline -> exit 7 naming it;
#    with two drafters the other one's allreduce stalls and it names the silent one;
#  - a target that dies (SIGKILL): mpirun sees the death and ends the job at once, naming the rank.
source "$(dirname "$0")/lib.sh"
T=5  # --peer-timeout seconds
run_job hang_t 4 90 --topology 2-1 --peer-timeout $T --inject-fail-rank 1 --inject-fail-step 3 --inject-fail-mode hang --epochs 5
expect_rc 7 hang_t
expect_log hang_t "lost peer: target rank 1"
[ "$SECS" -le 45 ] || fail "hang_t took ${SECS}s"

run_job hang_d 3 90 --topology 2-1 --peer-timeout $T --inject-fail-rank 2 --inject-fail-step 4 --inject-fail-mode hang --epochs 5
expect_rc 7 hang_d
expect_log hang_d "no credit from drafter rank(s) 2"
[ "$SECS" -le 45 ] || fail "hang_d took ${SECS}s"

# Two drafters: the survivor's gradient allreduce stalls; it names the drafter that never entered the round.
run_job hang_d2 4 90 --topology 2-2 --peer-timeout $T --inject-fail-rank 3 --inject-fail-step 4 --inject-fail-mode hang --epochs 5
expect_rc 7 hang_d2
expect_log hang_d2 "lost peer: drafter rank(s) 3 (last at round"
[ "$SECS" -le 45 ] || fail "hang_d2 took ${SECS}s"

run_job kill_t 4 90 --topology 2-1 --peer-timeout $T --inject-fail-rank 0 --inject-fail-step 3 --inject-fail-mode kill --epochs 5
expect_rc 137 kill_t  # mpirun ends the job with 128 + SIGKILL (README: "ends the job with 137")
expect_log kill_t "process rank 0"
expect_log kill_t "killing myself"
[ "$SECS" -le 45 ] || fail "kill_t took ${SECS}s"
# no rank may survive its job
sleep 1
if pgrep -f "$WORK/" >/dev/null; then fail "ranks survived: $(pgrep -af "$WORK/")"; fi
echo "PASS"
