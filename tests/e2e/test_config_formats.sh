#!/usr/bin/env bash
# --config in YAML and TOML (src/runtime/config_file.h): a real job from a YAML recipe (a list for --data,
# snake_case keys, quoted values, comments), the TOML one's dry run; a bad line is refused naming the file and
# the line (exit 2), in every spelling; and --backend auto says what it chose and why, in the job's startup
# and in --dry-run (no GPU visible here: cpu).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)

cat >"$WORK/job.yaml" <<EOF
---
# a person's recipe, in YAML
target: "$tiny/target"
data:
  - $tiny/data.h5
out: '$WORK/yaml'
topology: 1-1          # one target, one drafter
draft_layers: 1
token_budget: 512
max_steps: 3
log_every: 1
peer_timeout: 20
EOF
set +e
timeout -k 5 180 mpirun -np 2 --oversubscribe "$TRAIN" --config "$WORK/job.yaml" >"$WORK/yaml.log" 2>&1
RC=$?
set -e
expect_rc 0 yaml
expect_log yaml "--max-steps=3"
expect_log yaml "--token-budget=512"
[ -f "$WORK/yaml/drafter/model.safetensors" ] || fail "yaml: no drafter exported"
# --backend auto, said at startup. Without a visible GPU (CI) it is cpu, whatever the build.
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }; then
  expect_log yaml "[dflash] backend: cpu, chosen by --backend auto: this build has"
  expect_log yaml "--backend=cpu"
fi

cat >"$WORK/job.toml" <<EOF
# the same in TOML
target = "$tiny/target"
data = ["$tiny/data.h5"]
out = "$WORK/toml"
topology = "1-1"
draft_layers = 1
token_budget = 512
EOF
dry toml --config "$WORK/job.toml" --ranks 2
expect_rc 0 toml
expect_log toml "topology 1-1"
expect_log toml "[dflash] backend: "
dry tomlcpu --config "$WORK/job.toml" --ranks 2 --backend cpu
expect_rc 0 tomlcpu
expect_log tomlcpu "[dflash] backend: cpu (as given)"

# A bad line names FILE:LINE, whatever the spelling.
printf 'target: T\ndata: D.h5\nout: O\nlr: fast\n' >"$WORK/bad.yaml"
dry badyaml --config "$WORK/bad.yaml"
expect_rc 2 badyaml
expect_log badyaml "--config $WORK/bad.yaml:4: bad value 'fast' for lr"
printf 'target = "T"\n\n[training]\nlr = 1e-3\n' >"$WORK/bad.toml"
dry badtoml --config "$WORK/bad.toml"
expect_rc 2 badtoml
expect_log badtoml "--config $WORK/bad.toml:3: a TOML table [training]"
printf 'target = T\nmax-anchor = 5\n' >"$WORK/bad.cfg"
dry badcfg --config "$WORK/bad.cfg"
expect_rc 2 badcfg
expect_log badcfg "--config $WORK/bad.cfg:2: unknown option 'max-anchor'; did you mean max-anchors?"
printf 'target = T\ndata = D.h5\nout = O\n# fine\nwarmup-steps = -3\n' >"$WORK/range.cfg"
dry range --config "$WORK/range.cfg"
expect_rc 2 range
expect_log range "bad value -3 for --warmup-steps (--config $WORK/range.cfg:5)"
echo "PASS"
