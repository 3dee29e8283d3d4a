#!/usr/bin/env bash
# A dry run works anywhere: one plain process (no mpirun), no GPU (this machine has none, and the CPU build
# has no CUDA backend), no weights, planning the world --ranks / --nodes --gpus-per-node name and checking
# each rank's fixed memory against the GPU --gpu names:
#  - the tiny target, 8 ranks of 7-1 on CUDA for an H200: every rank's role, GPU and memory, all fit;
#  - a Qwen3-8B-shaped target of which only config.json exists (a login node), with the recipe's options and
#    2000 held-out conversations (4.6 M tokens): the weights from config.json, the eval sample it will use,
#    all fit an H200; a 40 GiB GPU is reported (the drafter rank does not fit: exit 2), a 10 GiB one for both;
#    without --gpu, this node's GPU 0 as NVML reports it (the tests' fake NVML library);
#  - two nodes of 4 (3-1): the roles on each node;
#  - under mpirun, --backend cuda on a machine without a GPU plans instead of exiting 5;
#  - one process without --ranks names the flag when the world does not fit; the flags need --dry-run.
source "$(dirname "$0")/lib.sh"
tiny=$(tiny_dir)

# row NAME RANK: the rank's row of the topology table ("rank node local role host device memory...")
row() { sed -n "s/^\[dflash\] *$2  .*/&/p" "$WORK/$1.log" | sed 's/^\[dflash\] *//'; }
expect_row() {  # expect_row NAME RANK NODE LOCAL ROLE DEVICE
  local r
  r=$(row "$1" "$2" | awk '{print $1, $2, $3, $4, $6}')
  [ "$r" = "$2 $3 $4 $5 $6" ] || fail "$1: rank $2's row is '$(row "$1" "$2")', expected node $3 local $4 $5 $6"
}

# ---- the tiny target: 8 ranks of 7-1 on CUDA, planned for an H200 ------------------------------------
dry tiny8 --ranks 8 --topology 7-1 --backend cuda --gpu h200 --target "$tiny/target" --data "$tiny/data.h5" \
  --draft-layers 1 --token-budget 512
expect_rc 0 tiny8
expect_log tiny8 "topology 7-1 on 1 node(s) x 8 rank(s), backend cuda: 7 target(s), 1 drafter(s), 0 idle (planned here by --ranks/--nodes: one process, no mpirun, no GPU)"
for r in 0 1 2 3 4 5 6; do expect_row tiny8 $r 0 $r target gpu$r; done
expect_row tiny8 7 0 7 drafter gpu7
expect_log tiny8 "memory check against --gpu h200 (NVIDIA H200, 140.4 GiB as its driver reports it): target rank(s) 0-6: "
expect_log tiny8 "drafter rank(s) 7: "
grep -q "does not fit\|does NOT fit" "$WORK/tiny8.log" && fail "tiny8: the tiny model does not fit an H200?"
[ ! -e "$WORK/tiny8" ] || fail "tiny8: the dry run created --out"

# ---- a Qwen3-8B shape: only its config.json, the recipe's options, 2000 held-out conversations ---------
mkdir -p "$WORK/qwen3-8b"
cat >"$WORK/qwen3-8b/config.json" <<'EOF'
{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
 "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
 "intermediate_size": 12288, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
 "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
 "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": false,
 "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
 "vocab_size": 151936}
EOF
"$PY" - "$WORK/heldout.h5" <<'PYEOF'
import sys, h5py, numpy as np
rng = np.random.default_rng(31)
lengths = rng.integers(500, 4100, size=2000)  # conversations of <= 3072 + ... tokens: ~2300 on average
lengths = np.minimum(lengths, 3072)
lengths[:1000] += (4_600_000 - int(lengths.sum())) // 1000  # 4.6 M tokens in all
n = int(lengths.sum())
with h5py.File(sys.argv[1], 'w') as f:
    f['tokens'] = np.zeros(n, np.int32)
    f['loss_mask'] = np.ones(n, np.uint8)
    f['offsets'] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    f.attrs['vocab_size'] = 151936
    f.attrs['format_version'] = 1
print(len(lengths), n)
PYEOF
# (--data of the target's vocabulary: a dry run refuses one tokenized for another, as the job does)
records_h5 "$WORK/q8data.h5" 151936 64 512
# At the reference trainers' anchor density (3072 a batch; the recipe draws 2048 per batch): the memory figures
# below are that cap's.
Q8=(--config "$DFLASH_SRC/jobs/recipes/qwen3-8b.cfg" --anchors-per-record 512 --max-anchors 3072
    --target "$WORK/qwen3-8b" --data "$WORK/q8data.h5" --eval-data "$WORK/heldout.h5" --ranks 8 --topology 7-1)
