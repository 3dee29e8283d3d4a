#!/usr/bin/env bash
# dflash-eval on the GPU (bf16): a drafter the CPU pipeline trained, and an untrained one, decode with the
# tiny target on CUDA. tau of the untrained one ~ 1.0, the trained one clearly higher and within 0.15 of the
# CPU's tau (bf16 target and drafter may flip a few near-tied greedy choices, so the tokens are not required
# to equal the CPU's); the per-prompt accounting holds as on the CPU.
source "$(dirname "$0")/gpu_lib.sh"
EVAL="$DFLASH_BIN/dflash-eval"
tiny=$(tiny_dir)
NEW=32
run_job train 2 600 --topology 1-1 --batch-order fixed --lr 0.02 --warmup-steps 10 --epochs 0 --max-steps 320 --log-every 80
expect_rc 0 train
ev() {  # ev NAME ARGS...
  local name=$1
  shift
  timeout -k 5 300 "$EVAL" --target "$tiny/target" --prompts "$tiny/data.h5" --max-prompts 12 --max-new-tokens $NEW \
    --json "$WORK/$name.json" "$@" >"$WORK/$name.log" 2>&1 || { cat "$WORK/$name.log"; fail "$name: exit $?"; }
}
ev cpu --backend cpu --drafter "$WORK/train/drafter"
ev gpu --backend cuda --drafter "$WORK/train/drafter"
ev gpufresh --backend cuda --fresh-drafter
cat "$WORK/gpu.log"
$PY - "$WORK/cpu.json" "$WORK/gpu.json" "$WORK/gpufresh.json" $NEW <<'PYEOF' || fail "GPU tau"
import json, sys
cpu, gpu, fresh = (json.load(open(p)) for p in sys.argv[1:4])
new = int(sys.argv[4])
print(f"# tau: cpu {cpu['tau']:.3f}, gpu {gpu['tau']:.3f}, gpu untrained {fresh['tau']:.3f}")
assert gpu["backend"] == "cuda" and cpu["backend"] == "cpu"
assert 1.0 <= fresh["tau"] <= 1.05, fresh["tau"]
assert gpu["tau"] >= fresh["tau"] + 0.15, (gpu["tau"], fresh["tau"])
assert abs(gpu["tau"] - cpu["tau"]) <= 0.15, (gpu["tau"], cpu["tau"])
for p in gpu["prompts"]:
    acc = p["acceptance"]
    # the official count (include/dflash/spec_decode.h): the steps accept every new token but the first, the
    # target's own token before the first block
    assert sum(acc) == new - 1 and len(p["tokens"]) == new, (sum(acc), new)
PYEOF
echo "PASS"
