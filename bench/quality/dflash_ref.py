"""The pieces of the PyTorch reference DFlash trainer (ref_train_dflash.py), batched as SpecForge batches them.

Semantics, and where each comes from (sgl-project/SpecForge, specforge/modeling/draft/dflash.py and
specforge/algorithms/common/dflash_family_model.py; the same layers as z-lab's DFlashDraftModel, which
bench/ref_drafter_step.py implements for one packed sequence):
  - drafter: context features hidden_norm(fc(concat(target layers))) are extra keys/values of every layer;
    the block [anchor, MASK x (B-1)] is embedded with the frozen target embedding; q_norm / k_norm per head
    (k_norm over the concatenated context + block keys), neox RoPE with context positions 0..S-1 and block
    n at a_n..a_n+B-1, GQA attention with the DFlash mask, SwiGLU MLP (transformers' Qwen3MLP), final norm
    (Qwen3RMSNorm everywhere, as SpecForge's DEFAULT_DFLASH_KERNELS);
  - mask (create_dflash_block_mask): a block's queries see context keys j < anchor and their own block
    (bidirectional), nothing of a block that was not kept;
  - anchors (_sample_anchor_positions): per sequence up to num_anchors of the positions p with
    loss_mask[p] and loss_mask[p+1], uniformly (argsort of torch.rand), sorted; shape [B, N] with N the
    largest count in the batch, capped at num_anchors, and a keep mask;
  - loss: CE of lm_head(hidden) against input_ids[a + k] for k >= 1, weights keep * in-bounds *
    loss_mask[a + k] * exp(-(k - 1) / gamma), sum / sum of weights, lm_head + CE in chunks of 128 blocks
    under non-reentrant activation checkpointing (checkpointed_chunk_reduce);
  - target layer ids: build_target_layer_ids (layer l = HF hidden_states[l + 1]).
The attention runs through flex_attention (torch.compile'd, as transformers' flex integration compiles it,
with a create_block_mask BlockMask) or, for CPU tests only, SDPA with the same rule as a dense mask
(create_dflash_sdpa_mask): compiled flex_attention takes minutes to compile on a CPU and eager
flex_attention has no backward.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ref_drafter_step import flex_attention_compiled  # noqa: E402  (bench/ref_drafter_step.py: torch.compile(flex_attention))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collect import build_target_layer_ids  # noqa: E402  (one place for the official rule)

QWEN3_MASK_TOKEN = 151669  # an unused id inside Qwen3's 151,936-row vocabulary


# ---- masks -----------------------------------------------------------------------------------------

def create_dflash_block_mask(anchor_positions, block_keep_mask, S, block_size, device, compile_mask=False):
    """SpecForge's create_dflash_block_mask (full attention layers)."""
    from torch.nn.attention.flex_attention import create_block_mask
    B, N = anchor_positions.shape

    def dflash_mask_mod(b, h, q_idx, kv_idx):
        q_block_id = q_idx // block_size
        safe_q_block_id = q_block_id.clamp(max=N - 1)
        anchor_pos = anchor_positions[b, safe_q_block_id]
        mask_context = (kv_idx < S) & (kv_idx < anchor_pos)
        kv_block_id = (kv_idx - S) // block_size
        mask_draft = (kv_idx >= S) & (q_block_id == kv_block_id)
        return (mask_context | mask_draft) & block_keep_mask[b, safe_q_block_id] & (q_block_id < N)

    return create_block_mask(dflash_mask_mod, B=B, H=None, Q_LEN=N * block_size, KV_LEN=S + N * block_size,
                             device=device, _compile=compile_mask)


