#!/usr/bin/env bash
# A newcomer's path from chat data to training on the only model they have, the tiny target: dflash-make-tiny
# writes its tokenizer (tokenizer.json + tokenizer_config.json with a chat template, ids below the vocabulary),
# dflash-tokenize turns a chat JSONL into a dataset with it, and dflash-train (real mpirun, 1-1) trains on that.
# A target directory without tokenizer files is reported as such, not as "no chat template". Exit 77 (skipped)
# without transformers/tokenizers.
source "$(dirname "$0")/../e2e/lib.sh"
source "$DFLASH_SRC/tests/data_tools/lib.sh"
TPY=$(find_py tokenizers transformers jinja2 h5py numpy)
export TRANSFORMERS_VERBOSITY=error DFLASH_NO_REEXEC=1

# A fresh tiny target (not the tests' shared one, which may predate the tokenizer); few records: only the
# target directory is used here.
"$DFLASH_BIN/dflash-make-tiny" "$WORK/tiny" --records 8 >"$WORK/make.log" 2>&1 || { cat "$WORK/make.log"; fail "dflash-make-tiny"; }
cat "$WORK/make.log"
grep -q "tokenizer.json with 400 tokens and a chat template" "$WORK/make.log" || fail "make-tiny: no tokenizer line"
target="$WORK/tiny/target"
[ -s "$target/tokenizer.json" ] && [ -s "$target/tokenizer_config.json" ] || fail "make-tiny wrote no tokenizer"

# The same files on every run (the merges are learnt deterministically).
"$DFLASH_BIN/dflash-make-tiny" "$WORK/tiny2" --records 8 >/dev/null 2>&1 || fail "dflash-make-tiny (second)"
cmp -s "$target/tokenizer.json" "$WORK/tiny2/target/tokenizer.json" || fail "tokenizer.json differs between two runs"

# A vocabulary too small for the 256 byte tokens gets none, and says so.
"$DFLASH_BIN/dflash-make-tiny" "$WORK/small" --vocab 200 --records 8 >"$WORK/small.log" 2>&1 || fail "make-tiny --vocab 200"
grep -q "no tokenizer: --vocab below 262" "$WORK/small.log" || fail "make-tiny --vocab 200: no note"
[ ! -e "$WORK/small/target/tokenizer.json" ] || fail "make-tiny --vocab 200 wrote a tokenizer"

"$TPY" - "$WORK/chat.jsonl" <<'PYEOF'
import json, random, sys
rng = random.Random(1)
words = "the quick brown fox jumps over lazy dog what is capital of France Paris two plus four sea sky".split()
say = lambda n: " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."
with open(sys.argv[1], "w") as f:
    for i in range(16):
        f.write(json.dumps({"messages": [{"role": "user", "content": say(6)},
                                         {"role": "assistant", "content": say(20)}]}) + "\n")
PYEOF
"$TPY" "$DFLASH_SRC/tools/dflash-tokenize" "$target" "$WORK/chat.jsonl" "$WORK/chat.h5" --no-enable-thinking \
  >"$WORK/tokenize.log" 2>&1 || { cat "$WORK/tokenize.log"; fail "dflash-tokenize on the tiny target"; }
cat "$WORK/tokenize.log"
grep -q "wrote $WORK/chat.h5: 16 records" "$WORK/tokenize.log" || fail "tokenize: not 16 records"
grep -q "ids checked against vocab 512 (from config.json)" "$WORK/tokenize.log" || fail "tokenize: vocab not the target's"
# ids below 400 (the tokenizer's size: the mask token 511 stays free), loss on the answers only
h5check "$WORK/chat.h5" "f['tokens'][:].max() < 400 and 0 < f['loss_mask'][:].mean() < 1"

run_job tiny_chat 2 240 --topology 1-1 --target "$target" --data "$WORK/chat.h5" --epochs 0 --max-steps 1 --log-every 1
expect_rc 0 tiny_chat
expect_log tiny_chat "step=1 "
h5check "$WORK/tiny_chat/metrics.h5" "len(f['steps/step']) == 1 and np.isfinite(f['steps/loss'][0])"

# Without tokenizer files: what is missing, exit 3.
mkdir -p "$WORK/weights-only"
cp "$target/config.json" "$WORK/weights-only/"
set +e
"$TPY" "$DFLASH_SRC/tools/dflash-tokenize" "$WORK/weights-only" "$WORK/chat.jsonl" "$WORK/none.h5" >"$WORK/none.log" 2>&1
RC=$?
set -e
expect_rc 3 none
expect_log none "has no tokenizer files"
! grep -q "chat template" "$WORK/none.log" || fail "a missing tokenizer reported as a missing chat template"
echo "PASS"
