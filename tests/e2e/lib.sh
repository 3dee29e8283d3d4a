# Shared helpers of the end-to-end tests (sourced, not a test itself). Every job runs through real
# mpirun, under `timeout`, so a hang fails the test instead of stalling CI.
set -euo pipefail
: "${DFLASH_BIN:?set DFLASH_BIN to the build directory}"
: "${DFLASH_SRC:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Ranks on a 2-core machine: no binding, so 4 ranks share the cores.
export OMPI_MCA_hwloc_base_binding_policy=none
PY=/usr/bin/python3  # Debian's python with h5py + numpy (tools/setup.sh installs python3-h5py)
TRAIN="$DFLASH_BIN/dflash-train"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dflash-e2e.XXXXXX")
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
note() { echo "# $*"; }

# The tiny target + dataset, generated once per build directory (tests may run in parallel).
tiny_dir() {
  local dir="$DFLASH_BIN/e2e-data/tiny"
  mkdir -p "$DFLASH_BIN/e2e-data"
  (
    flock 9
    if [ ! -f "$dir/data.h5" ]; then
      rm -rf "$dir.tmp"
      "$DFLASH_BIN/dflash-make-tiny" "$dir.tmp" >&2
      rm -rf "$dir" && mv "$dir.tmp" "$dir"
    fi
  ) 9>"$DFLASH_BIN/e2e-data/.lock"
  echo "$dir"
}

# run_job NAME NP SECONDS [dflash-train args...]: runs mpirun, keeps the log in $WORK/NAME.log and the
# exit code in $RC, the wall time in $SECS. Common flags: the tiny target/data, out = $WORK/NAME.
run_job() {
  local name=$1 np=$2 limit=$3
  shift 3
  local tiny
  tiny=$(tiny_dir)
  local t0=$SECONDS
  set +e
  # Defaults through --config, so a test's own flags override them (the command line wins). The CPU backend
  # named, so these tests run the float32 reference on a GPU machine too (--backend auto would pick cuda there).
  printf 'target = %s\ndata = %s\nout = %s\nbackend = cpu\ndraft-layers = 1\ntoken-budget = 512\npeer-timeout = 20\n' \
    "$tiny/target" "$tiny/data.h5" "$WORK/$name" >"$WORK/$name.cfg"
  timeout -k 5 "$limit" mpirun -np "$np" --oversubscribe "$TRAIN" --config "$WORK/$name.cfg" "$@" >"$WORK/$name.log" 2>&1
  RC=$?
  set -e
  SECS=$((SECONDS - t0))
  note "$name: exit $RC in ${SECS}s"
}

expect_rc() {  # expect_rc WANT NAME
  if [ "$RC" -ne "$1" ]; then
    echo "---- $2.log (tail) ----" >&2
    tail -40 "$WORK/$2.log" >&2
    fail "$2: exit code $RC, expected $1"
  fi
}

expect_log() {  # expect_log NAME "fixed string"
  grep -qF -- "$2" "$WORK/$1.log" || { tail -30 "$WORK/$1.log" >&2; fail "$1: log lacks '$2'"; }
}

wait_for_log() {  # wait_for_log NAME "fixed string": a background job's log shows it within 30 s, or fail
  for _ in $(seq 1 300); do
    grep -qF -- "$2" "$WORK/$1.log" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$1: its log did not show '$2' within 30 s (log: $(tail -5 "$WORK/$1.log" 2>/dev/null))"
}

# h5py check: h5check FILE 'python expression over f (h5py.File) and np' -> must print True
h5check() {
  local file=$1 expr=$2
  local out
  out=$("$PY" -c "
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
print(bool($expr))
" "$file" 2>&1) || fail "h5py on $file: $out"
  [ "$out" = "True" ] || fail "$file: check failed: $expr -> $out"
}
h5eval() {  # h5eval FILE 'expression' -> prints its value
  "$PY" -c "
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], 'r')
print($2)
" "$1"
}

