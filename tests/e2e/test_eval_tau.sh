#!/usr/bin/env bash
# dflash-eval: a drafter trained by the pipeline (CPU, real mpirun) accepts more than an untrained one
# (tau ~ 1.0), speculative decoding reproduces the target's own greedy decoding token for token, and the
# per-prompt numbers add up (tokens generated = 1 + sum of acceptance lengths, cut at --max-new-tokens).
source "$(dirname "$0")/lib.sh"
EVAL="$DFLASH_BIN/dflash-eval"
tiny=$(tiny_dir)
NEW=40

# One target in a fixed batch order: the same drafter on every machine (tau 1.151 with the official count and
# the last block drafted over the rows left; 1.152 with that block over B rows; 1.155 with the count before
# it, which ran one more step per prompt; untrained 1.00).
run_job train 2 500 --topology 1-1 --batch-order fixed --lr 0.02 --warmup-steps 10 --epochs 0 --max-steps 320 --log-every 80
expect_rc 0 train
expect_log train "drafter exported to"

run_eval() {  # run_eval NAME WANT_RC ARGS...
  local name=$1 want=$2
  shift 2
  set +e
  timeout -k 5 300 "$EVAL" --target "$tiny/target" --prompts "$tiny/data.h5" --max-prompts 12 \
    --max-new-tokens $NEW "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq "$want" ] || { tail -30 "$WORK/$name.log" >&2; fail "$name: exit $rc, expected $want"; }
}
tau_of() { sed -n 's/^tau \([0-9.]*\) .*/\1/p' "$WORK/$1.log"; }

run_eval fresh 0 --fresh-drafter --json "$WORK/fresh.json"
run_eval trained 0 --drafter "$WORK/train/drafter" --check-greedy --json "$WORK/trained.json"
cat "$WORK/trained.log"
fresh=$(tau_of fresh)
trained=$(tau_of trained)
note "tau: untrained $fresh, trained $trained"
$PY - "$fresh" "$trained" <<'EOF' || fail "tau: untrained $fresh, trained $trained"
import sys
fresh, trained = map(float, sys.argv[1:])
assert 1.0 <= fresh <= 1.05, f"an untrained drafter must score tau ~ 1.0, got {fresh}"
# 0.1, not 0.15: the count before it cleared 0.15 by 0.001, with an extra step per prompt the official
# loop does not run (test_eval_tau's drafter: 1.155 -> 1.152).
assert trained >= fresh + 0.1, f"the trained drafter ({trained}) must beat the untrained one ({fresh})"
EOF
grep -q "greedy check: 0 of 12 prompts differ" "$WORK/trained.log" || fail "speculative output differs from greedy"

# The numbers add up, prompt by prompt (no stop token in the tiny target's config).
$PY - "$WORK/trained.json" "$WORK/fresh.json" $NEW <<'EOF' || fail "per-prompt accounting"
import json, sys
new = int(sys.argv[3])
for path in sys.argv[1:3]:
    j = json.load(open(path))
    assert len(j["prompts"]) == 12 and j["block_size"] >= 2
    taus = []
    for p in j["prompts"]:
        acc = p["acceptance"]
        assert all(1 <= a <= j["block_size"] for a in acc), acc
        # the prefill adds the first token, every step the tokens it keeps (the official count: the step
        # that reaches the limit counts only the tokens that fit)
        assert sum(acc) == new - 1, (sum(acc), new)
        assert len(p["tokens"]) == new == p["new_tokens"]
        assert abs(p["tau"] - sum(acc) / len(acc)) < 1e-9
        taus.append(p["tau"])
    assert abs(j["tau"] - sum(taus) / len(taus)) < 1e-9
# the same prompts give the same tokens with either drafter: the target decides every token
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert [p["tokens"] for p in a["prompts"]] == [p["tokens"] for p in b["prompts"]]
EOF

# A stop token ends a prompt's output right after it: the first token the target generates for record 0.
first=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['prompts'][0]['tokens'][0])" "$WORK/trained.json")
run_eval stop 0 --drafter "$WORK/train/drafter" --stop-token "$first" --max-prompts 1 --json "$WORK/stop.json"
$PY -c "import json,sys; p=json.load(open(sys.argv[1]))['prompts'][0]; assert p['tokens'] == [$first] and p['acceptance'] == [], p" \
  "$WORK/stop.json" || fail "--stop-token"

# Under the FP8 target (--target-precision fp8: the linears quantized on load, the CPU backend emulating them):
# still lossless against that target's own greedy decoding, and the header and the JSON name the linears.
grep -q "vocab [0-9]*, bf16 linears)" "$WORK/trained.log" || fail "the bf16 target's header"
run_eval fp8 0 --drafter "$WORK/train/drafter" --target-precision fp8 --check-greedy --json "$WORK/fp8.json"
grep -q "fp8 blocks linears)" "$WORK/fp8.log" || fail "--target-precision fp8: header"
grep -q "greedy check: 0 of 12 prompts differ" "$WORK/fp8.log" || fail "--target-precision fp8: lossless"
$PY -c "import json,sys; assert json.load(open(sys.argv[1]))['target_linears'] == 'fp8 blocks'" "$WORK/fp8.json" ||
  fail "--target-precision fp8: json"
note "tau under the FP8 target: $(tau_of fp8)"

# Refusals: clear messages, distinct exit codes, before any work.
run_eval precision 2 --drafter "$WORK/train/drafter" --target-precision fp9
grep -q "is not a precision this build runs" "$WORK/precision.log" || fail "--target-precision fp9: message"
run_eval both 2 --drafter "$WORK/train/drafter" --fresh-drafter
grep -q "exactly one of --drafter DIR and --fresh-drafter" "$WORK/both.log" || fail "both drafters: message"
run_eval noprompts 3 --fresh-drafter --prompts "$WORK/missing.h5"
grep -q "missing.h5" "$WORK/noprompts.log" || fail "missing prompts: message"
echo "PASS"
