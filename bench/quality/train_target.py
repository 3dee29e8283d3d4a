#!/usr/bin/env python3
"""A small *real* target for the quality benchmark: a Qwen3-architecture model (transformers Qwen3ForCausalLM,
random init, seeded) with the real 151,936-token vocabulary, trained for --seconds on the tokenized ShareGPT
conversations, written as an HF checkpoint dflash-train and dflash-eval load.

  python3 bench/quality/train_target.py --data train.h5 --out target --seconds 120 [--hidden 2048|4096]
      [--layers 6] [--tokenizer-dir DIR] [--eval-data heldout.h5]

Shape: head_dim 128 (32 below hidden 1024), hidden / head_dim query heads, min(8, heads) KV heads,
intermediate 3 x hidden, rope_theta 1e6, rms_norm_eps 1e-6 (Qwen3-1.7B's layer at hidden 2048, Qwen3-8B's at
4096); tied embeddings below hidden 4096 (as Qwen3-1.7B/4B), untied at 4096 (as Qwen3-8B). Six layers by
default: the drafter's 2 target layers are then build_target_layer_ids(6, 2) = [1, 3], two distinct layers
(a 4-layer target would give [1, 1]).
Training: next-token LM loss on every token (prompts too), records shuffled per epoch (seeded) and packed
end to end into rows of --seq-len tokens, --batch-tokens tokens per optimizer step in micro-batches of
--micro-batch rows, fp32 weights under bf16 autocast, AdamW (0.9, 0.95, weight decay 0.1, fused on CUDA),
grad clip 1.0, linear warmup over --warmup-steps then cosine to 0.1 x --lr by elapsed time (the run is
time-bounded). Saved in bf16 (save_pretrained: config.json + model.safetensors; eos <|im_end|> 151645, bos
<|endoftext|> 151643), with the tokenizer files of --tokenizer-dir copied in and train_info.json (steps,
tokens, losses, seconds, the weights' sha256).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref as R  # noqa: E402  (read_token_dataset)

QWEN3_VOCAB = 151936
BOS, EOS = 151643, 151645


def model_config(hidden, layers, vocab, max_pos, tie):
    from transformers import Qwen3Config
    head_dim = 128 if hidden >= 1024 else 32
    heads = max(1, hidden // head_dim)
    kv = min(8, heads)
    if tie == "auto":
        tie = "yes" if hidden < 4096 else "no"
    return Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, hidden_act="silu",
        max_position_embeddings=max_pos, rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=(tie == "yes"), attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
        bos_token_id=BOS, eos_token_id=EOS, initializer_range=0.02)


def packed_rows(records, seq_len, seed):
    """Endless rows of seq_len tokens: records shuffled per epoch (seeded), concatenated, cut."""
    epoch = 0
    buf = np.zeros(0, dtype=np.int64)
    while True:
        rng = np.random.default_rng(seed + epoch)
        for i in rng.permutation(len(records)):
            buf = np.concatenate([buf, records[i]])
            while len(buf) >= seq_len:
                yield buf[:seq_len], epoch
                buf = buf[seq_len:]
        epoch += 1


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def heldout_loss(model, records, seq_len, rows, device, dtype):
    it = packed_rows(records, seq_len, 12345)
    x = torch.from_numpy(np.stack([next(it)[0] for _ in range(rows)])).to(device)
    losses = []
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        for i in range(0, rows, 4):
            losses.append(float(model(input_ids=x[i:i + 4], labels=x[i:i + 4]).loss))
    return sum(losses) / len(losses)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="token dataset (docs/data.md)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=120.0, help="training time (wall, CUDA-synchronised steps)")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps too (0 = no limit)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=QWEN3_VOCAB)
    ap.add_argument("--tie-embeddings", default="auto", choices=["auto", "yes", "no"])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-tokens", type=int, default=65536)
    ap.add_argument("--micro-batch", type=int, default=16, help="rows per forward")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup-steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-dir", default="", help="tokenizer files to copy into --out")
    ap.add_argument("--eval-data", default="", help="held-out token dataset: LM loss before and after")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()

    from transformers import Qwen3ForCausalLM
    dev = torch.device(args.device)
    amp = torch.bfloat16 if dev.type == "cuda" else torch.float32
    torch.manual_seed(args.seed)
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = model_config(args.hidden, args.layers, args.vocab, 40960, args.tie_embeddings)
    cfg._attn_implementation = "sdpa"
    with torch.device(dev):
        model = Qwen3ForCausalLM(cfg)
    model.train()
    nparams = sum(p.numel() for p in model.parameters())
    recs = [x.numpy() for x, _ in R.read_token_dataset(args.data)]
    ntok = sum(len(r) for r in recs)
    print(f"[target] Qwen3 hidden {args.hidden}, {args.layers} layers, {cfg.num_attention_heads}/{cfg.num_key_value_heads} "
          f"heads of {cfg.head_dim}, intermediate {cfg.intermediate_size}, vocab {args.vocab}, tied "
          f"{cfg.tie_word_embeddings}: {nparams / 1e6:.1f} M parameters; data {len(recs)} records, {ntok} tokens",
          flush=True)
    ev = [x.numpy() for x, _ in R.read_token_dataset(args.eval_data)] if args.eval_data else None
    ev_rows = 16 if dev.type == "cuda" else 4
    loss0 = heldout_loss(model, ev, args.seq_len, ev_rows, dev, amp) if ev else None
    if loss0 is not None:
        print(f"[target] held-out LM loss before training {loss0:.4f}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=dev.type == "cuda")
    rows_per_step = max(1, args.batch_tokens // args.seq_len)
    micro = min(args.micro_batch, rows_per_step)
    it = packed_rows(recs, args.seq_len + 1, args.seed)
    elapsed, step, tokens, epoch = 0.0, 0, 0, 0
    log = []
    while elapsed < args.seconds and (args.max_steps <= 0 or step < args.max_steps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        frac = min(1.0, elapsed / args.seconds)
        lr = args.lr * (step + 1) / args.warmup_steps if step < args.warmup_steps else \
            args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        total = 0.0
        for m0 in range(0, rows_per_step, micro):
            rows = []
            for _ in range(min(micro, rows_per_step - m0)):
                r, epoch = next(it)
                rows.append(r)
            x = torch.from_numpy(np.stack(rows)).to(dev, non_blocking=True)
            with torch.autocast(dev.type, dtype=amp, enabled=amp != torch.float32):
                loss = model(input_ids=x, labels=x).loss  # HF shifts the labels: next-token loss
            (loss * (len(rows) / rows_per_step)).backward()
            total += float(loss.detach()) * len(rows) / rows_per_step
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elapsed += time.perf_counter() - t0
        step += 1
        tokens += rows_per_step * args.seq_len
        log.append((step, elapsed, total))
        if step % args.log_every == 0 or step == 1:
            print(f"[target] step {step} {elapsed:.1f}s loss {total:.4f} lr {lr:.2e} grad_norm {float(gn):.2f} "
                  f"epoch {epoch} ({tokens / max(elapsed, 1e-9) / 1e3:.1f} K tok/s)", flush=True)
    model.eval()
    loss1 = heldout_loss(model, ev, args.seq_len, ev_rows, dev, amp) if ev else None
    if loss1 is not None:
        print(f"[target] held-out LM loss after training {loss1:.4f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(args.out)
    if args.tokenizer_dir:
        for name in sorted(os.listdir(args.tokenizer_dir)):
            src = os.path.join(args.tokenizer_dir, name)
            if os.path.isfile(src) and name != "config.json" and not name.endswith(".safetensors"):
                shutil.copy(src, os.path.join(args.out, name))
    weights = sorted(n for n in os.listdir(args.out) if n.endswith(".safetensors"))
    h = hashlib.sha256()
    for n in weights:
        h.update(file_sha256(os.path.join(args.out, n)).encode())
    info = {"hidden": args.hidden, "layers": args.layers, "params": nparams, "tied": cfg.tie_word_embeddings,
            "steps": step, "tokens": tokens, "seconds": elapsed, "epochs": epoch, "seed": args.seed,
            "loss_first": log[0][2] if log else None, "loss_last10": sum(l[2] for l in log[-10:]) / max(1, len(log[-10:])),
            "heldout_loss_before": loss0, "heldout_loss_after": loss1, "weights_sha256": h.hexdigest(),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "args": vars(args)}
    with open(os.path.join(args.out, "train_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    print(f"[target] saved {args.out}: {step} steps, {tokens} tokens, {elapsed:.1f} s, loss {info['loss_first']:.3f} -> "
          f"{info['loss_last10']:.3f}", flush=True)


if __name__ == "__main__":
    main()
