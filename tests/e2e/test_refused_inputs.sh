#!/usr/bin/env bash
# Inputs that would train the wrong thing, or nothing, are refused at startup naming the cause, before
# --out is created: data whose loss mask allows no anchor (exit 3), --draft-layers beyond the target's
# layers (exit 2), a --token-budget whose buffers cannot fit (exit 2).
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
case_rc() {  # case_rc NAME WANT_RC "message" [args...]
  local name=$1 want=$2 msg=$3
  shift 3
  run_job "$name" 2 60 --topology 1-1 --max-steps 3 "$@"
  expect_rc "$want" "$name"
  expect_log "$name" "$msg"
  [ ! -e "$WORK/$name" ] || fail "$name: the refused job created its --out ($(ls "$WORK/$name"))"
}

# Every loss_mask 0 (prompts only): a drafter "trained" on it would export with loss 0 and learn nothing.
cp "$tiny/data.h5" "$WORK/nomask.h5"
"$PY" -c "
import sys, h5py
with h5py.File(sys.argv[1], 'r+') as f:
    f['loss_mask'][:] = 0
" "$WORK/nomask.h5"
case_rc nomask 3 "has nothing to train on: 0 of" --data "$WORK/nomask.h5"
# Masks of isolated single tokens: loss tokens, but no anchor (loss_mask[p] and loss_mask[p+1]).
cp "$tiny/data.h5" "$WORK/isolated.h5"
"$PY" -c "
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], 'r+') as f:
    m = np.zeros(f['loss_mask'].shape, np.uint8); m[::2] = 1
    f['loss_mask'][:] = m
" "$WORK/isolated.h5"
case_rc isolated 3 "no two consecutive ones in a record" --data "$WORK/isolated.h5"

# A --token-budget whose hidden-state buffers cannot fit is a range error (exit 2) before any model loads,
# not an out-of-memory failure (exit 8) after; beyond 32-bit offsets it is out of range on any machine.
case_rc hugebudget 2 "--token-budget 2000000000 is out of range for this machine" --token-budget 2000000000 --long-record cut
expect_log hugebudget "HINT: give --token-budget below"
case_rc int32budget 2 "bad value 3000000000 for --token-budget: out of range" --token-budget 3000000000 --long-record cut

# A 16 KB file declaring 2^34 tokens in chunks never written: refused before the scan (which would read
# fill values for hours) and before its offsets are read.
"$PY" - "$WORK/declared.h5" <<'PYEOF'
import sys, h5py, numpy as np
n = 2 ** 34
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", shape=(n,), dtype="<i4", chunks=(1 << 16,))
    f.create_dataset("offsets", data=np.array([0, n], dtype="<i8"))
    f.create_dataset("loss_mask", shape=(n,), dtype="u1", chunks=(1 << 16,))
    f.attrs["vocab_size"] = np.int64(512); f.attrs["tokenizer"] = "x"; f.attrs["format_version"] = np.int64(1)
PYEOF
case_rc declared 3 "/tokens declares 17179869184 entries" --data "$WORK/declared.h5"
[ "$SECS" -lt 30 ] || fail "declared: the refusal took ${SECS}s"
# A dataset tokenized for another vocabulary (its vocab_size attribute): ids that happen to be small
# enough pass the id check but mean other tokens.
for v in 100 600; do
  cp "$tiny/data.h5" "$WORK/vocab$v.h5"
  "$PY" -c "
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], 'r+') as f:
    f['tokens'][:] = np.minimum(f['tokens'][:], 99); f.attrs['vocab_size'] = np.int64(int(sys.argv[2]))
" "$WORK/vocab$v.h5" "$v"
  case_rc "vocab$v" 3 "was tokenized for a vocabulary of $v ids (its vocab_size attribute), the target has 512 embedding rows" --data "$WORK/vocab$v.h5"
done

# Shards whose BF16 bytes are labelled F16 (config.json says bfloat16) would load as other numbers.
cp -r "$tiny/target" "$WORK/relabel"
"$PY" - "$WORK/relabel" <<'PYEOF'
import glob, re, struct, sys
for p in glob.glob(sys.argv[1] + "/*.safetensors"):
    with open(p, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = f.read(n).decode()
        h2 = re.sub(r'"dtype"\s*:\s*"BF16"', lambda m: m.group(0).replace('"BF16"', '"F16"') + " ", h)
        assert len(h2) == len(h) and h2 != h
        f.seek(8); f.write(h2.encode())
PYEOF
run_job relabel 2 60 --topology 1-1 --max-steps 2 --target "$WORK/relabel"
expect_rc 3 relabel
expect_log relabel "is F16, but $WORK/relabel/config.json says the weights are bfloat16"

# The tiny target has 4 layers.
case_rc deep 2 "--draft-layers 5 is more than the target's 4 layers" --draft-layers 5
# Up to the target's depth it runs, and says where the default layer ids repeat.
run_job repeat 2 60 --topology 1-1 --max-steps 2 --draft-layers 2
expect_rc 0 repeat
expect_log repeat "the drafter reads target layers [1, 1]"
echo "PASS"
