#!/usr/bin/env python3
"""transformers + flash-linear-attention reference for bench_hybrid_forward: the Qwen3.6-27B text shape
(64 layers: 48 Gated DeltaNet with 16 key / 48 value heads x 128, 16 gated full-attention layers 24/4 x 256,
partial rotary 0.25, hidden 5120, intermediate 17408, vocab 248320), random bf16 weights, a forward over a
batch of equal-length sequences with every hidden state returned (the capture), SDPA attention, no lm_head.
The Gated DeltaNet layers run flash-linear-attention's chunk_gated_delta_rule when the `fla` package
imports (transformers' kernel-hub wrapper picks it and warns on a fallback; the script refuses to run
without `fla` unless --allow-torch-fallback). Prints bench_hybrid_forward's rows (bench/bench_rows.py: the same
`# ` metadata and columns, --json for JSON lines): case forward, impl hf+fla (hf+torch on the fallback),
peak_gib = torch.cuda.max_memory_allocated.

  PYTHONPATH=/tmp/fla python3 bench/ref_hybrid_forward.py --model 27b --batch 8 --seqlen 4096
  (wheels: pip download --no-deps --only-binary=:all: flash-linear-attention==0.6.0 fla-core==0.6.0, then
   pip install --no-deps --target /tmp/fla *.whl on the GPU machine)
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_rows as br  # noqa: E402

SHAPES = {
    "27b": dict(vocab_size=248320, hidden_size=5120, intermediate_size=17408, num_hidden_layers=64,
                num_attention_heads=24, num_key_value_heads=4, head_dim=256, linear_conv_kernel_dim=4,
                linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                linear_num_value_heads=48),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                 linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="27b", choices=SHAPES)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--allow-torch-fallback", action="store_true")
    br.add_json_flag(ap)
    args = ap.parse_args()
    w = br.Writer("ref_hybrid_forward", json_lines=args.json)

    import transformers
    from transformers.models.qwen3_5 import configuration_qwen3_5 as cq
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mm

    s = SHAPES[args.model]
    L = s["num_hidden_layers"]
    cfg = cq.Qwen3_5TextConfig(
        layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(L)],
        rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25, "rope_type": "default"},
        rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=262144, use_cache=False, **s)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = mm.Qwen3_5ForCausalLM(cfg).model
    model.eval()
    # transformers 5.x wraps the delta-rule functions in its kernel-hub decorator: the torch_* name stays,
    # and the call goes to flash-linear-attention's kernel when the `fla` package imports (it warns when it
    # falls back to the reference PyTorch code, as it does for causal_conv1d, which is not installed).
    import importlib.util
    have_fla = importlib.util.find_spec("fla") is not None
    w.begin(br.device_line(), br.timing_line(args.warmup, args.iters))
    w.meta("model", f"{args.model} (transformers Qwen3_5 text model, random bf16 weights), torch {torch.__version__} "
                    f"transformers {transformers.__version__} attn={model.config._attn_implementation} "
                    f"params={sum(p.numel() for p in model.parameters()) / 1e9:.2f}B")
    w.meta("flash-linear-attention importable", str(have_fla))
    w.meta("batch", f"{args.batch} x {args.seqlen} tokens, every hidden state returned, no lm_head")
    if not have_fla and not args.allow_torch_fallback:
        sys.exit("flash-linear-attention does not import (the torch fallback would be far slower): put the fla wheels "
                 "on PYTHONPATH, or pass --allow-torch-fallback")

    ids = torch.randint(0, s["vocab_size"] - 1, (args.batch, args.seqlen), device="cuda")
    times = []
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        for i in range(args.warmup + args.iters):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            e1.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(e0.elapsed_time(e1))
            del out
    tokens = args.batch * args.seqlen
    ms = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30
    w.columns(br.hybrid_columns())
    w.row(["forward", "hf+fla" if have_fla else "hf+torch", args.model, tokens, args.batch, ms, min(times), max(times),
           None, None, tokens / ms * 1e3, None, peak])


if __name__ == "__main__":
    main()
