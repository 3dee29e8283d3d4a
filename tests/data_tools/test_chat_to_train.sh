#!/usr/bin/env bash
# From chat data to a trained drafter on tiny parts, through real mpirun: chat JSONL (OpenAI + ShareGPT) ->
# [dflash-regenerate with the tiny target itself, when torch is installed] -> dflash-tokenize with a tokenizer
# made here (ids < 400 fit the tiny target's 512) -> dataset -> dflash-train (CPU, 1-1) trains on it and
# exports a drafter -> dflash-eval decodes the chats' prompts with it (tau, lossless against greedy). Each
# hand-off is checked. Exit 77 (skipped) without transformers/tokenizers.
source "$(dirname "$0")/../e2e/lib.sh"
source "$DFLASH_SRC/tests/data_tools/lib.sh"
TPY=$(find_py tokenizers transformers jinja2 h5py numpy)
export TRANSFORMERS_VERBOSITY=error DFLASH_NO_REEXEC=1
tiny=$(tiny_dir)
target="$WORK/target"
cp -r "$tiny/target" "$target"
"$TPY" "$DFLASH_SRC/tests/data_tools/make_tiny_tokenizer.py" "$target" --template qwen3 >/dev/null ||
  fail "make_tiny_tokenizer"

# 48 conversations, both formats, one and two turns
"$TPY" - "$WORK/chat.jsonl" <<'PYEOF'
import json, random, sys
rng = random.Random(0)
words = "the quick brown fox jumps over lazy dog capital of France is Paris two plus four sea sky".split()
say = lambda n: " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
with open(sys.argv[1], "w") as f:
    for i in range(48):
        if i % 2:
            conv = {"conversations": [{"from": "human", "value": say(6)}, {"from": "gpt", "value": say(30)}]}
        else:
            conv = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                                 {"role": "user", "content": say(5)}, {"role": "assistant", "content": say(25)},
                                 {"role": "user", "content": say(4)}, {"role": "assistant", "content": say(20)}]}
        f.write(json.dumps(conv) + "\n")
PYEOF
chat="$WORK/chat.jsonl"

if RPY=$(find_py tokenizers transformers jinja2 torch 2>/dev/null); then
  note "regenerate: the tiny target answers every prompt itself (greedy, transformers)"
  "$RPY" "$DFLASH_SRC/tools/dflash-regenerate" --model "$target" --input "$chat" --output "$WORK/regen.jsonl" \
    --max-new-tokens 24 --batch-size 16 --no-enable-thinking >"$WORK/regen.log" 2>&1 || { cat "$WORK/regen.log"; fail "dflash-regenerate"; }
  grep -q "48 conversations, 72 responses" "$WORK/regen.log" || { cat "$WORK/regen.log"; fail "regenerate summary"; }
  chat="$WORK/regen.jsonl"
else
  note "SKIPPED the regenerate step: no python3 with torch (DFLASH_TORCH=1 tools/setup.sh installs it)"
fi

"$TPY" "$DFLASH_SRC/tools/dflash-tokenize" "$target" "$chat" "$WORK/chat.h5" --max-length 256 --no-enable-thinking \
  >"$WORK/tokenize.log" 2>&1 || { cat "$WORK/tokenize.log"; fail "dflash-tokenize"; }
cat "$WORK/tokenize.log"
grep -q "wrote $WORK/chat.h5: 48 records" "$WORK/tokenize.log" || fail "tokenize: not 48 records"
grep -q "ids checked against vocab 512 (from config.json)" "$WORK/tokenize.log" || fail "tokenize: vocab not the target's"
h5check "$WORK/chat.h5" "f.attrs['vocab_size'] == 512 and f.attrs['format_version'] == 1"
h5check "$WORK/chat.h5" "f['tokens'].dtype == np.int32 and f['offsets'].dtype == np.int64 and f['loss_mask'].dtype == np.uint8"
h5check "$WORK/chat.h5" "0 < f['loss_mask'][:].mean() < 1 and f['tokens'][:].max() < 400"

run_job chat 2 240 --topology 1-1 --target "$target" --data "$WORK/chat.h5" --epochs 0 --max-steps 12 --log-every 4
expect_rc 0 chat
expect_log chat "step=12 "
expect_log chat "drafter exported to"
h5check "$WORK/chat/metrics.h5" "len(f['steps/step']) == 12 and np.all(np.isfinite(f['steps/loss'][:]))"
[ -s "$WORK/chat/drafter/model.safetensors" ] || fail "no exported drafter"

# The export's config loads in transformers as the releases' does (trust_remote_code; no auto_map naming a
# modeling file the export does not ship).
"$TPY" - "$WORK/chat/drafter" <<'PYEOF' || fail "the exported config does not load in transformers"
import sys
from transformers import AutoConfig
c = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)
assert c.model_type == "qwen3" and c.architectures == ["DFlashDraftModel"], (c.model_type, c.architectures)
assert c.block_size == 16 and c.dflash_config["target_layer_ids"] and not hasattr(c, "auto_map")
PYEOF

# The exported drafter decodes with its target on the chats' own prompts (each record's tokens before its
# first assistant token): DFlash's speculative decoding, lossless against the target's greedy output.
"$DFLASH_BIN/dflash-eval" --target "$target" --drafter "$WORK/chat/drafter" --prompts "$WORK/chat.h5" --max-prompts 6 \
  --max-new-tokens 16 --check-greedy --json "$WORK/tau.json" >"$WORK/eval.log" 2>&1 || { cat "$WORK/eval.log"; fail "dflash-eval"; }
cat "$WORK/eval.log"
grep -q "greedy check: 0 of 6 prompts differ" "$WORK/eval.log" || fail "dflash-eval: greedy check"
"$TPY" - "$WORK/tau.json" "$WORK/chat.h5" <<'PYEOF' || fail "dflash-eval: prompts or tau"
import json, sys, h5py, numpy as np
j = json.load(open(sys.argv[1]))
with h5py.File(sys.argv[2], "r") as f:
    off, mask = f["offsets"][:], f["loss_mask"][:]
for p in j["prompts"]:
    r = p["record"]
    m = mask[off[r]:off[r + 1]]
    assert p["prompt_tokens"] == int(np.argmax(m == 1)), (r, p["prompt_tokens"])  # the chat up to the answer
    assert 1.0 <= p["tau"] <= j["block_size"] and 1 <= p["new_tokens"] <= 16
assert 1.0 <= j["tau"] <= j["block_size"]
PYEOF
echo "PASS"
