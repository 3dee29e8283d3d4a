#!/usr/bin/env python3
"""PyTorch reference for one DFlash2 drafter training step (issue 29 / 33), timed as bench/ref_drafter_step.py.

The step is ref_drafter_step.py's DFlash step (context features hidden_norm(fc(concat(target layers))) as
extra keys/values of every layer, blocks [anchor, MASK x (B-1)] embedded with the frozen target embedding,
q/k norms, neox RoPE, GQA attention with the DFlash anchor mask through sdpa or flex, SwiGLU MLP, final
norm, frozen lm_head, loss chunks of --chunk-blocks blocks, global normalisation, clip 1.0, fused AdamW,
fp32 master weights + bf16 autocast) with DFlash2's two additions (docs/dflash2.md):

  * 2.2, a GroupedDynamicCausalConv around attention and around the MLP of every layer:
        a = input_layernorm(x); dyn = kernel_projection(a) viewed [2, k, G]
        a'  = conv(a, base[0] + dyn[0])       x = x + conv(self_attn(a', ctx), base[1] + dyn[1])
        (the same with post_attention_layernorm / mlp / mlp_conv)
    conv(X)[t, c] = sum_{j<k} (base[j, c] + dyn[t, j, c // group]) * X[t - j, c], taps block-local: the
    N blocks share one [N*B, H] stream and a tap that would cross into the previous block reads zero.
  * 2.3 + 3, the logits z = c * tanh(m * lm_head(h) / c) (m = --output-multiplier, c = --logit-softcap,
    0 = off) under both loss terms, and the selector objective:
        L = ( sum_r w_r l_dflash,r + alpha * sum_r w_r l_sel,r ) / sum_r w_r         (one denominator)
        l_dflash = CE(z_r, y_r)  (or KL against the target, --objective kl)
        C_r  = top-K(z_r) descending, the gold y_r put into slot K-1 when missing (no gradient through it)
        s_ri = z_r[C_ri] + < P[p_r] * (W_h h_r), S[C_ri] >,   p_r = token[a+k-1]  (teacher-forced predecessor)
        l_sel = CE(s_r, slot of y_r);  --selector-stop-gradient computes s from sg(z), sg(h)
    P, S [V, r] (predecessor/successor codebooks) and W_h [r, H] are trainable (fp32 master, AdamW).
  Weights w_r = exp(-(k-1)/gamma) over k >= 1. gamma: --gamma, default 7 * B / 16 (ref_drafter_step's 7 at
  block 16 scaled linearly to the block: 3.5 at block 8); it changes the loss value, not the timing.

The selector runs inside each loss chunk, where the chunk's [rows, V] logits already exist, so logits never
exist for more than one chunk. --recompute-loss-chunks on (default) runs each chunk under activation
checkpointing as ref_drafter_step.py does (the chunk's logits are recomputed in the backward); off keeps
every chunk's autograd state alive (faster, more memory). Issue 33 wants the fastest configuration that
fits, so both are offered. --compile-conv on wraps the conv in torch.compile (fuses its elementwise chain).

Attention masks: as ref_drafter_step.py (this project's rule): context j < anchor, the own block fully
visible in full-attention layers, causal within the block in sliding layers (27b: 4 sliding + 1 full,
window 2048). A release config with is_causal: false would make the block fully visible in every layer
(docs/dflash2.md 2.6); the cost is the same.

  python3 bench/ref_dflash2_step.py --model 27b --context 4096 [--attention flex] [--recompute-loss-chunks off]
  python3 bench/ref_dflash2_step.py --model 8b --objective kl --selector-stop-gradient
  python3 bench/ref_dflash2_step.py --model tiny --device cpu --context 256 --anchors 16 --steps 2
  python3 bench/ref_dflash2_step.py --self-check [--official-model /work/dflash_ref/model.py]
Prints drafter_bench's rows (bench/bench_rows.py: the same `# ` metadata and columns, --json for JSON lines):
case step, impl torch-<attention>[-keep][-cc] (-keep: --recompute-loss-chunks off, -cc: --compile-conv on), ms the
median of --steps after --warmup (CUDA events on cuda, wall clock on cpu), mem_gib
torch.cuda.max_memory_allocated over the whole run (optimizer state included; none on cpu).

--self-check (CPU, float64, needs transformers + safetensors and the official z-lab dflash/model.py, which
is third-party and not in this repository: pass its path) loads tests/data/golden/dflash2-tiny-a (its
drafter_init/ release checkpoint, its target's embedding/lm_head, the recorded target features and rows)
into this script's modules and into the official DFlash2DraftModel.from_pretrained, then prints max errors:
  forward hidden, this script's packed forward vs the official module run block by block (and vs the golden),
  selector CE, this script's chunk loss terms vs gen_golden_dflash2.selector_ce on the same tensors,
  losses and every parameter gradient of objectives ce / d2 / d2sg / kl2 vs the golden's (gen_golden_dflash2,
  autograd through the official module), the conv's block-boundary rule.
Exit 0 when every error is under its tolerance, 1 otherwise.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ref_drafter_step import dense_mask, flex_attention_compiled, flex_block_mask  # noqa: E402
import bench_rows as br  # noqa: E402

SHAPES = {
    # as ref_drafter_step.py (27b = Qwen3.6-27B's shapes, bench/README.md), plus DFlash2's selector width
    # hidden, intermediate, heads, kv heads, head dim, vocab, layer types (W = sliding window), drafter layers
    "8b": dict(H=4096, I=12288, nh=32, nkv=8, hd=128, V=151936, types=["full"] * 5, W=0, D=5, ctx_layers=5,
               mask_id=151669),
    "27b": dict(H=5120, I=17408, nh=24, nkv=4, hd=256, V=248320, types=["sliding"] * 4 + ["full"], W=2048, D=5,
                ctx_layers=5, mask_id=248070),
    # a CPU-sized shape for proving the script runs (group 16 divides H)
    "tiny": dict(H=64, I=128, nh=4, nkv=2, hd=16, V=512, types=["sliding", "full"], W=32, D=2, ctx_layers=2,
                 mask_id=511),
}


class RMSNorm(nn.Module):
    """As ref_drafter_step.py: normalised in fp32, scaled, cast back to the input dtype."""

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


def rope_tables(pos, hd, theta, dtype):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=pos.device, dtype=torch.float32) / hd)
    ang = pos.float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)  # HF casts the tables to x.dtype


# ----------------------------------------------------------------------------------------------------------
# the grouped dynamic causal convolution, block-local (docs/dflash2.md 2.2)
# ----------------------------------------------------------------------------------------------------------
def block_conv(x, dyn, base, B, group):
    """x [N*B, H]; dyn [N*B, k, G] (one side of the kernel projection); base [k, H] (that side's base_kernel).
    out[t, c] = sum_j (base[j, c] + dyn[t, j, c // group]) * x[t - j, c], x[t - j] = 0 across a block start."""
    NB, H = x.shape
    k = base.shape[0]
    G = H // group
    xb = x.view(NB // B, B, G, group)
    d = dyn.reshape(NB // B, B, k, G, 1)
    b = base.to(x.dtype).view(k, G, group)
    out = (b[0] + d[:, :, 0]) * xb
    for j in range(1, k):
        shifted = F.pad(xb[:, :-j], (0, 0, 0, 0, j, 0))  # zero rows at the start of every block
        out = out + (b[j] + d[:, :, j]) * shifted
    return out.reshape(NB, H)


_CONV = block_conv


class GroupedDynamicCausalConv(nn.Module):
    def __init__(self, H, k, group):
        super().__init__()
        self.k, self.group = k, group
        self.base_kernel = nn.Parameter(torch.zeros(2, k, H))
        self.kernel_projection = nn.Linear(H, 2 * k * (H // group), bias=False)

    def prepare(self, a, B):
        dyn = self.kernel_projection(a).view(a.shape[0], 2, self.k, a.shape[1] // self.group)
        return _CONV(a, dyn[:, 0], self.base_kernel[0], B, self.group), dyn[:, 1]

    def finish(self, o, dyn1, B):
        return _CONV(o, dyn1, self.base_kernel[1], B, self.group)


# ----------------------------------------------------------------------------------------------------------
# the drafter; module names follow the official DFlash2DraftModel, so release tensor names load directly
# ----------------------------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, s):
        super().__init__()
        H, nh, nkv, hd = s["H"], s["nh"], s["nkv"], s["hd"]
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_proj = nn.Linear(H, nh * hd, bias=False)
        self.k_proj = nn.Linear(H, nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, s.get("eps", 1e-6))
        self.k_norm = RMSNorm(hd, s.get("eps", 1e-6))

    def forward(self, xc, th, rq, rc, mask, attention):
        NB, T = xc.shape[0], th.shape[0]
        q = rope(self.q_norm(self.q_proj(xc).view(NB, self.nh, self.hd)), *rq)
        kb = rope(self.k_norm(self.k_proj(xc).view(NB, self.nkv, self.hd)), *rq)
        kc = rope(self.k_norm(self.k_proj(th).view(T, self.nkv, self.hd)), *rc)
        k = torch.cat([kc, kb], 0)
        v = torch.cat([self.v_proj(th), self.v_proj(xc)], 0).view(T + NB, self.nkv, self.hd)
        if attention == "flex":
            o = flex_attention_compiled()(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                          block_mask=mask, enable_gqa=True)
        else:
            rep = self.nh // self.nkv
            k = k.repeat_interleave(rep, dim=1).transpose(0, 1)[None]
            v = v.repeat_interleave(rep, dim=1).transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask)
        return self.o_proj(o[0].transpose(0, 1).reshape(NB, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, s):
        super().__init__()
        self.gate_proj = nn.Linear(s["H"], s["I"], bias=False)
        self.up_proj = nn.Linear(s["H"], s["I"], bias=False)
        self.down_proj = nn.Linear(s["I"], s["H"], bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, s, k, group):
        super().__init__()
        eps = s.get("eps", 1e-6)
        self.input_layernorm = RMSNorm(s["H"], eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s["H"], eps)
        self.mlp = MLP(s)
        self.attention_conv = GroupedDynamicCausalConv(s["H"], k, group)
        self.mlp_conv = GroupedDynamicCausalConv(s["H"], k, group)

    def forward(self, x, th, rq, rc, mask, attention, B):
        a, kA = self.attention_conv.prepare(self.input_layernorm(x), B)
        x = x + self.attention_conv.finish(self.self_attn(a, th, rq, rc, mask, attention), kA, B)
        m, kM = self.mlp_conv.prepare(self.post_attention_layernorm(x), B)
        return x + self.mlp_conv.finish(self.mlp(m), kM, B)


class CandidateSelector(nn.Module):
    def __init__(self, H, V, r):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.zeros(V, r))  # release names: no ".weight"
        self.successor_codebook = nn.Parameter(torch.zeros(V, r))
        self.hidden_projection = nn.Linear(H, r, bias=False)


class Drafter(nn.Module):
    def __init__(self, s, n_ctx, k, group, r):
        super().__init__()
        eps = s.get("eps", 1e-6)
        self.layers = nn.ModuleList([Layer(s, k, group) for _ in range(s["D"])])
        self.norm = RMSNorm(s["H"], eps)
        self.fc = nn.Linear(n_ctx * s["H"], s["H"], bias=False)
        self.hidden_norm = RMSNorm(s["H"], eps)
        self.candidate_selector = CandidateSelector(s["H"], s["V"], r)


def init_weights(model):
    """Random backbone (normal 0.02, norms 1), identity convs (docs/dflash2.md 2.2: base[:, 0] = 1, the rest 0)
    plus normal(0, 0.02) kernel projections so the dynamic taps cost what trained ones do, selector 0.02."""
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("base_kernel"):
                p.zero_()
                p[:, 0] = 1.0
            elif "norm" not in n:
                p.normal_(0.0, 0.02)


def drafter_forward(model, types, features, ids, anchors, T, B, masks, rq, rc, attention):
    """features [n_ctx, T, H] (one packed sequence); ids [N, B] -> final-normed hidden [N*B, H]."""
    n_ctx, _, H = features.shape
    th = model.hidden_norm(model.fc(features.permute(1, 0, 2).reshape(T, n_ctx * H)))
    x = model.embed[ids.reshape(-1)]
    for layer, kind in zip(model.layers, types):
        x = layer(x, th, rq, rc, masks[kind], attention, B)
    return model.norm(x)


# ----------------------------------------------------------------------------------------------------------
# the objective over one chunk of rows (docs/dflash2.md 3)
# ----------------------------------------------------------------------------------------------------------
def up(t):
    """bf16/fp16 -> fp32; fp32 and fp64 (the self-check) unchanged."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


def transform_logits(raw, multiplier, softcap):
    z = raw * multiplier if multiplier != 1.0 else raw
    if softcap and softcap > 0:
        z = softcap * torch.tanh(z / softcap)
    return z


def training_candidates(z, labels, K):
    """Unary top-K (descending) with the gold in slot K-1 when missing -> cand, gold slot (as gen_golden_dflash2)."""
    top = torch.topk(z, K, dim=-1).indices
    match = top.eq(labels.unsqueeze(-1))
    covered = match.any(-1)
    gold = torch.where(covered, match.long().argmax(-1), torch.full_like(labels, K - 1))
    cand = top.clone()
    cand[:, K - 1] = torch.where(covered, top[:, K - 1], labels)
    return cand, gold


def chunk_terms(h, lab, pred, w, t_rows, lm_head, sel, cfg, parts=False):
    """Returns sum_r w_r l_dflash,r + alpha sum_r w_r l_sel,r for the chunk's rows (the caller divides by sum w).
    h [R, H] drafter hidden; lab/pred [R]; w [R]; t_rows [R, H] the target's final norm at a+k-1 (KL only)."""
    z = transform_logits(up(h @ lm_head.T), cfg.output_multiplier, cfg.logit_softcap)
    if cfg.objective == "ce":
        unary = F.cross_entropy(z, lab, reduction="none")
    else:
        with torch.no_grad():
            logp = F.log_softmax(up(t_rows @ lm_head.T), -1)
        unary = (logp.exp() * (logp - F.log_softmax(z, -1))).sum(-1)
    unary_num = (unary * w).sum()
    if cfg.alpha == 0:
        return (unary_num, unary_num * 0) if parts else unary_num
    zs, hs = (z.detach(), h.detach()) if cfg.stop_gradient else (z, h)
    cand, gold = training_candidates(z.detach(), lab, cfg.top_k)
    u = hs @ sel.hidden_projection.weight.T                                      # [R, r]
    ctx = sel.predecessor_codebook[pred] * u                                      # [R, r]
    trans = torch.einsum("rq,rkq->rk", up(ctx), up(sel.successor_codebook[cand]))
    scores = zs.gather(-1, cand) + trans
    sel_ce = F.cross_entropy(scores, gold, reduction="none")
    sel_num = (sel_ce * w).sum()
    if parts:
        return unary_num, sel_num
    return unary_num + cfg.alpha * sel_num


# ----------------------------------------------------------------------------------------------------------
# the timed step
# ----------------------------------------------------------------------------------------------------------
def main_bench(args):
    global _CONV
    s = dict(SHAPES[args.model])
    # a fresh drafter's own heads (dflash-train --draft-heads ...; the DFlash2 27B release: 32 x 128, 8 KV)
    for key, v in (("nh", args.draft_heads), ("hd", args.draft_head_dim), ("nkv", args.draft_kv_heads)):
        if v:
            s[key] = v
    if s["nh"] % s["nkv"]:
        sys.exit("--draft-heads must be a multiple of --draft-kv-heads")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("CUDA is not available: use --device cpu (with --model tiny)")
    if args.compile_conv == "on":
        _CONV = torch.compile(block_conv)
    torch.manual_seed(0)
    T, N, B, H, V, K = args.context, args.anchors, args.block, s["H"], s["V"], s["ctx_layers"]
    gamma = args.gamma if args.gamma else 7.0 * B / 16.0
    W = s["W"]
    assert H % args.conv_group_size == 0 and 1 <= args.conv_kernel_size <= B and args.top_k <= V
    assert N <= T - 1, "more anchors than positions"
    model = Drafter(s, K, args.conv_kernel_size, args.conv_group_size, args.selector_rank).to(dev)
    init_weights(model)
    embed = (torch.randn(V, H, device=dev) * 0.02).to(torch.bfloat16 if cuda else torch.float32)
    model.embed = embed  # frozen, not a parameter
    lm_head = (torch.randn(V, H, device=dev) * 0.02).to(embed.dtype)
    features = torch.randn(K, T, H, device=dev).to(embed.dtype)
    final_norm = torch.randn(T, H, device=dev).to(embed.dtype)
    tokens = torch.randint(0, min(V, 150000), (T,), device=dev)
    anchors = torch.randperm(T - 1, device=dev)[:N].sort().values
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01,
                            fused=cuda)

    k = torch.arange(B, device=dev)
    pos_blk = (anchors[:, None] + k[None]).reshape(-1)
    rdt = torch.bfloat16 if cuda else torch.float32
    rq = rope_tables(pos_blk, s["hd"], 1e6, rdt)
    rc = rope_tables(torch.arange(T, device=dev), s["hd"], 1e6, rdt)
    make_mask = flex_block_mask if args.attention == "flex" else dense_mask
    masks = {"full": make_mask(anchors, T, B, 0, dev)}
    masks["sliding"] = make_mask(anchors, T, B, W, dev) if W > 0 else masks["full"]
    ids = torch.full((N, B), s["mask_id"], device=dev)
    ids[:, 0] = tokens[anchors]
    lab_pos = anchors[:, None] + k[None]                    # [N, B]
    valid = (k[None] >= 1) & (lab_pos < T)
    w_all = torch.exp(-(k.float() - 1) / gamma)[None].expand(N, B)
    row_idx = torch.nonzero(valid.reshape(-1)).squeeze(1)
    labels = tokens[lab_pos.clamp(max=T - 1)].reshape(-1)[row_idx]
    weights = w_all.reshape(-1)[row_idx]
    teacher_at = (lab_pos - 1).reshape(-1)[row_idx]
    preds = tokens[teacher_at]                              # p_r = token[a+k-1] (the anchor token for k = 1)
    wsum = weights.sum()
    rows_per_chunk = args.chunk_blocks * (B - 1)
    sel = model.candidate_selector
    recompute = args.recompute_loss_chunks == "on"

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            h = drafter_forward(model, s["types"], features, ids, anchors, T, B, masks, rq, rc,
                                args.attention)[row_idx]
            t_rows = final_norm[teacher_at]
            loss = 0.0
            for r0 in range(0, h.shape[0], rows_per_chunk):
                sl = slice(r0, r0 + rows_per_chunk)
                a = (h[sl], labels[sl], preds[sl], weights[sl], t_rows[sl], lm_head, sel, args)
                if recompute:
                    loss = loss + checkpoint(chunk_terms, *a, use_reentrant=False)
                else:
                    loss = loss + chunk_terms(*a)
            loss = loss / wsum
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss, norm

    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(args.warmup + args.steps):
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        loss, norm = step()
        if cuda:
            e1.record()
            torch.cuda.synchronize()
            ms = e0.elapsed_time(e1)
        else:
            ms = (time.perf_counter() - t0) * 1e3
        if i >= args.warmup:
            times.append(ms)
        if i == 0:
            loss0 = loss.item()
    times.sort()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0
    n_sel = sum(p.numel() for p in sel.parameters())
    n_conv = sum(p.numel() for n, p in model.named_parameters() if "_conv." in n)
    conf = (f"model={args.model} objective={args.objective} attention={args.attention} block={B} context={T} "
            f"anchors={N} chunk_blocks={args.chunk_blocks} recompute={args.recompute_loss_chunks} "
            f"compile_conv={args.compile_conv} conv_k={args.conv_kernel_size} conv_group={args.conv_group_size} "
            f"top_k={args.top_k} rank={args.selector_rank} alpha={args.alpha:g} "
            f"sg={int(args.stop_gradient)} mult={args.output_multiplier:g} softcap={args.logit_softcap:g} "
            f"gamma={gamma:g}")
    w = br.Writer("ref_dflash2_step", json_lines=args.json)
    w.begin(br.device_line() if cuda else f"cpu (torch {torch.__version__})",
            br.timing_line(args.warmup, args.steps, "CUDA events" if cuda else "wall clock"))
    w.meta("step", f"pytorch dflash2 drafter step {conf} rows={row_idx.numel()} "
                   f"params={sum(p.numel() for p in model.parameters()) / 1e9:.3f}B (convs {n_conv / 1e6:.1f}M, "
                   f"selector {n_sel / 1e6:.1f}M) device={dev.type} torch {torch.__version__}")
    w.meta("loss", f"{loss0:.4f} -> {loss.item():.4f}; grad norm {norm.item():.3f}")
    w.meta("memory", "mem_gib = torch.cuda.max_memory_allocated over the whole run (optimizer state included)")
    w.columns(br.step_columns())
    impl = (f"torch-{args.attention}" + ("-keep" if args.recompute_loss_chunks == "off" else "")
            + ("-cc" if args.compile_conv == "on" else ""))
    w.row(["step", impl, args.model, "dflash2", B, args.objective, "fp32", None, times[len(times) // 2], times[0],
           times[-1], None, None, None, peak if cuda else None])


# ----------------------------------------------------------------------------------------------------------
# --self-check: this script's math against the official module and the golden case
# ----------------------------------------------------------------------------------------------------------
def self_check(args):
    from safetensors.torch import load_file
    sys.path.insert(0, os.path.join(REPO, "tests", "data", "golden"))
    import gen_golden_dflash2 as gg  # the project's golden generator: load_official, selector_ce, release_name

    torch.set_default_dtype(torch.float64)
    dt = torch.float64
    case_dir = args.golden_case
    case = json.load(open(os.path.join(case_dir, "case.json")))
    gold = load_file(os.path.join(case_dir, "golden.safetensors"))
    cfgj = json.load(open(os.path.join(case_dir, "drafter_init", "config.json")))
    dc = cfgj["dflash_config"]
    off, sha = gg.load_official(args.official_model)
    print(f"official model.py {args.official_model} sha256 {sha} (golden made with {case['official_model']['sha256']})")

    B, K, r = dc["block_size"], dc["selector_top_k"], dc["selector_rank"]
    s = dict(H=cfgj["hidden_size"], I=cfgj["intermediate_size"], nh=cfgj["num_attention_heads"],
             nkv=cfgj["num_key_value_heads"], hd=cfgj["head_dim"], V=cfgj["vocab_size"], D=cfgj["num_hidden_layers"],
             eps=cfgj["rms_norm_eps"], W=0)
    assert all(t == "full_attention" for t in cfgj["layer_types"]), "the self-check case has full attention only"
    theta = (cfgj.get("rope_parameters") or {}).get("rope_theta", cfgj.get("rope_theta", 1e6))
    layer_ids = dc["target_layer_ids"]
    mine = Drafter(s, len(layer_ids), dc["conv_kernel_size"], dc["conv_group_size"], r).to(dt)
    rel = load_file(os.path.join(case_dir, "drafter_init", "model.safetensors"))
    missing, unexpected = mine.load_state_dict({n: v.to(dt) for n, v in rel.items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    tw = load_file(os.path.join(case_dir, "target", "model.safetensors"))
    embed = tw["model.embed_tokens.weight"].to(dt)
    lm_head = tw["lm_head.weight"].to(dt)
    mine.embed = embed

    try:
        offm = off.DFlash2DraftModel.from_pretrained(os.path.join(case_dir, "drafter_init"), dtype=dt)
    except TypeError:
        offm = off.DFlash2DraftModel.from_pretrained(os.path.join(case_dir, "drafter_init"), torch_dtype=dt)
    offm = offm.to(dt).eval()
    errs, ok = {}, True

    def report(name, got, ref, tol):
        nonlocal ok
        got, ref = got.detach().double(), ref.detach().double()
        e = float((got - ref).abs().max()) if got.numel() else 0.0
        scale = float(ref.abs().max()) if ref.numel() else 0.0
        good = e <= tol * max(1.0, scale)
        ok &= good
        errs[name] = e
        print(f"  {name:58s} max |err| {e:.3e}  (max |ref| {scale:.3e}, tol {tol:g} x max(1,|ref|)) {'ok' if good else 'FAIL'}")

    # ---- rows and features of the golden batch, per sequence ----
    cu = gold["cu_seqlens"].long().tolist()
    tokens = gold["tokens"].long()
    hidden = gold["target.hidden"].to(dt)                # [L, T_all, H]
    fnorm = gold["target.final_norm"].to(dt)
    anchors = case["anchors"]
    labels = gold["rows.label"].long()                   # [N, B]
    preds = gold["rows.pred"].long()
    w = gold["rows.w"].to(dt)
    n_of = []                                            # (sequence, anchor) of every block, in golden order
    for i, al in enumerate(anchors):
        n_of += [(i, a) for a in al]
    teacher = torch.stack([cu[i] + (a + torch.arange(B) - 1).clamp(min=0, max=cu[i + 1] - cu[i] - 1)
                           for i, a in n_of])            # [N, B]: the target's final norm that predicts token a+k

    def forward_all(model):
        hs = []
        for i, al in enumerate(anchors):
            T = cu[i + 1] - cu[i]
            an = torch.tensor(al)
            feats = hidden[layer_ids, cu[i]:cu[i + 1]]   # [n_ctx, T, H]
            ids = torch.full((len(al), B), case["mask_token_id"])
            ids[:, 0] = tokens[cu[i] + an]
            kk = torch.arange(B)
            rq = rope_tables((an[:, None] + kk[None]).reshape(-1), s["hd"], theta, dt)
            rc = rope_tables(torch.arange(T), s["hd"], theta, dt)
            m = dense_mask(an, T, B, 0, torch.device("cpu"))
            hs.append(drafter_forward(model, ["full"] * s["D"], feats, ids, an, T, B, {"full": m}, rq, rc,
                                      "sdpa").view(len(al), B, -1))
        return torch.cat(hs, 0)                           # [N, B, H]

    print("forward hidden (float64, CPU):")
    with torch.no_grad():
        h_mine = forward_all(mine)
        h_off = []
        for i, a in n_of:  # the official module, one block per forward (what dflash_generate feeds it)
            ctx = torch.cat([hidden[l, cu[i]:cu[i] + a] for l in layer_ids], -1)[None]
            nid = torch.full((1, B), case["mask_token_id"])
            nid[0, 0] = tokens[cu[i] + a]
            pos = torch.cat([torch.arange(a), a + torch.arange(B)])[None]
            h_off.append(offm(position_ids=pos, noise_embedding=F.embedding(nid, embed), target_hidden=ctx)[0])
        h_off = torch.stack(h_off)
    report("hidden: this script vs official DFlash2DraftModel", h_mine, h_off, 1e-6)
    report("hidden: this script vs golden fwd.hidden", h_mine, gold["fwd.hidden"], 1e-5)
    with torch.no_grad():
        z_mine = transform_logits(h_mine @ lm_head.T, dc["output_multiplier"], dc["final_logit_softcapping"] or 0)
        report("logits: transform_logits vs official compute_logits", z_mine,
               offm.compute_logits(h_off, lambda x: x @ lm_head.T), 1e-6)

    # ---- the conv's block boundary: block n's rows never read block n-1 ----
    with torch.no_grad():
        conv = mine.layers[0].attention_conv
        x = torch.randn(3 * B, s["H"])
        y1, _ = conv.prepare(x, B)
        x2 = x.clone()
        x2[:B] += 5.0                                      # change block 0 only
        y2, _ = conv.prepare(x2, B)
        report("conv: blocks 1.. unchanged when block 0 changes", y2[B:], y1[B:], 0.0)
        oc = off.GroupedDynamicCausalConv(s["H"], dc["conv_kernel_size"], dc["conv_group_size"]).to(dt)
        oc.load_state_dict(conv.state_dict())
        yo, ko = oc.prepare(x.view(3, B, -1))
        ym, km = conv.prepare(x, B)
        report("conv: prepare vs official (3 blocks as a batch)", ym, yo.reshape(3 * B, -1), 1e-12)
        report("conv: finish vs official", conv.finish(x, km, B), oc.finish(x.view(3, B, -1), ko).reshape(3 * B, -1), 1e-12)

    # ---- selector CE: chunk_terms vs gen_golden_dflash2.selector_ce on the same rows ----
    print("selector objective:")
    alpha = case["selector_loss_alpha"]
    sel = mine.candidate_selector
    P, S, Wh = sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight
    flat = lambda t: t.reshape(-1, *t.shape[2:])
    with torch.no_grad():
        ce_ref, _, _, _, _ = gg.selector_ce(flat(z_mine), flat(h_mine), flat(labels), flat(preds), P, S, Wh, K)
        cfg = argparse.Namespace(objective="ce", alpha=alpha, stop_gradient=False, top_k=K,
                                 output_multiplier=dc["output_multiplier"], logit_softcap=dc["final_logit_softcapping"] or 0)
        un_w, sel_w = chunk_terms(flat(h_mine), flat(labels), flat(preds), flat(w), None, lm_head, sel, cfg, parts=True)
        report("selector: sum w*ce, chunk_terms vs gen_golden selector_ce", sel_w, (flat(w) * ce_ref).sum(), 1e-12)
        report("selector: per-row ce, gen_golden selector_ce vs golden sel.ce", ce_ref.view_as(w) * (w > 0),
               gold["sel.ce"].to(dt) * (w > 0), 1e-5)
        row_ce = torch.stack([chunk_terms(flat(h_mine)[i:i + 1], flat(labels)[i:i + 1], flat(preds)[i:i + 1],
                                          torch.ones(1), None, lm_head, sel, cfg, parts=True)[1]
                              for i in range(flat(w).shape[0])])
        report("selector: per-row ce, chunk_terms vs gen_golden selector_ce", row_ce, ce_ref, 1e-12)

    # ---- losses and gradients of the four objectives vs the golden (autograd through the official module) ----
    print("losses and gradients vs golden (objectives ce, d2, d2sg, kl2; chunks of 5 blocks):")
    named = dict(mine.named_parameters())
    for obj, kw in (("ce", dict(alpha=0.0)), ("d2", dict(alpha=alpha)), ("d2sg", dict(alpha=alpha, stop_gradient=True)),
                    ("kl2", dict(alpha=alpha, objective="kl"))):
        cfg = argparse.Namespace(objective=kw.get("objective", "ce"), alpha=kw["alpha"],
                                 stop_gradient=kw.get("stop_gradient", False), top_k=K,
                                 output_multiplier=dc["output_multiplier"],
                                 logit_softcap=dc["final_logit_softcapping"] or 0)
        mine.zero_grad(set_to_none=True)
        h = flat(forward_all(mine))
        lab, prd, ww, tr = flat(labels), flat(preds), flat(w), fnorm[teacher.reshape(-1)]
        loss = 0.0
        step = 5 * B
        for r0 in range(0, h.shape[0], step):
            sl = slice(r0, r0 + step)
            loss = loss + checkpoint(chunk_terms, h[sl], lab[sl], prd[sl], ww[sl], tr[sl], lm_head, sel, cfg,
                                     use_reentrant=False)
        loss = loss / ww.sum()
        loss.backward()
        report(f"{obj}: loss vs golden case.json", loss, torch.tensor(case["objectives"][obj]["loss"]), 1e-6)
        worst, worst_n = 0.0, ""
        for n, p in named.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            ref = gold[f"grad.{obj}.{n}"]  # this script's parameter names are the release names
            e = float((g - ref.to(dt)).abs().max()) / max(1e-30, float(ref.abs().max()) or 1.0)
            if e > worst:
                worst, worst_n = e, n
        good = worst <= 1e-5
        ok &= good
        errs[f"{obj}: grad"] = worst
        print(f"  {obj + ': every gradient vs golden grad.' + obj + '.*':58s} max rel err {worst:.3e} ({worst_n or '-'}), tol 1e-5 {'ok' if good else 'FAIL'}")
    print("SELF-CHECK", "PASSED" if ok else "FAILED",
          " ".join(f"{k.replace(' ', '_').replace(':', '')}={v:.2e}" for k, v in list(errs.items())[:3]))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="27b", choices=sorted(SHAPES))
    ap.add_argument("--objective", default="ce", choices=["ce", "kl"])
    ap.add_argument("--context", type=int, default=3072)
    ap.add_argument("--anchors", type=int, default=512)
    ap.add_argument("--chunk-blocks", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "flex"])
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--draft-heads", type=int, default=0, help="the drafter's attention heads (0: the shape's)")
    ap.add_argument("--draft-head-dim", type=int, default=0, help="its head dim (0: the shape's)")
    ap.add_argument("--draft-kv-heads", type=int, default=0, help="its KV heads (0: the shape's)")
    ap.add_argument("--gamma", type=float, default=0.0, help="loss decay (default 7 * block / 16)")
    ap.add_argument("--conv-kernel-size", type=int, default=2)
    ap.add_argument("--conv-group-size", type=int, default=16)
    ap.add_argument("--selector-top-k", dest="top_k", type=int, default=16)
    ap.add_argument("--selector-rank", type=int, default=256)
    ap.add_argument("--selector-loss-alpha", dest="alpha", type=float, default=1.0)
    ap.add_argument("--selector-stop-gradient", dest="stop_gradient", action="store_true")
    ap.add_argument("--output-multiplier", type=float, default=1.0)
    ap.add_argument("--logit-softcap", type=float, default=0.0, help="0 = off")
    ap.add_argument("--recompute-loss-chunks", default="on", choices=["on", "off"])
    ap.add_argument("--compile-conv", default="off", choices=["on", "off"])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--self-check", action="store_true")
    br.add_json_flag(ap)
    ap.add_argument("--official-model", default="/work/dflash_ref/model.py",
                    help="z-lab/dflash dflash/model.py (DFlash2 version; third-party, not in this repository)")
    ap.add_argument("--golden-case", default=os.path.join(REPO, "tests", "data", "golden", "dflash2-tiny-a"))
    args = ap.parse_args()
    if args.self_check:
        sys.exit(self_check(args))
    main_bench(args)


if __name__ == "__main__":
    main()
