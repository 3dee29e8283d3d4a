#!/usr/bin/env bash
# --eval-max-tokens: an --eval-data file whose features would not fit the drafters' hosts is evaluated on a
# fixed sample of its whole records instead of being refused (the recipe's 2000 held-out conversations at the
# Qwen3-8B shape). The tiny model's features are small, so the test hook --inject-eval-budget-bytes shrinks
# the 2 GiB per drafter to 128 KiB = 512 tokens of the tiny 1-layer drafter's 256 B per token (float32):
#  - auto: the job runs (the old code refused such a set with exit 2), prints the sample line, and writes
#    /eval rows of the sample (its records and tokens);
#  - --dry-run prints the same decision;
#  - a resume, also one on another split, evaluates the same sample;
#  - a given --eval-max-tokens within the drafters' budgets picks a larger sample; one above them is refused
#    (exit 2, the HINT names the budget) before --out is touched.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)
split_eval_set "$tiny/data.h5" "$WORK/train.h5" "$WORK/eval.h5" 40
BUDGET=(--inject-eval-budget-bytes 131072)
DATA=(--data "$WORK/train.h5" --eval-data "$WORK/eval.h5" "${BUDGET[@]}")
sample_line() { grep -F "[dflash] eval: $WORK/eval.h5 has 40 records" "$WORK/$1.log" || fail "$1: no sample line"; }

# ---- auto: the sample fits one drafter's budget --------------------------------------------------------
run_job auto 3 300 --topology 1-2 "${DATA[@]}" --max-steps 8 --checkpoint-every 4
expect_rc 0 auto
expect_log auto "a fixed sample that fits --eval-max-tokens auto (512 tokens: 128 KiB of eval features per drafter at 256 B per token, this drafter's shape); give --eval-max-tokens to choose"
LINE=$(sample_line auto)
note "auto: $LINE"
R=$(sed -n 's/.*; using \([0-9]*\) records (\([0-9]*\) tokens).*/\1/p' <<<"$LINE")
T=$(sed -n 's/.*; using \([0-9]*\) records (\([0-9]*\) tokens).*/\2/p' <<<"$LINE")
[ -n "$R" ] && [ -n "$T" ] && [ "$R" -lt 40 ] && [ "$T" -le 512 ] || fail "auto: the sample ($R records, $T tokens) is not a part of the set within 512 tokens"
expect_log auto "[dflash] eval: $WORK/eval.h5: $R records, $T tokens in"
h5check "$WORK/auto/metrics.h5" "list(f['eval/step'][:]) == [4, 8]"
h5check "$WORK/auto/metrics.h5" "all(f['eval/seqs'][:] == $R) and all(f['eval/tokens'][:] == $T)"
grep -qE "^\[eval\] step=8 loss=[0-9.]+ .*\($R seqs, $T tok, " "$WORK/auto.log" || fail "auto: no [eval] line of the sample"

# ---- the dry run says the same ---------------------------------------------------------------------------
run_job dry 3 60 --topology 1-2 "${DATA[@]}" --dry-run
expect_rc 0 dry
[ "$(sample_line dry)" = "$LINE" ] || fail "dry: the dry run's sample line differs from the job's: $(sample_line dry)"
expect_log dry "[dflash] eval: $WORK/eval.h5: $R records, $T tokens in"

# ---- resumes keep the sample: on the same split (the same rows), and on another split -------------------
cp -r "$WORK/auto" "$WORK/resumed"
run_job resumed 3 300 --topology 1-2 "${DATA[@]}" --max-steps 8 --checkpoint-every 4 \
  --resume "$WORK/resumed/checkpoints/step-00000004"
expect_rc 0 resumed
[ "$(sample_line resumed)" = "$LINE" ] || fail "resumed: another sample: $(sample_line resumed)"
"$PY" - "$WORK/auto/metrics.h5" "$WORK/resumed/metrics.h5" <<'PYEOF' || fail "the resumed run's /eval differs from the straight run's"
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], 'r')['eval'], h5py.File(sys.argv[2], 'r')['eval']
assert list(b['step'][:]) == [4, 8], b['step'][:]
for k in ('seqs', 'tokens', 'anchors'):
    assert np.array_equal(a[k][:], b[k][:]), (k, a[k][:], b[k][:])
PYEOF
cp -r "$WORK/auto" "$WORK/resplit"
run_job resplit 2 300 --topology 1-1 "${DATA[@]}" --max-steps 8 --checkpoint-every 4 \
  --resume "$WORK/resplit/checkpoints/step-00000004"
expect_rc 0 resplit
[ "$(sample_line resplit)" = "$LINE" ] || fail "resplit: another sample on 1-1: $(sample_line resplit)"
h5check "$WORK/resplit/metrics.h5" "list(f['eval/step'][:]) == [4, 8] and all(f['eval/seqs'][:] == $R) and all(f['eval/tokens'][:] == $T)"

# ---- a given --eval-max-tokens: up to the two drafters' budgets; more is refused -------------------------
run_job given 3 300 --topology 1-2 "${DATA[@]}" --max-steps 4 --eval-max-tokens 1000
expect_rc 0 given
expect_log given "a fixed sample that fits --eval-max-tokens 1000"
G=$(sed -n 's/.*; using \([0-9]*\) records .*/\1/p' <<<"$(sample_line given)")
[ -n "$G" ] && [ "$G" -gt "$R" ] || fail "given: --eval-max-tokens 1000 took $G records, auto $R"
h5check "$WORK/given/metrics.h5" "all(f['eval/seqs'][:] == $G) and all(f['eval/tokens'][:] <= 1000)"
run_job toomuch 3 60 --topology 1-2 "${DATA[@]}" --eval-max-tokens 2000
expect_rc 2 toomuch
expect_log toomuch "--eval-max-tokens 2000 is more than the drafters can keep: 128 KiB of eval features per drafter at 256 B per token (this drafter's shape) hold 512 tokens per drafter, 1024 over 2 drafter(s)"
expect_log toomuch "HINT: give --eval-max-tokens 1024 or less, or auto (512 tokens"
[ ! -e "$WORK/toomuch" ] || fail "toomuch: the refused start created --out"
run_job drytoomuch 3 60 --topology 1-2 "${DATA[@]}" --eval-max-tokens 2000 --dry-run
expect_rc 2 drytoomuch
expect_log drytoomuch "--eval-max-tokens 2000 is more than the drafters can keep"

# ---- without the hook the whole set fits: no sample, as before ----------------------------------------
run_job whole 3 60 --topology 1-2 --data "$WORK/train.h5" --eval-data "$WORK/eval.h5" --dry-run
expect_rc 0 whole
expect_log whole "[dflash] eval: $WORK/eval.h5: 40 records"
grep -qF "a fixed sample" "$WORK/whole.log" && fail "whole: a sample of a set that fits"
echo "PASS"
