#!/usr/bin/env bash
# OUT/next-topology (jobs/next-topology.sh; docs/checkpoint.md "Changing the split"): the launch scripts read
# it at start and its split overrides the command's --topology. Real runs of jobs/mpirun/train.sh with NP=3 and
# --dry-run (dflash-train prints the resolved topology and loads nothing) on the tiny inputs:
#   - no file: the command's --topology 1-2;
#   - `2-1` in the file (also with spaces, CR and blank lines around it; --out=DIR; out = DIR in --config):
#     the line "[train.sh] topology from OUT/next-topology: 2-1 ...", dflash-train resolves 2-1, the file stays;
#   - `colocated`: dflash-train resolves the colocated layout;
#   - `auto`: dflash-train resolves --topology auto;
#   - malformed (6_2, two splits, empty, a directory): status=failed rc=2 and dflash-train never started;
#   - the file deleted: 1-2 again.
# Then the three sbatch scripts, run directly with the environment Slurm gives a batch shell (one node, three
# tasks; no Slurm needed: they reach mpirun, or for the srun script a stand-in srun that runs mpirun): the file
# overrides DFLASH_TOPOLOGY and the command's --topology, and a malformed one fails the job (rc=2) before any
# rank starts.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
out="$WORK/run"
mkdir -p "$out"
nt="$out/next-topology"

# launch NAME SCRIPT [args...]: the script on the tiny inputs with --dry-run, log in $WORK/NAME.log, rc in $RC
launch() {
  local name=$1 script=$2
  shift 2
  set +e
  NP=3 DFLASH_TRAIN="$TRAIN" DFLASH_BACKEND=cpu DFLASH_HOME="$DFLASH_SRC" timeout -k 5 120 bash "$script" \
    --target "$tiny/target" --data "$tiny/data.h5" --draft-layers 1 --token-budget 512 --dry-run "$@" \
    >"$WORK/$name.log" 2>&1
  RC=$?
  set -e
  note "$name: exit $RC"
}
train() {  # train NAME [args...]: jobs/mpirun/train.sh --out $out --topology 1-2 ... --dry-run
  local name=$1
  shift
  launch "$name" "$DFLASH_SRC/jobs/mpirun/train.sh" --out "$out" --topology 1-2 "$@"
}
expect_topology() {  # expect_topology NAME T-D: dflash-train resolved that split on 3 ranks
  expect_log "$1" "[dflash] topology $2 on 1 node(s) x 3 rank(s)"
}
expect_not_started() {  # expect_not_started NAME TAG: the last line is TAG's status=failed rc=2, no rank ran
  local last
  last=$(tail -n 1 "$WORK/$1.log")
  case "$last" in
    "$2"*"status=failed rc=2 reason='$nt "*"it should hold one line T-D (e.g. 6-2), colocated or auto; fix it, or delete it"*) ;;
    *) cat "$WORK/$1.log" >&2; fail "$1: last line is not a status=failed rc=2 naming $nt: $last" ;;
  esac
  if grep -q '^\[dflash\]' "$WORK/$1.log"; then fail "$1: dflash-train started despite the malformed file"; fi
}

# ---- train.sh ---------------------------------------------------------------------------------------------
train none
expect_rc 0 none
expect_topology none 1-2
if grep -q "topology from" "$WORK/none.log"; then fail "none: a topology line without a next-topology file"; fi
expect_log none "[train.sh] status=completed rc=0"

echo 2-1 >"$nt"
train file
expect_rc 0 file
expect_log file "[train.sh] topology from $nt: 2-1 (delete the file to use the command's own)"
expect_topology file 2-1
[ "$(cat "$nt")" = "2-1" ] || fail "the next-topology file was not kept as it was"

echo colocated >"$nt"  # the colocated layout, as --rebalance auto writes it (docs/pipeline.md "The colocated layout")
train coloc
expect_rc 0 coloc
expect_log coloc "[train.sh] topology from $nt: colocated (delete the file to use the command's own)"
expect_log coloc "[dflash] topology colocated on 1 node(s) x 3 rank(s)"

echo 2-1 >"$nt"
train file_after --topology 1-1  # a --topology at the end of the command is overridden too
expect_rc 0 file_after
expect_topology file_after 2-1

printf '\n  2-1 \r\n\n' >"$nt"  # spaces, a CR and blank lines around the one split
train spaces
expect_rc 0 spaces
expect_topology spaces 2-1

echo 2-1 >"$nt"
launch out_eq "$DFLASH_SRC/jobs/mpirun/train.sh" "--out=$out" --topology 1-2
expect_rc 0 out_eq
expect_topology out_eq 2-1
printf '# the run\nout = %s   # where it goes\ntopology = 1-2\n' "$out" >"$WORK/run.cfg"
launch config "$DFLASH_SRC/jobs/mpirun/train.sh" --config "$WORK/run.cfg"
expect_rc 0 config
expect_log config "[train.sh] topology from $nt: 2-1"
expect_topology config 2-1

