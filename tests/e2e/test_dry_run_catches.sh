#!/usr/bin/env bash
# The dry run catches what the job would die of at startup (issue 44 item 5), so a Slurm job does not queue
# for hours to fail in a second; each with the job's own message and exit code, from config.json and the
# dataset's attributes and /offsets only:
#  - --data tokenized for another vocabulary (exit 3);
#  - --draft-layers above the target's layer count (exit 2);
#  - records longer than --token-budget under --long-record error (exit 2);
#  - a drafter that does not fit its GPU, where --optimizer-state bf16 makes it fit: the HINT says so (exit 2);
#  - --report-to wandb where dflash-report's Python cannot import wandb (exit 2), and the version where it can.
source "$(dirname "$0")/lib.sh"

qwen3_8b_config "$WORK/qwen3-8b"  # config.json only, as on a login node
records_h5 "$WORK/ok.h5" 151669 50 3072       # the Qwen3 tokenizer's ids: 267 padding rows, as the job allows
records_h5 "$WORK/othervocab.h5" 32000 50 3072
T8=(--target "$WORK/qwen3-8b" --ranks 8 --topology 3-5 --backend cuda --gpu h200)

dry fine "${T8[@]}" --data "$WORK/ok.h5" --token-budget 16384
expect_rc 0 fine

dry vocab "${T8[@]}" --data "$WORK/othervocab.h5" --token-budget 16384
expect_rc 3 vocab
expect_log vocab "was tokenized for a vocabulary of 32000 ids (its vocab_size attribute), the target has 151936 embedding rows"

dry layers "${T8[@]}" --data "$WORK/ok.h5" --token-budget 16384 --draft-layers 40
expect_rc 2 layers
expect_log layers "--draft-layers 40 is more than the target's 36 layers"

dry long "${T8[@]}" --data "$WORK/ok.h5" --token-budget 2048
expect_rc 2 long
expect_log long "--token-budget 2048 is smaller than record 0 of $WORK/ok.h5 (3072 tokens), and --long-record is error"
dry longcut "${T8[@]}" --data "$WORK/ok.h5" --token-budget 2048 --long-record cut
expect_rc 0 longcut

# The 8B recipe's drafter at the reference trainers' density (3072 anchors a batch: about 68 GiB with the fp32
# state, 8 B/param less with bf16) on a 64 GiB GPU.
REF_DENSITY=(--anchors-per-record 512 --max-anchors 3072)
dry bf16hint --config "$DFLASH_SRC/jobs/recipes/qwen3-8b.cfg" "${T8[@]}" "${REF_DENSITY[@]}" --data "$WORK/ok.h5" --gpu 64
expect_rc 2 bf16hint
expect_log bf16hint "HINT: the drafter: --optimizer-state bf16 makes it fit"
dry bf16 --config "$DFLASH_SRC/jobs/recipes/qwen3-8b.cfg" "${T8[@]}" "${REF_DENSITY[@]}" --data "$WORK/ok.h5" --gpu 64 \
  --optimizer-state bf16
expect_rc 0 bf16

# --report-to wandb: dflash-report answers --check-wandb as its export would (this python, else the project venv).
REPORT="$DFLASH_SRC/tools/dflash-report"
if "$REPORT" --check-wandb >/dev/null 2>&1; then
  dry wandb "${T8[@]}" --data "$WORK/ok.h5" --token-budget 16384 --report-to csv,wandb
  expect_rc 0 wandb
  expect_log wandb "[dflash] --report-to wandb: wandb "
else
  note "wandb importable nowhere here: the positive case is skipped"
fi
if ! python3 -c 'import wandb' >/dev/null 2>&1; then  # (dflash-report's own python: #!/usr/bin/env python3)
  DFLASH_VENV="$WORK/no-venv" dry nowandb "${T8[@]}" --data "$WORK/ok.h5" --token-budget 16384 --report-to csv,wandb
  expect_rc 2 nowandb
  expect_log nowandb "--report-to wandb, but "
  expect_log nowandb "cannot log to W&B: dflash-report: error: --wandb needs the Python package wandb"
  expect_log nowandb "HINT: install wandb for it"
else
  note "wandb importable without the venv: the refusal is not tried"
fi
echo "PASS"
