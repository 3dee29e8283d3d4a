#!/usr/bin/env bash
# Bad options and inputs end the job at startup with a clear message and the documented exit code
# (README "Exit codes"): 2 options, 3 input, 4 topology. None may hang. A bad command line ends every rank in
# order (no MPI_ABORT); a mistyped option names the nearest one.
source "$(dirname "$0")/lib.sh"
case_rc() {  # case_rc NAME WANT_RC "message" NP [args...]
  local name=$1 want=$2 msg=$3 np=$4
  shift 4
  run_job "$name" "$np" 60 "$@"
  expect_rc "$want" "$name"
  expect_log "$name" "$msg"
  [ "$SECS" -le 30 ] || fail "$name took ${SECS}s"
}
case_rc unknown 2 "unrecognised option '--frobnicate'" 2 --topology 1-1 --frobnicate 3
case_rc typo 2 "unrecognised option '--topolgy'; did you mean --topology?" 3 --topolgy 1-1
case_rc badtopo 2 "bad --topology '2x1'" 2 --topology 2x1
case_rc zerotopo 2 "at least one target and one drafter" 2 --topology 0-1
case_rc badvalue 2 "--lr" 2 --topology 1-1 --lr fast
case_rc cpuplane 2 "--data-plane nccl moves device tensors; the CPU backend has none" 2 --topology 1-1 --data-plane nccl
case_rc toomany 4 "--topology 3-2 needs 5 ranks per node but 4 run per node" 4 --topology 3-2
case_rc budget 2 "--token-budget 16 is smaller than record" 2 --topology 1-1 --token-budget 16
case_rc skipall 2 "--long-record skip drops every record" 2 --topology 1-1 --token-budget 16 --long-record skip
# A bad command line is the same fault on every rank: reported once, by rank 0, and every rank exits with
# code 2 through MPI_Finalize -- no MPI_ABORT banner.
for name in unknown typo badtopo zerotopo badvalue cpuplane; do
  ! grep -q "MPI_ABORT" "$WORK/$name.log" || { cat "$WORK/$name.log" >&2; fail "$name: an option error aborted the job"; }
  [ "$(grep -c 'dflash FATAL' "$WORK/$name.log")" -eq 1 ] || { cat "$WORK/$name.log" >&2; fail "$name: reported more than once"; }
done
case_rc nodata 3 "--data /nonexistent/data.h5: no such file" 2 --topology 1-1 --data /nonexistent/data.h5
case_rc notarget 3 "--target /nonexistent/ckpt: no config.json there" 2 --topology 1-1 --target /nonexistent/ckpt
case_rc nodrafter 3 "--drafter /nonexistent/d: no config.json there" 2 --topology 1-1 --drafter /nonexistent/d
# A dataset that is not one: the loader's validation, exit 3.
echo "not hdf5" >"$WORK/junk.h5"
case_rc junkdata 3 "junk.h5" 2 --topology 1-1 --data "$WORK/junk.h5"

# srun without a PMI the MPI speaks starts N singletons, each "rank 0 of 1": refused, exit 4.
tiny=$(tiny_dir)
set +e
SLURM_NTASKS=4 timeout 60 "$TRAIN" --topology 1-1 --target "$tiny/target" --data "$tiny/data.h5" --out "$WORK/s" \
  >"$WORK/singleton.log" 2>&1
RC=$?
set -e
expect_rc 4 singleton
expect_log singleton "SLURM_NTASKS=4 but the MPI world has 1 rank(s)"

set +e
timeout 60 mpirun -np 2 "$TRAIN" --help >"$WORK/help.log" 2>&1
RC=$?
set -e
expect_rc 0 help
expect_log help "--hs-queue-depth"
[ "$(grep -c -- '--topology T-D (=1-1)' "$WORK/help.log")" -eq 1 ] || fail "help printed by more than one rank"
echo "PASS"
