#!/usr/bin/env python3
"""PyTorch/transformers reference for bench_target_forward: the same Qwen3 shape, random bf16 weights,
a forward over a batch of equal-length sequences with every hidden state returned (the capture), SDPA
attention, no lm_head. Prints the C++ bench's rows (bench/bench_rows.py: the same `# ` metadata and
columns, --json for JSON lines): case forward, impl hf-sdpa, mem_gib = torch.cuda.max_memory_allocated.

  python3 bench/ref_target_forward.py --model 8b --batch 4 --seqlen 4096
"""
import argparse
import os
import statistics
import sys

import torch
from transformers import Qwen3Config, Qwen3Model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_rows as br  # noqa: E402

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8),
    "32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                num_key_value_heads=8),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="8b", choices=SHAPES)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    br.add_json_flag(ap)
    args = ap.parse_args()
    w = br.Writer("ref_target_forward", json_lines=args.json)

    cfg = Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, use_cache=False, **SHAPES[args.model])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3Model(cfg)
    model.eval()
    w.begin(br.device_line(), br.timing_line(args.warmup, args.iters))
    w.meta("model", f"{args.model} (transformers Qwen3Model, random bf16 weights), torch {torch.__version__} "
                    f"attn={model.config._attn_implementation} params={sum(p.numel() for p in model.parameters()) / 1e9:.2f}B")
    w.meta("batch", f"{args.batch} x {args.seqlen} tokens, every hidden state returned, no lm_head")

    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seqlen), device="cuda")
    T = args.batch * args.seqlen
    times = []
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
    L, H, I = cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, 128
    linear = L * (H * nh * hd * 2 + H * nkv * hd * 2 + 3 * H * I)
    pairs = args.batch * args.seqlen * (args.seqlen + 1) / 2
    flop = 2 * linear * T + 4 * nh * hd * pairs * L
    t = statistics.median(times) / 1e3
    w.columns(br.forward_columns())
    w.row(["forward", "hf-sdpa", args.model, T, args.batch, t * 1e3, min(times), None, T / t, flop / t / 1e12, None,
           torch.cuda.max_memory_allocated() / 2**30])


if __name__ == "__main__":
    main()