dry q8 "${Q8[@]}" --gpu h200
expect_rc 0 q8
for r in 0 3 6; do expect_row q8 $r 0 $r target gpu$r; done
expect_row q8 7 0 7 drafter gpu7
expect_log q8 "weights 15.3 GiB from config.json's 8.19 B parameters x 2 B (no safetensors in $WORK/qwen3-8b)"
expect_log q8 "block activations for --max-anchors 3072 x 16 rows 39.9 GiB = 13.3 MiB per anchor"
# The recipe's held-out set at the 8B shape: a sample within one drafter's 2 GiB (52,428 tokens at 40 KiB).
expect_log q8 "[dflash] eval: $WORK/heldout.h5 has 2000 records (4.6 M tokens); using "
expect_log q8 "a fixed sample that fits --eval-max-tokens auto (52.4 K tokens: 2 GiB of eval features per drafter at 40 KiB per token, this drafter's shape)"
expect_log q8 "memory check against --gpu h200 (NVIDIA H200, 140.4 GiB as its driver reports it): target rank(s) 0-6: 16.5 GiB fixed"
grep -q "does not fit\|does NOT fit" "$WORK/q8.log" && fail "q8: the recipe does not fit an H200?"
dry q8small "${Q8[@]}" --gpu 40
expect_rc 2 q8small
[ "$(row q8small 7 | awk '{print $4, $9, $10, $11}')" = "drafter does not fit" ] || fail "q8small: rank 7 not reported: $(row q8small 7)"
row q8small 0 | grep -q "does not fit" && fail "q8small: a target rank reported (16.5 GiB fit 40 GiB)"
expect_log q8small "target rank(s) 0-6: 16.5 GiB fixed, 23.5 GiB left for the activations; drafter rank(s) 7: "
expect_log q8small "the plan does not fit --gpu 40 (40.0 GiB): drafter rank(s) 7 need "
expect_log q8small "HINT: the drafter: lower --max-anchors"
dry q8tiny "${Q8[@]}" --gpu 10
expect_rc 2 q8tiny
expect_log q8tiny "the plan does not fit --gpu 10 (10.0 GiB): target rank(s) 0-6 need 16.5 GiB of fixed memory"

# Without --gpu: this node's GPU 0 through NVML (the fake library of the tests: 80 GiB).
FAKE="$DFLASH_BIN/tests/libdflash_fake_nvml.so"
[ -f "$FAKE" ] || fail "no $FAKE (built with dflash_unit_tests)"
DFLASH_TEST_NVML_LIBRARY="$FAKE" dry q8nvml "${Q8[@]}"
expect_rc 0 q8nvml
expect_log q8nvml "memory check against this node's GPU 0 (NVML: 81920 MiB): target rank(s) 0-6: 16.5 GiB fixed"
DFLASH_TEST_NVML_LIBRARY="$FAKE" dry q8nvmlbig "${Q8[@]}" --max-anchors 6000
expect_rc 2 q8nvmlbig
expect_log q8nvmlbig "the plan does not fit this node's GPU 0 (NVML: 81920 MiB): drafter rank(s) 7 need"

# ---- two nodes of 4 ranks, 3-1 -----------------------------------------------------------------------
dry nodes --config "$DFLASH_SRC/jobs/recipes/qwen3-8b.cfg" --target "$WORK/qwen3-8b" --data "$WORK/q8data.h5" \
  --nodes 2 --gpus-per-node 4 --topology 3-1 --gpu b200
expect_rc 0 nodes
expect_log nodes "topology 3-1 on 2 node(s) x 4 rank(s), backend cuda: 6 target(s), 2 drafter(s), 0 idle"
expect_row nodes 3 0 3 drafter gpu3
expect_row nodes 4 1 0 target gpu0
expect_row nodes 7 1 3 drafter gpu3
expect_log nodes "the 2 drafters allreduce their gradients; rank 3 (the first drafter) writes metrics.h5"
expect_log nodes "memory check against --gpu b200 (NVIDIA B200, 179.1 GiB as its driver reports it): target rank(s) 0-2,4-6: "

# ---- under mpirun: --backend cuda without a GPU plans (no exit 5) --------------------------------------
run_job mpi 8 60 --topology 7-1 --backend cuda --target "$WORK/qwen3-8b" --data "$WORK/q8data.h5" --dry-run
expect_rc 0 mpi
expect_log mpi "topology 7-1 on 1 node(s) x 8 rank(s), backend cuda: 7 target(s), 1 drafter(s), 0 idle"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  expect_log mpi "8 rank(s) see no CUDA device: their GPU is assumed to be the node-local rank's"
  expect_row mpi 5 0 5 target gpu5
  expect_log mpi "memory check: none (no --gpu, and NVML sees no GPU here): give --gpu"
fi
run_job mpigpu 8 60 --topology 7-1 --backend cuda --target "$WORK/qwen3-8b" --data "$WORK/q8data.h5" --dry-run --gpu 10
expect_rc 2 mpigpu
expect_log mpigpu "the plan does not fit --gpu 10 (10.0 GiB): target rank(s) 0-6 need"

# ---- what a single process without --ranks says; the flags belong to a dry run -----------------------
dry alone --topology 7-1 --backend cuda --target "$WORK/qwen3-8b" --data "$WORK/q8data.h5"
expect_rc 4 alone
expect_log alone "--topology 7-1 needs 8 ranks per node but 1 run per node"
expect_log alone "HINT: a dry run plans another world in one process, without mpirun: --ranks N, or --nodes N --gpus-per-node G"
set +e
"$TRAIN" --ranks 8 --topology 7-1 --target "$WORK/qwen3-8b" --data "$tiny/data.h5" --out "$WORK/job" >"$WORK/nodry.log" 2>&1
RC=$?
set -e
expect_rc 2 nodry
expect_log nodry "--ranks, --nodes and --gpus-per-node plan a --dry-run's world"
dry cpugpu --ranks 2 --backend cpu --gpu h200 --target "$tiny/target" --data "$tiny/data.h5"
expect_rc 2 cpugpu
expect_log cpugpu "--gpu h200 with --backend cpu"
# Without --backend (auto), a dry run naming --gpu plans the CUDA job, and says why.
dry autogpu --ranks 2 --gpu h200 --draft-layers 1 --target "$tiny/target" --data "$tiny/data.h5"
expect_rc 0 autogpu
expect_log autogpu "[dflash] backend: cuda, chosen by --backend auto: --gpu names the GPU this dry run plans for"
dry badgpu --ranks 2 --backend cuda --gpu a100 --target "$tiny/target" --data "$tiny/data.h5"
expect_rc 2 badgpu
expect_log badgpu "HINT: give h100, h200, b200 or rtx-pro-6000, or the GPU's memory in GiB"
echo "PASS"
