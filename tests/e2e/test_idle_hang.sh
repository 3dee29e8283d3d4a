#!/usr/bin/env bash
# A hung idle rank does not turn a finished run into exit 7: the working ranks finish (drafter exported),
# rank 0 asks the idle rank to leave, names it (rank, host, pid, what it waited for) when it does not answer
# within --peer-timeout, and the job ends with the run's own code (0) through MPI_Abort. Before, the final
# barrier waited 10 x --peer-timeout and ended a complete run with exit 7, naming nobody. A working rank
# that hangs is still exit 7 (test_lost_peer.sh).
source "$(dirname "$0")/lib.sh"
T=10  # --peer-timeout seconds
# Topology 2-1 on 4 ranks: rank 3 is idle; the test hook stops it (SIGSTOP) as soon as it starts waiting.
run_job idle_hang 4 120 --topology 2-1 --max-steps 4 --peer-timeout $T \
  --inject-fail-rank 3 --inject-fail-step 0 --inject-fail-mode hang
expect_rc 0 idle_hang
expect_log idle_hang "  3  idle"
expect_log idle_hang "rank 3 (idle): test hook --inject-fail-step 0: stopping myself"
expect_log idle_hang "drafter exported to $WORK/idle_hang/drafter"
expect_log idle_hang "warning: idle rank 3 (host $(hostname)"
expect_log idle_hang "did not answer the end of the run within $T s (--peer-timeout); it was waiting for the run to end"
expect_log idle_hang "the run is complete (drafter exported); exit 0"
[ -f "$WORK/idle_hang/drafter/model.safetensors" ] || fail "no exported drafter"
# named within the deadline: the run itself takes seconds; the idle rank costs --peer-timeout, not 10 x
[ "$SECS" -lt $((5 * T)) ] || fail "idle_hang took ${SECS}s"
sleep 1
if pgrep -f "$WORK/" >/dev/null; then fail "ranks survived: $(pgrep -af "$WORK/")"; fi

# The same run with its idle rank well: every rank leaves through MPI_Finalize, exit 0, no warning.
run_job idle_well 4 120 --topology 2-1 --max-steps 4 --peer-timeout $T
expect_rc 0 idle_well
if grep -q "did not answer" "$WORK/idle_well.log"; then fail "idle_well: a warning without a hang"; fi
echo "PASS"
