#!/usr/bin/env bash
# The learning-rate schedule runs to the end of the data by default: without --max-steps the job counts
# the batches its loaders will pack (every shard, every epoch) before it starts, prints the schedule, and
# the cosine reaches its floor (--min-lr-ratio x --lr: 0 by default, as SpecForge's schedule) at the run's
# last step -- it used to stay at --lr unless --max-steps was given. --warmup-ratio sets the warmup as a
# fraction of those steps; with --warmup-steps too it is refused.
source "$(dirname "$0")/lib.sh"
run_job sched 3 240 --topology 2-1 --log-every 10 --lr 1e-3
expect_rc 0 sched
line=$(grep -m1 "lr schedule:" "$WORK/sched.log") || fail "sched: no lr schedule line"
note "$line"
N=$(echo "$line" | sed -n 's/.*cosine to [0-9.e-]* at step \([0-9]*\) (.*/\1/p')
[ -n "$N" ] && [ "$N" -gt 10 ] || fail "sched: no planned step count in '$line'"
h5check "$WORK/sched/metrics.h5" "len(f['steps/step']) == $N"              # the plan is the run's real length
h5check "$WORK/sched/metrics.h5" "abs(f['steps/lr'][0] - 1e-3) < 1e-9"      # no warmup: the peak first
expect_log sched "lr schedule: peak 0.001, warmup 0 step(s), cosine to 0 at step $N"
# The last step (0-based N-1) is one step short of the floor 0: lr * (1 + cos(pi (N-1)/N)) / 2.
h5check "$WORK/sched/metrics.h5" "abs(f['steps/lr'][-1] / (1e-3 * 0.5 * (1 + np.cos(np.pi * ($N - 1) / $N))) - 1) < 1e-3"
h5check "$WORK/sched/metrics.h5" "all(a >= b for a, b in zip(f['steps/lr'][:-1], f['steps/lr'][1:]))"

run_job ratio 3 240 --topology 2-1 --log-every 10 --lr 1e-3 --warmup-ratio 0.25 --min-lr-ratio 0.1
expect_rc 0 ratio
W=$((N / 4)); [ $((N % 4 * 2)) -ge 4 ] && W=$((W + 1))  # round(N / 4)
expect_log ratio "lr schedule: peak 0.001, warmup $W step(s), cosine to 0.0001 at step $N"
h5check "$WORK/ratio/metrics.h5" "f['steps/lr'][0] < f['steps/lr'][1] < f['steps/lr'][2]"  # warming up
h5check "$WORK/ratio/metrics.h5" "1e-4 < f['steps/lr'][-1] < 1.05e-4"  # --min-lr-ratio 0.1: the floor 1e-4

run_job both 3 60 --topology 2-1 --warmup-ratio 0.1 --warmup-steps 5
expect_rc 2 both
expect_log both "--warmup-ratio and --warmup-steps both set the warmup"
echo "PASS"