echo auto >"$nt"
train auto
expect_rc 0 auto
expect_log auto "[train.sh] topology from $nt: auto"
expect_log auto "[dflash] topology: auto over 3 rank(s)"

for bad in 6_2 two empty dir; do
  rm -rf "$nt"
  case $bad in
    6_2) echo 6_2 >"$nt" ;;
    two) printf '2-1\n1-2\n' >"$nt" ;;
    empty) : >"$nt" ;;
    dir) mkdir "$nt" ;;
  esac
  train "bad_$bad"
  expect_rc 2 "bad_$bad"
  expect_not_started "bad_$bad" "[train.sh] "
done
expect_log bad_6_2 "holds \"6_2\""
expect_log bad_two "holds \"2-1 1-2\""
expect_log bad_empty "holds nothing"
expect_log bad_dir "is not a readable file"

# --out may be shared (issue 48 item 3): a link at the name is refused, not read (it would print a file of
# anyone's into the job's log), as are a hard link and a FIFO (no hang: launch's timeout); a malformed file's
# text is printed only in [0-9A-Za-z_. -], a terminal escape never raw.
printf 'root:secret-hash\n' >"$WORK/secret"
for bad in link hardlink fifo; do
  rm -rf "$nt"
  case $bad in
    link) ln -s "$WORK/secret" "$nt" ;;
    hardlink) ln "$WORK/secret" "$nt" ;;
    fifo) mkfifo "$nt" ;;
  esac
  train "planted_$bad"
  expect_rc 2 "planted_$bad"
  if grep -q 'secret' "$WORK/planted_$bad.log"; then fail "planted_$bad: the linked file's text was printed"; fi
  if grep -q '^\[dflash\]' "$WORK/planted_$bad.log"; then fail "planted_$bad: dflash-train started"; fi
  expect_log "planted_$bad" "[train.sh] status=failed rc=2 reason='$nt "
done
expect_log planted_link "is a symbolic link: refused"
expect_log planted_hardlink "is not a plain file of its own"
rm -rf "$nt"
printf '6-2\033]0;pwned\007\033[2J\n' >"$nt"
train escape
expect_rc 2 escape
if grep -q $'\033' "$WORK/escape.log"; then fail "escape: a terminal escape was echoed raw into the log"; fi
expect_log escape 'holds "6-2??0?pwned???2J"'

rm -rf "$nt"
train deleted
expect_rc 0 deleted
expect_topology deleted 1-2

# ---- the sbatch scripts, with a batch shell's Slurm environment --------------------------------------------
mkdir -p "$WORK/bin"
cat >"$WORK/bin/srun" <<'EOF'
#!/usr/bin/env bash
# stands in for srun (no Slurm cluster here): the same program and arguments under mpirun
while [ $# -gt 0 ] && [[ $1 == --* ]]; do shift; done
exec mpirun -np "$SLURM_NTASKS" "$@"
EOF
chmod +x "$WORK/bin/srun"
export SLURM_JOB_ID=4242 SLURM_NTASKS=3 SLURM_NTASKS_PER_NODE=3 SLURM_JOB_NUM_NODES=1 SLURM_JOB_NODELIST=localhost
export DFLASH_TOPOLOGY=1-1 DFLASH_SRUN_RETRY_S=1
for script in train-1node train-multinode train-1node-srun; do
  sb="$DFLASH_SRC/jobs/slurm/$script.sbatch"
  rm -rf "$nt"
  PATH="$WORK/bin:$PATH" launch "${script}_none" "$sb" --out "$out" --topology 1-2
  expect_rc 0 "${script}_none"
  expect_topology "${script}_none" 1-2
  expect_log "${script}_none" "[sbatch] job=4242 restart=0 status=completed rc=0"

  echo 2-1 >"$nt"
  PATH="$WORK/bin:$PATH" launch "${script}_file" "$sb" --out "$out" --topology 1-2
  expect_rc 0 "${script}_file"
  expect_log "${script}_file" "[sbatch] topology from $nt: 2-1 (delete the file to use the command's own)"
  expect_log "${script}_file" "tasks=3 topology=2-1 backend=cpu"
  expect_topology "${script}_file" 2-1
  if grep -q '^\[train.sh\] topology from' "$WORK/${script}_file.log"; then
    fail "${script}_file: train.sh read the file again"
  fi
  [ "$(cat "$nt")" = "2-1" ] || fail "$script: the next-topology file was not kept"

  echo 6_2 >"$nt"
  PATH="$WORK/bin:$PATH" launch "${script}_bad" "$sb" --out "$out" --topology 1-2
  expect_rc 2 "${script}_bad"
  expect_not_started "${script}_bad" "[sbatch] job=4242 restart=0 "
  if grep -q "^\[sbatch\] job=4242 restart=0 nodes=" "$WORK/${script}_bad.log"; then
    fail "${script}_bad: the job went on past the malformed file"
  fi
done
echo "PASS"
