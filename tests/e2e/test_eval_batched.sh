#!/usr/bin/env bash
# dflash-eval --prompt-batch: prompts decoding together (one packed target forward per step) give, prompt by
# prompt, the tokens, acceptance lengths and tau of decoding them one at a time (--prompt-batch 1), bit for bit
# on the CPU backend: greedy and sampled (--temperature 1: each prompt's own generator), with a stop token so
# that the prompts finish at different steps, and with --max-batch-tokens too small for every prompt at once
# (prompts wait for room). A drafter the pipeline trained, so steps keep several tokens; refusals named.
source "$(dirname "$0")/lib.sh"
EVAL="$DFLASH_BIN/dflash-eval"
tiny=$(tiny_dir)
NEW=40

run_job train 2 500 --topology 1-1 --batch-order fixed --lr 0.02 --warmup-steps 10 --epochs 0 --max-steps 200 --log-every 100
expect_rc 0 train

run_eval() {  # run_eval NAME WANT_RC ARGS...
  local name=$1 want=$2
  shift 2
  set +e
  timeout -k 5 300 "$EVAL" --target "$tiny/target" --prompts "$tiny/data.h5" --drafter "$WORK/train/drafter" \
    --max-prompts 12 --max-new-tokens $NEW --json "$WORK/$name.json" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq "$want" ] || { tail -30 "$WORK/$name.log" >&2; fail "$name: exit $rc, expected $want"; }
}

# A stop token: the 12th token prompt 0 generates (greedy, no stop), so some prompts stop early.
run_eval nostop 0 --prompt-batch 1
stop=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'][0]['tokens'][11])" "$WORK/nostop.json")
note "stop token $stop"
for mode in greedy sampled; do
  args=(--stop-token "$stop")
  [ $mode = sampled ] && args+=(--temperature 1 --seed 3)
  run_eval $mode-1 0 "${args[@]}" --prompt-batch 1
  run_eval $mode-5 0 "${args[@]}" --prompt-batch 5
  run_eval $mode-all 0 "${args[@]}" --prompt-batch 64
  # room for about three prompts' prompt + new tokens at a time
  run_eval $mode-tight 0 "${args[@]}" --prompt-batch 64 --max-batch-tokens 200
  grep -q "64 prompt(s) at a time" "$WORK/$mode-all.log" || fail "$mode: the batch is not reported"
  $PY - "$WORK/$mode-1.json" "$WORK/$mode-5.json" "$WORK/$mode-all.json" "$WORK/$mode-tight.json" $NEW <<'PYEOF' || fail "$mode: batched != one at a time"
import json, sys
one, *batched = (json.load(open(p)) for p in sys.argv[1:5])
new = int(sys.argv[5])
assert one["prompt_batch"] == 1 and batched[0]["prompt_batch"] == 5 and batched[2]["packed_tokens"] == 200, \
    (one["prompt_batch"], batched[0]["prompt_batch"], batched[2]["packed_tokens"])
lengths = sorted({len(p["tokens"]) for p in one["prompts"]})
multi = sum(a > 1 for p in one["prompts"] for a in p["acceptance"])
print(f"# {len(one['prompts'])} prompts, {lengths[0]}..{lengths[-1]} new tokens, {multi} steps kept more than one, tau {one['tau']:.4f}")
assert len(lengths) > 1 and lengths[0] < new and lengths[-1] == new, lengths  # they finish at different steps
assert multi >= 5, multi  # the drafter is accepted: batching must carry its drafts right
for b in batched:
    assert len(b["prompts"]) == len(one["prompts"])
    for i, (p, q) in enumerate(zip(one["prompts"], b["prompts"])):
        assert p["tokens"] == q["tokens"], (b["prompt_batch"], i, p["tokens"], q["tokens"])
        assert p["acceptance"] == q["acceptance"], (b["prompt_batch"], i, p["acceptance"], q["acceptance"])
        assert p["tau"] == q["tau"]
    assert b["tau"] == one["tau"], (b["tau"], one["tau"])
# where the time went: the three parts fit inside the decoding's wall time and account for most of it
for r in (one, *batched):
    split = r["seconds_split"]
    parts = split["target"] + split["drafter"] + split["verify"]
    assert split["packed_steps"] > 0 and 0.5 * r["seconds"] <= parts <= r["seconds"] + 1e-3, (split, r["seconds"])
PYEOF
  grep -q "^time .*target .*drafter .*host verification" "$WORK/$mode-all.log" || fail "$mode: no time line"
done

# Refusals: a bound below one prompt with its new tokens; a zero batch.
run_eval small 2 --max-batch-tokens 30
grep -q -- "--max-batch-tokens 30 holds no batch" "$WORK/small.log" || { cat "$WORK/small.log"; fail "--max-batch-tokens: message"; }
run_eval zero 2 --prompt-batch 0
grep -q -- "--prompt-batch" "$WORK/zero.log" || { cat "$WORK/zero.log"; fail "--prompt-batch 0: message"; }
echo "PASS"
