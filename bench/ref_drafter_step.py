#!/usr/bin/env python3
"""PyTorch reference for the DFlash drafter training step, timed the way bench/drafter_bench.cpp times ours.

The step follows the recipe of /work/shared/golden/README.md (the one gen_golden.py ran through z-lab's
DFlashDraftModel): context features hidden_norm(fc(concat(target layers))) as extra keys/values of every
layer, blocks [anchor, MASK x (B-1)] embedded with the frozen target embedding, q/k norms, neox RoPE
(context positions 0..T-1, block n at a_n..a_n+B-1), GQA attention with the DFlash anchor mask (context
j < anchor, own block bidirectional; sliding layers: j >= a + k - (W-1) and block offsets <= k; each layer
its own type's mask) through one of two paths (--attention):
  sdpa  F.scaled_dot_product_attention with a dense boolean mask (kv heads repeated);
  flex  torch.nn.attention.flex_attention, compiled, with a create_block_mask block mask built from the same
        rule (enable_gqa: kv heads not repeated) -- the strongest PyTorch path for this sparse mask;
SwiGLU MLP, final norm, frozen lm_head. Loss: CE (or KL against softmax(lm_head(final_norm[a+k-1]))) with
weights exp(-(k-1)/gamma) over positions k >= 1, lm_head + loss in chunks of 128 blocks under activation
checkpointing (logits never exist for more than one chunk), global normalisation, clip_grad_norm_(1.0),
torch.optim.AdamW(fused=True). Mixed precision: fp32 parameters and AdamW state, bf16 autocast compute,
fp32 RMSNorm (as HF Qwen3RMSNorm). Random weights and features; one packed sequence of T tokens.

  python3 bench/ref_drafter_step.py --model 8b --objective ce [--attention flex]
  python3 bench/ref_drafter_step.py --model 27b --context 4096
  python3 bench/ref_drafter_step.py --model 8b --attention flex --recompute-loss-chunks off   # the strongest that fits
Prints drafter_bench's rows (bench/bench_rows.py: the same `# ` metadata and columns, --json for JSON lines):
case step, impl torch-<attention>[-keep] (-keep: --recompute-loss-chunks off), ms the median of --steps after
--warmup (CUDA events), mem_gib torch.cuda.max_memory_allocated over the whole run (optimizer state included).
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_rows as br  # noqa: E402

SHAPES = {
    # hidden, intermediate, heads, kv heads, head dim, vocab, layer types (W = sliding window)
    "8b": dict(H=4096, I=12288, nh=32, nkv=8, hd=128, V=151936, types=["full"] * 5, W=0),
    "27b": dict(H=5120, I=17408, nh=24, nkv=4, hd=256, V=248320, types=["sliding"] * 4 + ["full"], W=2048),
}


class RMSNorm(nn.Module):
    def __init__(self, n, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(dt)


def rope(x, cos, sin):  # x [L, heads, hd]; cos/sin [L, hd]
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


class Layer(nn.Module):
    def __init__(self, s):
        super().__init__()
        H, I, nh, nkv, hd = s["H"], s["I"], s["nh"], s["nkv"], s["hd"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.input_layernorm = RMSNorm(H)
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd)
        self.k_norm = RMSNorm(hd)
        self.post_attention_layernorm = RMSNorm(H)
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x, th, rq, rc, mask, attention="sdpa"):
        NB, T = x.shape[0], th.shape[0]
        xn = self.input_layernorm(x)
        q = rope(self.q_norm(self.q_proj(xn).view(NB, self.nh, self.hd)), *rq)
        kb = rope(self.k_norm(self.k_proj(xn).view(NB, self.nkv, self.hd)), *rq)
        kc = rope(self.k_norm(self.k_proj(th).view(T, self.nkv, self.hd)), *rc)
        k = torch.cat([kc, kb], 0)
        v = torch.cat([self.v_proj(th), self.v_proj(xn)], 0).view(T + NB, self.nkv, self.hd)
        if attention == "flex":
            o = flex_attention_compiled()(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          block_mask=mask, enable_gqa=True)
        else:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1).transpose(0, 1)[None]
            v = v.repeat_interleave(rep, dim=1).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask)
        x = x + self.o_proj(o[0].transpose(0, 1).reshape(NB, self.nh * self.hd))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Drafter(nn.Module):
    def __init__(self, s, K=5):
        super().__init__()
        self.fc = nn.Linear(K * s["H"], s["H"], bias=False)
        self.hidden_norm = RMSNorm(s["H"])
        self.layers = nn.ModuleList([Layer(s) for _ in range(5)])
        self.norm = RMSNorm(s["H"])


def rope_tables(pos, hd, theta=1e6):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=pos.device, dtype=torch.float32) / hd)
    ang = pos.float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)  # HF casts the tables to x.dtype


def dense_mask(anchors, T, B, W, dev):
    """[N*B, T + N*B] bool: True = visible. One packed sequence starting at 0."""
    N = anchors.shape[0]
    o = torch.arange(B, device=dev)
    a = anchors[:, None].expand(N, B).reshape(-1)           # anchor of each row
    ko = o[None].expand(N, B).reshape(-1)                   # row offset k
    j = torch.arange(T, device=dev)[None]
    ctx = j < a[:, None]
    if W > 0:
        ctx &= j >= (a + ko - (W - 1))[:, None]
    blk_of_row = torch.arange(N * B, device=dev) // B
    jb = torch.arange(N * B, device=dev)
    blk = blk_of_row[:, None] == (jb // B)[None]
    if W > 0:
        blk &= (jb % B)[None] <= ko[:, None]
    return torch.cat([ctx, blk], 1)


_FLEX = None


def flex_attention_compiled():
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention
        _FLEX = torch.compile(flex_attention)
    return _FLEX


def flex_block_mask(anchors, T, B, W, dev):
    """The dense_mask rule as a flex_attention BlockMask over [N*B queries, T + N*B keys]."""
    from torch.nn.attention.flex_attention import create_block_mask
    N = anchors.shape[0]

    def mask_mod(b, h, q, kv):
        n, ko = q // B, q % B
        a = anchors[n]
        ctx = kv < a
        if W > 0:
            ctx = ctx & (kv >= a + ko - (W - 1))
        jb = kv - T
        blk = (kv >= T) & (jb // B == n)
        if W > 0:
            blk = blk & (jb % B <= ko)
        return ctx | blk

    return create_block_mask(mask_mod, None, None, N * B, T + N * B, device=dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="8b", choices=sorted(SHAPES))
    ap.add_argument("--objective", default="ce", choices=["ce", "kl"])
    ap.add_argument("--context", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--chunk-blocks", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "flex"])
    ap.add_argument("--recompute-loss-chunks", default="on", choices=["on", "off"],
                    help="on: lm_head + loss chunks under activation checkpointing (logits of one chunk at a time, "
                         "computed twice); off: every chunk's logits kept for the backward (faster where memory allows)")
    br.add_json_flag(ap)
    args = ap.parse_args()
    s = SHAPES[args.model]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    T, N, B, H, V, K, gamma = args.context, args.anchors, 16, s["H"], s["V"], 5, 7.0
    W = s["W"]
    model = Drafter(s, K).to(dev)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" not in n:
                p.normal_(0.0, 0.02)
    embed = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16)
    lm_head = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16)
    features = torch.randn(K, T, H, device=dev).to(torch.bfloat16)
    final_norm = torch.randn(T, H, device=dev).to(torch.bfloat16)
    tokens = torch.randint(0, 150000, (T,), device=dev)
    anchors = torch.randperm(T - 1, device=dev)[:N].sort().values
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, fused=True)

    # fixed per-batch inputs
    k = torch.arange(B, device=dev)
    pos_blk = (anchors[:, None] + k[None]).reshape(-1)
    rq = rope_tables(pos_blk, s["hd"])
    rc = rope_tables(torch.arange(T, device=dev), s["hd"])
    make_mask = flex_block_mask if args.attention == "flex" else dense_mask
    masks = {"full": make_mask(anchors, T, B, 0, dev)}
    masks["sliding"] = make_mask(anchors, T, B, W, dev) if W > 0 else masks["full"]
    ids = torch.full((N, B), 151669 if V == 151936 else 248070, device=dev)
    ids[:, 0] = tokens[anchors]
    lab_pos = anchors[:, None] + k[None]                    # [N, B]
    valid = (k[None] >= 1) & (lab_pos < T)
    w_all = torch.exp(-(k.float() - 1) / gamma)[None].expand(N, B)
    row_idx = torch.nonzero(valid.reshape(-1)).squeeze(1)
    labels = tokens[lab_pos.clamp(max=T - 1)].reshape(-1)[row_idx]
    weights = w_all.reshape(-1)[row_idx]
    teacher_at = (lab_pos - 1).reshape(-1)[row_idx]
    wsum = weights.sum()
    rows_per_chunk = args.chunk_blocks * (B - 1)

    def chunk_loss(h, lab, w, t):
        logits = (h @ lm_head.T).float()
        if args.objective == "ce":
            return (F.cross_entropy(logits, lab, reduction="none") * w).sum()
        with torch.no_grad():
            logp = F.log_softmax((t @ lm_head.T).float(), -1)
        logq = F.log_softmax(logits, -1)
        return ((logp.exp() * (logp - logq)).sum(-1) * w).sum()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x_ctx = features.permute(1, 0, 2).reshape(T, K * H)
            th = model.hidden_norm(model.fc(x_ctx))
            x = embed[ids.reshape(-1)]
            for layer, kind in zip(model.layers, s["types"]):
                x = layer(x, th, rq, rc, masks[kind], args.attention)
            h = model.norm(x)[row_idx]
            t_rows = final_norm[teacher_at]
            loss = 0.0
            for r0 in range(0, h.shape[0], rows_per_chunk):
                sl = slice(r0, r0 + rows_per_chunk)
                if args.recompute_loss_chunks == "on":
                    loss = loss + checkpoint(chunk_loss, h[sl], labels[sl], weights[sl], t_rows[sl], use_reentrant=False)
                else:
                    loss = loss + chunk_loss(h[sl], labels[sl], weights[sl], t_rows[sl])
            loss = loss / wsum
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup + args.steps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loss, norm = step()
        e1.record()
        torch.cuda.synchronize()
        if i >= args.warmup:
            times.append(e0.elapsed_time(e1))
        if i == 0:
            loss0 = loss.item()
    times.sort()
    peak = torch.cuda.max_memory_allocated() / 2**30
    w = br.Writer("ref_drafter_step", json_lines=args.json)
    w.begin(br.device_line(), br.timing_line(args.warmup, args.steps))
    w.meta("step", f"pytorch drafter step {args.model} objective={args.objective} attention={args.attention} "
                   f"recompute_loss_chunks={args.recompute_loss_chunks} context={T} anchors={N} rows={row_idx.numel()} "
                   f"params={sum(p.numel() for p in model.parameters()) / 1e9:.2f}B torch {torch.__version__}")
    w.meta("loss", f"{loss0:.4f} -> {loss.item():.4f}; grad norm {norm.item():.3f}")
    w.meta("memory", "mem_gib = torch.cuda.max_memory_allocated over the whole run (optimizer state included)")
    w.columns(br.step_columns())
    impl = f"torch-{args.attention}" + ("-keep" if args.recompute_loss_chunks == "off" else "")
    w.row(["step", impl, args.model, "dflash", B, args.objective, "fp32", None, times[len(times) // 2], times[0],
           times[-1], None, None, None, peak])


if __name__ == "__main__":
    main()