def create_dflash_sdpa_mask(anchor_positions, block_keep_mask, S, block_size, device):
    """SpecForge's create_dflash_sdpa_mask: [B, 1, N*bs, S + N*bs] bool, True = visible."""
    B, N = anchor_positions.shape
    q = torch.arange(N * block_size, device=device).view(1, 1, -1, 1)
    kv = torch.arange(S + N * block_size, device=device).view(1, 1, 1, -1)
    anchor = anchor_positions.view(B, 1, N, 1).repeat_interleave(block_size, dim=2)
    ctx = (kv < S) & (kv < anchor)
    draft = (kv >= S) & ((q // block_size) == ((kv - S) // block_size))
    keep = block_keep_mask.view(B, 1, N, 1).repeat_interleave(block_size, dim=2)
    return (ctx | draft) & keep


# ---- the drafter -----------------------------------------------------------------------------------

def drafter_config(target_cfg, num_layers, block_size=16, mask_token_id=QWEN3_MASK_TOKEN, target_layer_ids=None):
    """The release-format config.json of a fresh drafter for `target_cfg` (a dict: the target's config.json),
    with the fields dflash-train's export writes (src/io/hf_config.cpp drafter_config_to_json) and
    src/drafter/drafter_io.cpp fresh_drafter_config's shape: the target's layer shape, num_layers layers."""
    tc = target_cfg.get("text_config", target_cfg)
    L = tc["num_hidden_layers"]
    ids = list(target_layer_ids) if target_layer_ids else build_target_layer_ids(L, num_layers)
    rope = tc.get("rope_theta") or (tc.get("rope_parameters") or {}).get("rope_theta", 1e6)
    heads = tc["num_attention_heads"]
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": block_size,
        "bos_token_id": None,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": ids},
        "dtype": "bfloat16",
        "eos_token_id": None,
        "head_dim": tc.get("head_dim") or tc["hidden_size"] // heads,
        "hidden_act": "silu",
        "hidden_size": tc["hidden_size"],
        "initializer_range": 0.02,
        "intermediate_size": tc["intermediate_size"],
        "layer_types": ["full_attention"] * num_layers,
        "max_position_embeddings": tc.get("max_position_embeddings", 40960),
        "max_window_layers": num_layers,
        "model_type": "qwen3",
        "num_attention_heads": heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": tc.get("num_key_value_heads") or heads,
        "num_target_layers": L,
        "pad_token_id": None,
        "rms_norm_eps": tc["rms_norm_eps"],
        "rope_parameters": {"rope_theta": rope, "rope_type": "default"},
        "rope_theta": rope,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "5.17.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": tc["vocab_size"],
    }


def qwen3_config_of(cfg):
    keep = {k: v for k, v in cfg.items() if k not in ("architectures", "dflash_config", "block_size",
                                                      "num_target_layers", "dtype", "transformers_version")}
    c = Qwen3Config(**keep)
    c._attn_implementation = "sdpa"  # unused: the attention below is called directly
    return c


class DraftAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv = c.num_attention_heads, c.num_key_value_heads
        self.hd = c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, c.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.hd, c.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.hd, c.rms_norm_eps)

    def forward(self, x, th, cos, sin, mask, attention):
        B, Q = x.shape[:2]
        S = th.shape[1]
        q = self.q_norm(self.q_proj(x).view(B, Q, self.nh, self.hd)).transpose(1, 2)
        k = torch.cat([self.k_proj(th), self.k_proj(x)], 1).view(B, S + Q, self.nkv, self.hd)
        v = torch.cat([self.v_proj(th), self.v_proj(x)], 1).view(B, S + Q, self.nkv, self.hd)
        k = self.k_norm(k).transpose(1, 2)
        v = v.transpose(1, 2)
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, S+Q, hd]
        q = q * c[..., -Q:, :] + rotate_half(q) * s[..., -Q:, :]
        k = k * c + rotate_half(k) * s
        scale = self.hd ** -0.5
        if attention == "flex":
            o = flex_attention_compiled()(q, k, v, block_mask=mask, enable_gqa=True, scale=scale)
        else:
            # A query row with no visible key (a block that was not kept) would be NaN in SDPA: let it see
            # everything, then zero it, as SpecForge's eager path does.
            rows = mask.any(-1, keepdim=True)
            rep = self.nh // self.nkv
            o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                               attn_mask=mask | ~rows, scale=scale)
            o = o * rows.to(o.dtype)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, self.nh * self.hd))


class DraftLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = DraftAttention(c)
        self.post_attention_layernorm = Qwen3RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = Qwen3MLP(c)

    def forward(self, x, th, cos, sin, mask, attention):
        x = x + self.self_attn(self.input_layernorm(x), th, cos, sin, mask, attention)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """State-dict keys are the release format's: fc.weight, hidden_norm.weight, layers.N.*, norm.weight."""

    def __init__(self, cfg):
        super().__init__()
        c = qwen3_config_of(cfg)
        self.cfg = cfg
        self.block_size = cfg["block_size"]
        self.mask_token_id = cfg["dflash_config"]["mask_token_id"]
        self.target_layer_ids = cfg["dflash_config"]["target_layer_ids"]
        H = c.hidden_size
        self.fc = nn.Linear(len(self.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = Qwen3RMSNorm(H, c.rms_norm_eps)
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(H, c.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(c)  # inv_freq is a non-persistent buffer: not in the state dict
        self.init_weights(cfg.get("initializer_range", 0.02))

    def init_weights(self, std):
        """Qwen3PreTrainedModel._init_weights, what DFlashDraftModel.post_init() runs: N(0, 0.02) linears,
        RMSNorm weights 1."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, std)
            elif isinstance(m, Qwen3RMSNorm):
                nn.init.ones_(m.weight)

    def forward(self, position_ids, noise_embedding, target_hidden, mask, attention):
        x = noise_embedding
        th = self.hidden_norm(self.fc(target_hidden))
        cos, sin = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(x, th, cos, sin, mask, attention)
        return self.norm(x)


def save_drafter(drafter, out_dir, extra=None):
    """The DFlash release format dflash-eval --drafter loads (src/drafter/drafter_io.cpp, hf_config.cpp): config.json
    + model.safetensors in bf16 with the layout's keys."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in drafter.state_dict().items()}
    tmp = os.path.join(out_dir, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(out_dir, "model.safetensors"))
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(drafter.cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    if extra is not None:
        with open(os.path.join(out_dir, "train_stats.json"), "w") as f:
            json.dump(extra, f, indent=2, sort_keys=True)
            f.write("\n")


# ---- the online training model -------------------------------------------------------------------

def sample_anchor_positions(seq_len, loss_mask, num_anchors, device):
    """SpecForge OnlineDFlashModel._sample_anchor_positions: [B, N] sorted anchors and their keep mask."""
    n = max(seq_len - 1, 0)
    valid = (loss_mask[:, :n] > 0.5) & (loss_mask[:, 1:n + 1] > 0.5)
    counts = valid.sum(dim=1)
    width = min(num_anchors, int(counts.max().item()))
    if width == 0:
        raise ValueError("DFlash training requires two consecutive supervised tokens in a batch")
    r = torch.rand(valid.shape, device=device)
    r.masked_fill_(~valid, 2.0)
    cand = r.argsort(dim=1)[:, :width]
    keep = torch.arange(width, device=device).unsqueeze(0) < counts.clamp(max=width).unsqueeze(1)
    sentinel = valid.shape[1]
    anchors = torch.where(keep, cand, torch.full_like(cand, sentinel)).sort(dim=1).values
    keep = anchors < sentinel
    return torch.where(keep, anchors, 0), keep


class OnlineDFlash(nn.Module):
    """SpecForge's OnlineDFlashModel with loss_type dflash: one training forward returns (loss, acc, stats)."""

    def __init__(self, drafter, embed_tokens, lm_head, num_anchors=512, gamma=7.0, chunk_blocks=128,
                 attention="flex", compile_mask=False):
        super().__init__()
        self.drafter = drafter
        self.embed_tokens, self.lm_head = embed_tokens, lm_head  # frozen target modules
        self.bs = drafter.block_size
        self.mask_token_id = drafter.mask_token_id
        self.num_anchors, self.gamma, self.chunk_blocks = num_anchors, gamma, chunk_blocks
        self.attention, self.compile_mask = attention, compile_mask

    def _chunk_terms(self, hidden, target_ids, weight_mask):
        B, N, bs, H = hidden.shape
        logits = self.lm_head(hidden.reshape(B, N * bs, H)).reshape(B, N, bs, -1)
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.reshape(-1),
                              reduction="none").reshape_as(target_ids)
        w = weight_mask
        if self.gamma is not None and self.gamma > 0:
            pos = torch.arange(bs, device=hidden.device).view(1, 1, -1)
            w = w * torch.exp(-(pos - 1).clamp(min=0).float() / self.gamma)
        with torch.no_grad():
            correct = ((logits.argmax(-1) == target_ids) & (weight_mask > 0.5)).sum().float()
        return (nll * w).sum(), w.sum(), correct, weight_mask.sum()

    def forward(self, input_ids, hidden_states, loss_mask):
        B, S = input_ids.shape
        dev, bs = input_ids.device, self.bs
        anchors, keep = sample_anchor_positions(S, loss_mask, self.num_anchors, dev)
        N = anchors.shape[1]
        # noise embedding: [anchor token, MASK x (bs-1)] per kept block, all MASK for the others
        noise = torch.full((B, N * bs), self.mask_token_id, dtype=torch.long, device=dev)
        starts = (torch.arange(N, device=dev) * bs).unsqueeze(0).expand(B, -1)
        rows = torch.arange(B, device=dev).unsqueeze(1).expand(B, N)
        noise[rows, starts] = torch.where(keep, torch.gather(input_ids, 1, anchors.clamp(0, S - 1)),
                                          torch.tensor(self.mask_token_id, device=dev))
        noise_emb = self.embed_tokens(noise)
        ctx_pos = torch.arange(S, device=dev).unsqueeze(0).expand(B, -1)
        blk_pos = (anchors.unsqueeze(-1) + torch.arange(bs, device=dev).view(1, 1, -1)).view(B, -1)
        pos = torch.cat([ctx_pos, blk_pos], 1)
        if self.attention == "flex":
            mask = create_dflash_block_mask(anchors, keep, S, bs, dev, self.compile_mask)
        else:
            mask = create_dflash_sdpa_mask(anchors, keep, S, bs, dev)
        out = self.drafter(pos, noise_emb, hidden_states, mask, self.attention)

        lab_idx = anchors.unsqueeze(-1) + torch.arange(bs, device=dev).view(1, 1, -1)
        in_bounds = lab_idx < S
        safe = lab_idx.clamp(max=S - 1)
        target_ids = torch.gather(input_ids.unsqueeze(1).expand(-1, N, -1), 2, safe)
        w = keep.unsqueeze(-1).expand(-1, -1, bs).float() * in_bounds.float()
        w = w * (torch.arange(bs, device=dev).view(1, 1, -1) > 0).float()
        w = w * torch.gather(loss_mask.unsqueeze(1).expand(-1, N, -1), 2, safe)
        hidden = out.reshape(B, N, bs, -1)
        tot = None
        step = self.chunk_blocks or N
        for s0 in range(0, N, step):
            args = (hidden[:, s0:s0 + step], target_ids[:, s0:s0 + step], w[:, s0:s0 + step])
            if self.chunk_blocks > 0 and torch.is_grad_enabled() and hidden.requires_grad:
                t = checkpoint(self._chunk_terms, *args, use_reentrant=False)
            else:
                t = self._chunk_terms(*args)
            tot = t if tot is None else tuple(a + b for a, b in zip(tot, t))
        loss_num, loss_den, correct, acc_den = tot
        loss = loss_num / loss_den
        return loss, correct / acc_den, {"anchors": int(keep.sum().item()), "blocks": B * N}


# ---- the frozen target, online ----------------------------------------------------------------------

class _StopForward(Exception):
    pass


class TargetFeatures:
    """The frozen bf16 target and the capture of its layers' outputs (layer l = hidden_states[l + 1]).

    mode "truncated": forward hooks on the captured layers, the forward stops after the last one (the
    features are the same as the full forward's; dflash-train's CE job stops there too). mode "full": the
    whole model with output_hidden_states=True, as SpecForge's HF target engine (generate_dflash_data) runs it."""

    def __init__(self, model, layer_ids, mode="truncated"):
        self.model, self.ids, self.mode = model, list(layer_ids), mode
        self.captured = {}
        self.handles = []
        if mode == "truncated":
            last = max(self.ids)
            for i in sorted(set(self.ids)):
                self.handles.append(model.model.layers[i].register_forward_hook(self._hook(i, i == last)))

    def _hook(self, i, stop):
        def fn(_module, _inputs, output):
            self.captured[i] = output[0] if isinstance(output, tuple) else output
            if stop:
                raise _StopForward()
        return fn

    @torch.no_grad()
    def __call__(self, input_ids, attention_mask):
        if self.mode == "full":
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                             use_cache=False)
            return torch.cat([out.hidden_states[i + 1] for i in self.ids], dim=-1)
        self.captured = {}
        try:
            self.model.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        except _StopForward:
            pass
        return torch.cat([self.captured[i] for i in self.ids], dim=-1)


# ---- data -----------------------------------------------------------------------------------------

def read_token_dataset(path):
    """docs/data.md format_version 1: [(ids int64 tensor, loss_mask float tensor)] per record."""
    import h5py
    import numpy as np
    with h5py.File(path, "r") as f:
        tokens = np.asarray(f["tokens"][:], dtype=np.int64)
        offsets = np.asarray(f["offsets"][:], dtype=np.int64)
        mask = np.asarray(f["loss_mask"][:], dtype=np.float32)
    return [(torch.from_numpy(tokens[a:b]), torch.from_numpy(mask[a:b])) for a, b in zip(offsets[:-1], offsets[1:])]


def lr_at(step, base_lr, total_steps, warmup_steps):
    """SpecForge's CosineAnnealingWarmupLR (specforge/lr_scheduler.py) in closed form, for the 0-based optimizer
    step `step`: linear warmup (step + 1) / W * lr, then cosine from lr to 0 over total - W steps."""
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    return 0.5 * base_lr * (1.0 + math.cos(math.pi * min(step - warmup_steps, span) / span))