# split_eval_set SRC TRAIN EVAL N: a held-out split of the token dataset SRC for --eval-data: its last N
# records go to EVAL, the others to TRAIN, both with SRC's attributes (vocab size, tokenizer).
split_eval_set() {
  "$PY" - "$@" <<'PYEOF'
import sys, h5py, numpy as np
src = h5py.File(sys.argv[1], 'r')
tok, off, mask = src['tokens'][:], src['offsets'][:], src['loss_mask'][:]
def write(path, recs):
    with h5py.File(path, 'w') as f:
        f['tokens'] = np.concatenate([tok[off[r]:off[r + 1]] for r in recs]).astype(np.int32)
        f['loss_mask'] = np.concatenate([mask[off[r]:off[r + 1]] for r in recs]).astype(np.uint8)
        f['offsets'] = np.concatenate([[0], np.cumsum([off[r + 1] - off[r] for r in recs])]).astype(np.int64)
        for k, v in src.attrs.items():
            f.attrs[k] = v
n, held_out = len(off) - 1, int(sys.argv[4])
write(sys.argv[2], range(0, n - held_out))
write(sys.argv[3], range(n - held_out, n))
PYEOF
}

# expect_resumed_like_straight STRAIGHT RESUMED N: job RESUMED, resumed from STRAIGHT's step-N/2
# checkpoint, logged steps N/2+1..N with STRAIGHT's loss, acc, grad_norm, lr and tokens bit for bit,
# and exported a byte-identical drafter.
expect_resumed_like_straight() {
  local straight=$1 resumed=$2 n=$3
  "$PY" - "$WORK/$straight/metrics.h5" "$WORK/$resumed/metrics.h5" "$n" <<'PYEOF' || fail "$resumed losses differ from the $straight run"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r'), h5py.File(sys.argv[2], 'r')
n = int(sys.argv[3])
assert list(b['steps/step'][:]) == list(range(n // 2 + 1, n + 1)), b['steps/step'][:]
for k in ('loss', 'acc', 'grad_norm', 'lr', 'tokens'):
    x, y = a['steps/' + k][n // 2:], b['steps/' + k][:]
    assert np.array_equal(x, y), (k, x, y)
print('steps', n // 2 + 1, '..', n, 'identical; last loss', b['steps/loss'][-1])
PYEOF
  cmp -s "$WORK/$straight/drafter/model.safetensors" "$WORK/$resumed/drafter/model.safetensors" ||
    fail "the drafter exported after resuming differs from the $straight run's"
}

# dry NAME ARGS...: dflash-train --dry-run as one plain process (no mpirun), --out $WORK/NAME (never created),
# log in $WORK/NAME.log, exit code in $RC
dry() {
  local name=$1
  shift
  set +e
  timeout -k 5 60 "$TRAIN" --dry-run --out "$WORK/$name" "$@" >"$WORK/$name.log" 2>&1
  RC=$?
  set -e
  note "$name: exit $RC"
}

# records_h5 PATH VOCAB N LENGTH: a token dataset of N records of LENGTH tokens (zeros, every loss_mask 1):
# what a dry run reads of --data (its shapes and /offsets) without the cost of real tokens
records_h5() {
  "$PY" - "$@" <<'PYEOF'
import sys, h5py, numpy as np
path, vocab, n, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lengths = np.full(n, length)
with h5py.File(path, 'w') as f:
    f['tokens'] = np.zeros(int(lengths.sum()), np.int32)
    f['loss_mask'] = np.ones(int(lengths.sum()), np.uint8)
    f['offsets'] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    f.attrs['vocab_size'] = vocab
    f.attrs['format_version'] = 1
PYEOF
}

# qwen3_8b_config DIR: a Qwen3-8B target of which only config.json exists (a login node): what a dry run plans
qwen3_8b_config() {
  mkdir -p "$1"
  cat >"$1/config.json" <<'JSON'
{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128, "hidden_act": "silu",
 "hidden_size": 4096, "intermediate_size": 12288, "max_position_embeddings": 40960, "model_type": "qwen3",
 "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
 "rope_theta": 1000000, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 151936}
JSON
}
