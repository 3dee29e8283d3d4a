#!/usr/bin/env bash
# A resume on other inputs at the same paths is refused, exit 3, naming what changed: a dataset rewritten
# in place (one token of one record, same size) and target weights changed in place (one byte of a shard,
# same size), and the target's config.json edited in place (rope_theta: the losses would change). Checkpoints
# record the inputs' content identities (docs/checkpoint.md); put back, the same files resume. The same
# files at other paths (a model staged on node-local scratch per Slurm job) resume too, and the log says so.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
cp -r "$tiny" "$WORK/own"
IN=(--target "$WORK/own/target" --data "$WORK/own/data.h5")
COMMON=(--topology 1-1 --max-steps 4 --seed 2 --checkpoint-every 2 "${IN[@]}")
run_job base 2 120 "${COMMON[@]}"
expect_rc 0 base
ck="$WORK/base/checkpoints/step-00000002"
[ -f "$ck/manifest.json" ] || fail "no checkpoint at step 2"
grep -q '"content:data"' "$ck/manifest.json" || fail "the manifest records no dataset identity"

cp "$WORK/own/data.h5" "$WORK/data.orig.h5"
"$PY" - "$WORK/own/data.h5" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    t = f["tokens"]
    t[1] = (int(t[1]) + 1) % int(f.attrs["vocab_size"])
PYEOF
[ "$(stat -c %s "$WORK/own/data.h5")" = "$(stat -c %s "$WORK/data.orig.h5")" ] || fail "the edited dataset changed size"
run_job data 2 60 "${COMMON[@]}" --resume "$ck" --out "$WORK/base"
expect_rc 3 data
expect_log data "the dataset (--data) at the same path is not what the checkpoint was trained on: sampled_records differ"
cp "$WORK/data.orig.h5" "$WORK/own/data.h5"

shard="$WORK/own/target/model-00002-of-00002.safetensors"
cp "$shard" "$WORK/shard.orig"
"$PY" - "$shard" <<'PYEOF'
import sys
with open(sys.argv[1], "r+b") as f:
    f.seek(-3, 2)
    b = f.read(1)
    f.seek(-3, 2)
    f.write(bytes([b[0] ^ 0x01]))
PYEOF
run_job target 2 60 "${COMMON[@]}" --resume "$ck" --out "$WORK/base"
expect_rc 3 target
expect_log target "the target's weights (--target) at the same path is not what the checkpoint was trained on: model-00002-of-00002.safetensors differ"
cp "$WORK/shard.orig" "$shard"

cfg="$WORK/own/target/config.json"
cp "$cfg" "$WORK/config.orig"
"$PY" - "$cfg" <<'PYEOF'
import sys, json
c = json.load(open(sys.argv[1]))
c["rope_theta"] = float(c.get("rope_theta", 10000.0)) * 2
json.dump(c, open(sys.argv[1], "w"), indent=1)
PYEOF
run_job config 2 60 "${COMMON[@]}" --resume "$ck" --out "$WORK/base"
expect_rc 3 config
expect_log config "the target's config.json (--target) at the same path is not what the checkpoint was trained on: rope_theta differ"
cp "$WORK/config.orig" "$cfg"

# The same files elsewhere (copies, as a per-job scratch copy is): accepted, and said at startup.
cp -r "$WORK/own" "$WORK/scratch"
run_job moved 2 120 --topology 1-1 --max-steps 4 --seed 2 --checkpoint-every 2 --target "$WORK/scratch/target" \
  --data "$WORK/scratch/data.h5" --resume "$ck" --out "$WORK/moved"
expect_rc 0 moved
expect_log moved "--target moved: $WORK/own/target -> $WORK/scratch/target, same content"
expect_log moved "--data moved: $WORK/own/data.h5 -> $WORK/scratch/data.h5, same content"

# The original inputs back: the run resumes and finishes.
run_job resumed 2 120 "${COMMON[@]}" --resume "$ck" --out "$WORK/base"
expect_rc 0 resumed
expect_log resumed "resuming from $ck"
echo "PASS"
