"""Golden reference cases for DFlash2 drafters (issue 29; the architecture in docs/dflash2.md).

The forward is the official z-lab DFlash2DraftModel (dflash/model.py, the version with GroupedDynamicCausalConv,
CandidateSelector and compute_logits' output_multiplier / final_logit_softcapping), imported from the path
given on the command line; the target is Hugging Face Qwen3ForCausalLM. The selector objective (the DFlash
loss on the unary logits + alpha x a K-way cross-entropy of the selector over the unary top-K, the gold token
put into the candidate set when it is missing; optionally with the selector's inputs detached) is this
file's own PyTorch, and every gradient comes from autograd through the official modules. Everything runs in
float64 on the CPU from float32 weights; nothing needs a GPU or the network.

The official model takes one block per forward (what dflash_generate feeds it): its convolution runs along
the sequence it is given, so every training block is run as its own forward with the features of its
sequence strictly before the anchor as context and no attention mask (the official full-attention layers
are not causal), which is exactly the DFlash training layout of one block (context j < anchor, the whole
own block visible).

Each case directory holds (layout of gen_golden.py's qwen3-tiny-a, plus the DFlash2 tensors):
  target/            HF Qwen3 checkpoint (config.json + model.safetensors), float32
  drafter_init/      the DFlash2 drafter in the release format: config.json (architectures
                     ["DFlash2DraftModel"], dflash_config {block_size, conv_group_size, conv_kernel_size,
                     final_logit_softcapping, mask_token_id, output_multiplier, selector_rank,
                     selector_top_k, target_layer_ids}) + model.safetensors with the release's tensor
                     names (candidate_selector.{predecessor,successor}_codebook without ".weight"), float32
  golden.safetensors see GOLDEN_DOC below (also written into case.json as "golden_layout")
  case.json          scalars: shapes, anchors, losses, metrics, grad norms, AdamW settings, provenance

The strict case (issue 47, dflash2-tiny-strict) transcribes SpecForge's current objective instead: the
selector's CE over the strict unary top-K, a row whose gold is not among them contributing no selector term
(sgl-project/SpecForge specforge/algorithms/common/dflash_family_model.py `_selector_chunk_terms` at
36eb793a; selector weights = loss weights x covered, one DFlash denominator), and its selector-weight
schedule (specforge/training/torchtitan/runtime.py `_selector_alpha` at 36eb793a): AdamW steps on
CE + alpha_s x selector with alpha_s = 0 for the first int(total x warmup_ratio) completed steps, then
alpha x min(1, (s - W + 1) / int(total x ramp_ratio)). The zero-weighted term stays in the graph (SpecForge
keeps it so DDP sees every selector parameter): its parameters get zero gradients and AdamW still steps them.
docs/dflash2.md section 3 cites both.

usage: python gen_golden_dflash2.py OFFICIAL_MODEL_PY OUTDIR [CASE ...]
       (cases: dflash2-tiny-a, dflash2-tiny-b, dflash2-tiny-strict; default all. Needs torch, transformers,
       safetensors.)
"""
import copy
import hashlib
import importlib.util
import json
import math
import os
import sys
import traceback

import torch
import torch.nn.functional as F

GOLDEN_DOC = {
    "tokens [T] I32, loss_mask [T] U8, cu_seqlens [S+1] I32": "the packed batch",
    "target.hidden [L, T, H]": "output of every target decoder layer (float32 of the float64 forward)",
    "target.final_norm [T, H], target.logits [T, V]": "the target's final norm output and logits",
    "fwd.hidden [N, B, H]": "official DFlash2DraftModel forward (final norm) per block, blocks in anchor order",
    "fwd.logits [N, B, V]": "official compute_logits(fwd.hidden, target lm_head): multiplier then softcap",
    "rows.label [N, B] I32": "token a+k (clamped to the sequence; meaningless where rows.w0 == 0)",
    "rows.pred [N, B] I32": "teacher-forced predecessor: token a+k-1 (the anchor token for k = 1)",
    "rows.w0 [N, B]": "[a+k < end][k > 0] loss_mask[a+k]",
    "rows.w [N, B]": "rows.w0 * exp(-(k-1)/gamma)",
    "sel.cand [N, B, K] I32": "training candidates: unary top-K (descending), the gold replacing slot K-1 when missing "
        "(case.json selector_candidates insert; strict: the top-K unchanged)",
    "sel.gold_index [N, B] I32": "slot of the gold token in sel.cand (strict: -1 where it is not among them: no "
        "selector term, sel.ce 0 there)",
    "sel.covered [N, B] U8": "gold within the strict unary top-K",
    "sel.scores [N, B, K]": "teacher-forced selector scores over sel.cand (unary + transition)",
    "sel.ce [N, B]": "-log softmax(sel.scores)[gold_index]",
    "serve.path [N, B-1] I32": "official propose() at temperature 0: the greedy selector walk from the anchor",
    "serve.sample_path / serve.sample_cand [N, B-1, K] / serve.sample_q [N, B-1, K]":
        "official propose() at case.json sample_temperature (torch seed sample_seed): the sampled walk, the "
        "candidates in the official order and q over them (q given the path is deterministic)",
    "grad.<obj>.<release name>": "d loss_<obj> / d parameter, obj in ce (unary CE only), d2 (CE + alpha*sel), "
        "d2sg (the same with the selector's inputs detached), kl2 (KL + alpha*sel)",
    "after2.<release name>": "weights after two AdamW steps (torch.optim.AdamW, clip) on objective d2",
    "op.conv.*": "one GroupedDynamicCausalConv (official module) on [nb, B, H]: x, u, base_kernel, "
        "kernel_projection, dyn (projection output [nb, B, 2, k, G]), y = prepare(x)[0], z = finish(u, dyn[...,1]), "
        "gy, gz (upstream gradients of loss = <y,gy> + <z,gz>), dx, du, dbase_kernel, dkernel_projection",
    "op.sel.*": "the selector objective alone on random rows: h [R,H], z [R,V] (unary logits), label, pred, w, "
        "P, S [V,r], Wh [r,H], cand, gold_index, scores, ce, and d(sum w*ce)/d{h, z, P, S, Wh}",
}

CASES = {
    # the main case: block 8 (the shape), 2 taps, multiplier and an active softcap, alpha != 1
    "dflash2-tiny-a": dict(seed=2901, V=512, H=64, L=6, NH=4, NKV=2, HD=24, I=128, theta=1e6,
                           seqs=[37, 29, 53], n_anchor=[5, 4, 7], lossmask_holes=True,
                           D=2, DNH=4, DNKV=2, DHD=16, DI=96, layer_ids=[1, 3], block=8, gamma=7.0,
                           conv_kernel=2, conv_group=16, top_k=16, rank=16,
                           output_multiplier=2.5, softcap=4.0, alpha=0.7, hot=24,
                           sample_temperature=0.8, sample_seed=7),
    # issue 47: SpecForge's strict top-K objective and the selector schedule (tiny-a's shape, another seed)
    "dflash2-tiny-strict": dict(seed=2903, V=512, H=64, L=6, NH=4, NKV=2, HD=24, I=128, theta=1e6,
                                seqs=[37, 29, 53], n_anchor=[5, 4, 7], lossmask_holes=True,
                                D=2, DNH=4, DNKV=2, DHD=16, DI=96, layer_ids=[1, 3], block=8, gamma=7.0,
                                conv_kernel=2, conv_group=16, top_k=16, rank=16,
                                output_multiplier=2.5, softcap=4.0, alpha=0.7, hot=24,
                                sample_temperature=0.8, sample_seed=7, candidates="strict",
                                schedule=dict(total_steps=8, warmup_ratio=0.125, ramp_ratio=0.25, steps=4)),
    # the held-out shape: other widths, 3 drafter layers, block 6, 3 taps, groups of 8, no softcap
    "dflash2-tiny-b": dict(seed=2902, V=384, H=48, L=6, NH=4, NKV=2, HD=12, I=96, theta=1e7,
                           seqs=[41, 23, 30], n_anchor=[6, 3, 4], lossmask_holes=True,
                           D=3, DNH=3, DNKV=1, DHD=16, DI=80, layer_ids=[0, 2, 4], block=6, gamma=4.0,
                           conv_kernel=3, conv_group=8, top_k=12, rank=12,
                           output_multiplier=0.75, softcap=None, alpha=1.0, hot=16,
                           sample_temperature=1.3, sample_seed=11),
}

ADAM = dict(lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01, clip=1.0)
CODEBOOKS = ("predecessor_codebook", "successor_codebook")
# The top-level keys of the release's config.json (z-lab/dflash tests/fixtures/dflash2-config.json).
RELEASE_CONFIG_KEYS = (
    "architectures", "attention_bias", "attention_dropout", "bos_token_id", "dflash_config", "dtype",
    "eos_token_id", "head_dim", "hidden_act", "hidden_size", "initializer_range", "intermediate_size", "is_causal",
    "layer_types", "max_position_embeddings", "max_window_layers", "model_type", "num_attention_heads",
    "num_hidden_layers", "num_key_value_heads", "num_target_layers", "pad_token_id", "rms_norm_eps",
    "rope_parameters", "sliding_window", "tie_word_embeddings", "transformers_version", "use_cache",
    "use_sliding_window", "vocab_size")


# ------------------------------------------------------------------------------------------------------
# the official module
# ------------------------------------------------------------------------------------------------------
def load_official(path):
    """Imports the official dflash/model.py from `path` (shims for transformers versions that moved names)."""
    import transformers.models.qwen3.modeling_qwen3 as mq
    if not hasattr(mq, "GradientCheckpointingLayer"):
        from transformers.modeling_layers import GradientCheckpointingLayer
        mq.GradientCheckpointingLayer = GradientCheckpointingLayer
    if not hasattr(mq, "ALL_ATTENTION_FUNCTIONS"):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        mq.ALL_ATTENTION_FUNCTIONS = ALL_ATTENTION_FUNCTIONS
    if not os.path.isfile(path):
        sys.exit(f"official model file not found: {path}")
    spec = importlib.util.spec_from_file_location("dflash_official_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("DFlash2DraftModel", "GroupedDynamicCausalConv", "CandidateSelector"):
        if not hasattr(mod, name):
            sys.exit(f"{path} has no {name}: it is not the DFlash2 version of dflash/model.py")
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return mod, sha


def release_name(n):
    """Official named_parameters() name -> the release checkpoint's tensor name."""
    for cb in CODEBOOKS:
        if n == f"candidate_selector.{cb}.weight":
            return f"candidate_selector.{cb}"
    return n


def expected_release_names(D):
    names = ["fc.weight", "hidden_norm.weight", "norm.weight", "candidate_selector.hidden_projection.weight",
             "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook"]
    per = ["input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
           "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
           "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
           "attention_conv.base_kernel", "attention_conv.kernel_projection.weight", "mlp_conv.base_kernel",
           "mlp_conv.kernel_projection.weight"]
    return sorted(names + [f"layers.{i}.{p}" for i in range(D) for p in per])


def set_drafter_weights(model, g, c):
    """Every drafter parameter from the seeded generator, in name order (independent of transformers' init)."""
    kc = c["conv_kernel"]
    with torch.no_grad():
        for n, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            shape = tuple(p.shape)
            r = torch.randn(shape, generator=g, dtype=torch.float32)
            if n.endswith("norm.weight"):  # input/post_attention_layernorm, q/k_norm, norm, hidden_norm
                v = 1.0 + 0.2 * r
            elif n.endswith("base_kernel"):  # [2, k, H]: near the identity (tap 0 = 1), taps clearly nonzero
                v = 0.3 * r
                v[:, 0, :] += 1.0
                assert shape[1] == kc
            elif n.endswith("kernel_projection.weight"):
                v = 0.05 * r
            elif n.endswith("hidden_projection.weight"):
                v = 0.1 * r
            elif any(cb in n for cb in CODEBOOKS):
                v = 0.5 * r
            else:  # q/k/v/o, gate/up/down, fc
                v = 0.08 * r
            p.copy_(v.to(p.dtype))


def drafter_config(Qwen3Config, c, mask_id):
    V, H = c["V"], c["H"]
    dcfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=c["DI"], num_hidden_layers=c["D"],
                       num_attention_heads=c["DNH"], num_key_value_heads=c["DNKV"], head_dim=c["DHD"],
                       rms_norm_eps=1e-6, rope_theta=c["theta"], max_position_embeddings=4096,
                       tie_word_embeddings=False, initializer_range=0.08, attention_dropout=0.0)
    dcfg.layer_types = ["full_attention"] * c["D"]
    dcfg.sliding_window = None
    dcfg.use_sliding_window = False
    dcfg.is_causal = False
    dcfg.num_target_layers = c["L"]
    dcfg.dflash_config = {
        "block_size": c["block"],
        "conv_group_size": c["conv_group"],
        "conv_kernel_size": c["conv_kernel"],
        "final_logit_softcapping": c["softcap"],
        "mask_token_id": mask_id,
        "output_multiplier": c["output_multiplier"],
        "selector_rank": c["rank"],
        "selector_top_k": c["top_k"],
        "target_layer_ids": list(c["layer_ids"]),
    }
    dcfg.architectures = ["DFlash2DraftModel"]
    dcfg._attn_implementation = "eager"  # the official attention calls sdpa regardless
    return dcfg


def save_release(drafter, dcfg, outdir):
    """drafter_init/ in the release layout: config.json + model.safetensors (codebooks without .weight)."""
    from safetensors.torch import save_file
    os.makedirs(outdir, exist_ok=True)
    tensors = {release_name(n): p.detach().float().contiguous().clone() for n, p in drafter.named_parameters()}
    save_file(tensors, os.path.join(outdir, "model.safetensors"), metadata={"format": "pt"})
    full = dcfg.to_dict()
    cfg = {k: full[k] for k in RELEASE_CONFIG_KEYS if k in full}  # the fixture's keys, nothing else
    missing = sorted(set(RELEASE_CONFIG_KEYS) - set(cfg) - {"dtype", "is_causal", "transformers_version"})
    assert not missing, "config fields of the release fixture missing from the config: %s" % missing
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"] = dict(dcfg.dflash_config)
    cfg["dtype"] = "float32"
    cfg["is_causal"] = False
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True, default=str)
    return sorted(tensors)


def check_from_pretrained(off, outdir, drafter):
    """Loads drafter_init with the official from_pretrained (its key_mapping renames the codebooks)."""
    try:
        m = off.DFlash2DraftModel.from_pretrained(outdir, dtype=torch.float32)
    except TypeError:
        m = off.DFlash2DraftModel.from_pretrained(outdir, torch_dtype=torch.float32)
    ref = dict(drafter.named_parameters())
    got = dict(m.named_parameters())
    if sorted(ref) != sorted(got):
        return "parameter names differ: %s" % sorted(set(ref) ^ set(got))
    bad = [n for n in ref if not torch.equal(ref[n].detach().float(), got[n].detach().float())]
    return "ok" if not bad else "values differ: %s" % bad


# ------------------------------------------------------------------------------------------------------
# the selector objective (this project's reference; docs/dflash2.md "Training objective")
# ------------------------------------------------------------------------------------------------------
def training_candidates(z, labels, K, mode="insert"):
    """Unary top-K (descending). insert: the gold put into slot K-1 when missing (speculators'
    selector_training_candidates). strict: the top-K unchanged (SpecForge's _selector_chunk_terms); its
    gold index is argmax over no match = slot 0 where the gold is missing, as SpecForge's, and that row's CE
    is weighted 0 by the caller. -> cand, gold_index, covered."""
    top = torch.topk(z, K, dim=-1).indices
    match = top.eq(labels.unsqueeze(-1))
    covered = match.any(-1)
    if mode == "strict":
        return top, match.long().argmax(-1), covered
    assert mode == "insert", mode
    gold_index = torch.where(covered, match.long().argmax(-1), torch.full_like(labels, K - 1))
    cand = top.clone()
    cand[..., K - 1] = torch.where(covered, top[..., K - 1], labels)
    return cand, gold_index, covered


def selector_scores(z, h, pred, cand, P, S, Wh):
    """score[i] = z[cand_i] + < P[pred] * (Wh h), S[cand_i] >   (z: unary logits after multiplier/softcap)."""
    unary = z.gather(-1, cand)
    ctx = P[pred] * (h @ Wh.t())                      # [..., r]
    trans = (ctx.unsqueeze(-2) * S[cand]).sum(-1)     # [..., K]
    return unary + trans


def selector_ce(z, h, labels, pred, P, S, Wh, K, mode="insert"):
    """The per-row selector CE; strict: times covered (SpecForge's selector_loss_weights = loss_weights x
    target_is_candidate), and gold_index -1 where the gold is missing (this project's convention for "no
    selector term", include/dflash/drafter_ops.h)."""
    cand, gold_index, covered = training_candidates(z.detach(), labels, K, mode)
    scores = selector_scores(z, h, pred, cand, P, S, Wh)
    ce = -torch.log_softmax(scores, -1).gather(-1, gold_index.unsqueeze(-1)).squeeze(-1)
    if mode == "strict":
        ce = ce * covered.to(ce.dtype)
        gold_index = torch.where(covered, gold_index, torch.full_like(gold_index, -1))
    return ce, scores, cand, gold_index, covered


def selector_alpha(completed, alpha, warmup_ratio, ramp_ratio, total_steps):
    """SpecForge's schedule (specforge/training/torchtitan/runtime.py _selector_alpha): `completed` optimizer
    steps done before this one."""
    warmup = int(total_steps * warmup_ratio)
    if completed < warmup:
        return 0.0
    ramp = int(total_steps * ramp_ratio)
    if ramp <= 0:
        return alpha
    return alpha * min(max((completed - warmup + 1) / ramp, 0.0), 1.0)


def greedy_walk(z, h, anchor, P, S, Wh, K):
    """Own implementation of the serving walk (checked against the official select)."""
    top = torch.topk(z, K, dim=-1).indices                 # [N, B-1, K]
    proj = h @ Wh.t()
    prev = anchor.clone()
    path = []
    for k in range(z.shape[1]):
        s = z[:, k].gather(-1, top[:, k]) + ((P[prev] * proj[:, k]).unsqueeze(1) * S[top[:, k]]).sum(-1)
        prev = top[:, k].gather(-1, s.argmax(-1, keepdim=True)).squeeze(-1)
        path.append(prev)
    return torch.stack(path, 1)


# ------------------------------------------------------------------------------------------------------
# one case
# ------------------------------------------------------------------------------------------------------
def make_case(off, off_sha, off_path, outdir, name, c):
    import transformers
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    g = torch.Generator().manual_seed(c["seed"])
    torch.manual_seed(c["seed"])
    os.makedirs(outdir, exist_ok=True)
    V, H, L, B, K = c["V"], c["H"], c["L"], c["block"], c["top_k"]
    mask_id = V - 1
    assert H % c["conv_group"] == 0 and c["conv_kernel"] <= B and K <= V

    # ---------------- target ----------------
    tcfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=c["I"], num_hidden_layers=L,
                       num_attention_heads=c["NH"], num_key_value_heads=c["NKV"], head_dim=c["HD"],
                       rms_norm_eps=1e-6, rope_theta=c["theta"], max_position_embeddings=4096,
                       tie_word_embeddings=False, initializer_range=0.08, attention_dropout=0.0)
    tcfg._attn_implementation = "eager"
    target = Qwen3ForCausalLM(tcfg).float().eval()
    hot = torch.randperm(V - 1, generator=g)[: c["hot"]]  # frequent tokens with loud lm_head rows: the
    with torch.no_grad():                                  # gold lands inside the unary top-K at times
        for n, p in target.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
        target.lm_head.weight[hot] *= 4.0
    try:
        target.save_pretrained(os.path.join(outdir, "target"), safe_serialization=True)
    except TypeError:
        target.save_pretrained(os.path.join(outdir, "target"))
    target = target.double()

    seqs, masks = [], []
    for S_len in c["seqs"]:
        uni = torch.randint(0, V - 1, (S_len,), generator=g)
        pick = hot[torch.randint(0, len(hot), (S_len,), generator=g)]
        ids = torch.where(torch.rand(S_len, generator=g) < 0.5, pick, uni)
        lm = torch.ones(S_len, dtype=torch.long)
        lm[: max(2, S_len // 5)] = 0
        if c["lossmask_holes"] and S_len > 20:
            lm[S_len // 2: S_len // 2 + 3] = 0
        seqs.append(ids)
        masks.append(lm)

    captured = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
             for layer in target.model.layers]
    hid, fnorm, tlog = [], [], []
    with torch.no_grad():
        for ids in seqs:
            captured.clear()
            out = target(input_ids=ids[None], output_hidden_states=True)
            hs = torch.stack([h[0] for h in captured])
            for l in range(L - 1):
                assert torch.allclose(out.hidden_states[l + 1][0], hs[l]), "hidden_states indexing changed"
            hid.append(hs)
            fnorm.append(target.model.norm(hs[-1]))
            tlog.append(out.logits[0])
    for hk in hooks:
        hk.remove()
    hidden = torch.cat(hid, 1)
    tokens = torch.cat(seqs)
    loss_mask = torch.cat(masks)
    cu = [0]
    for S_len in c["seqs"]:
        cu.append(cu[-1] + S_len)
    embed = target.model.embed_tokens
    lm_head = target.lm_head
    for p in target.parameters():
        p.requires_grad_(False)

    # ---------------- drafter ----------------
    dcfg = drafter_config(Qwen3Config, c, mask_id)
    drafter = off.DFlash2DraftModel(dcfg).float().eval()
    names = sorted(release_name(n) for n, _ in drafter.named_parameters())
    assert names == expected_release_names(c["D"]), "official parameters differ from the release layout: %s" % (
        sorted(set(names) ^ set(expected_release_names(c["D"]))))
    set_drafter_weights(drafter, g, c)
    saved = save_release(drafter, dcfg, os.path.join(outdir, "drafter_init"))
    try:
        fp_check = check_from_pretrained(off, os.path.join(outdir, "drafter_init"), drafter)
    except Exception as e:  # recorded, not fatal: the goldens do not depend on it
        fp_check = "error: " + "".join(traceback.format_exception_only(type(e), e)).strip()
    print(name, "official from_pretrained of drafter_init:", fp_check)
    drafter = drafter.double()
    assert drafter.block_size == B and drafter.candidate_selector.top_k == K

    # anchors: as gen_golden.py (valid: loss_mask[p] and loss_mask[p+1]); one near the end of the last sequence
    anchors = []
    for i, S_len in enumerate(c["seqs"]):
        lm = masks[i]
        valid = [p for p in range(S_len - 1) if lm[p] and lm[p + 1]]
        perm = torch.randperm(len(valid), generator=g)[: c["n_anchor"][i]]
        anchors.append(sorted(valid[j] for j in perm.tolist()))
    last = len(c["seqs"]) - 1
    S_last = c["seqs"][last]
    if (S_last - 2) not in anchors[last] and masks[last][S_last - 2] and masks[last][S_last - 1]:
        anchors[last] = sorted(anchors[last][:-1] + [S_last - 2])

    # rows [N, B]
    lab, prd, w0l, seq_of, anc_of = [], [], [], [], []
    for i, S_len in enumerate(c["seqs"]):
        off_i = cu[i]
        ids = tokens[off_i:off_i + S_len]
        for a in anchors[i]:
            idx = a + torch.arange(B)
            inb = idx < S_len
            safe = idx.clamp(max=S_len - 1)
            lab.append(ids[safe])
            prd.append(ids[(idx - 1).clamp(min=a, max=S_len - 1)])  # k=0 -> anchor (unused), k>=1 -> a+k-1
            w0l.append(inb.double() * (torch.arange(B) > 0).double() * masks[i][safe].double())
            seq_of.append(i)
            anc_of.append(a)
    labels = torch.stack(lab)
    preds = torch.stack(prd)
    w0 = torch.stack(w0l)
    decay = torch.exp(-(torch.arange(B) - 1).clamp(min=0).double() / c["gamma"])[None]
    w = w0 * decay
    N = labels.shape[0]
    teacher_idx = torch.stack([cu[seq_of[n]] + (anc_of[n] + torch.arange(B) - 1).clamp(min=0, max=c["seqs"][seq_of[n]] - 1)
                               for n in range(N)])
    ver = torch.cat(tlog, 0)[teacher_idx]  # [N, B, V] target logits predicting token a+k

    def forward_blocks(model):
        outs = []
        for n in range(N):
            i, a = seq_of[n], anc_of[n]
            off_i = cu[i]
            ctx = torch.cat([hidden[l, off_i:off_i + a] for l in c["layer_ids"]], dim=-1)[None]
            noise_ids = torch.full((1, B), mask_id, dtype=torch.long)
            noise_ids[0, 0] = tokens[off_i + a]
            pos = torch.cat([torch.arange(a), a + torch.arange(B)])[None]
            outs.append(model(position_ids=pos, noise_embedding=embed(noise_ids), target_hidden=ctx)[0])
        return torch.stack(outs)  # [N, B, H]

    def selector_params(model):
        cs = model.candidate_selector
        return cs.predecessor_codebook.weight, cs.successor_codebook.weight, cs.hidden_projection.weight

    mode = c.get("candidates", "insert")

    def objective(model, alpha, stop_gradient=False, kind="ce", keep_graph=False):
        h = forward_blocks(model)
        z = model.compute_logits(h, lm_head)
        logq = torch.log_softmax(z, -1)
        den = w.sum()
        if kind == "ce":
            unary = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        else:
            logp = torch.log_softmax(ver, -1)
            unary = (logp.exp() * (logp - logq)).sum(-1)
        unary_num = (w * unary).sum()
        P, S, Wh = selector_params(model)
        zs, hs = (z.detach(), h.detach()) if stop_gradient else (z, h)
        sce, scores, cand, gold_index, covered = selector_ce(zs, hs, labels, preds, P, S, Wh, K, mode)
        sel_num = (w * sce).sum()
        # keep_graph (the schedule): alpha 0 still multiplies the term, so the selector gets zero gradients
        loss = (unary_num + alpha * sel_num) / den if (alpha or keep_graph) else unary_num / den
        return dict(loss=loss, unary=unary_num / den, sel=sel_num / den, h=h, z=z, scores=scores, cand=cand,
                    gold_index=gold_index, covered=covered, sce=sce)

    # ---------------- forward, metrics ----------------
    r = objective(drafter, c["alpha"])
    with torch.no_grad():
        h, z = r["h"], r["z"]
        P, S, Wh = selector_params(drafter)
        valid = w0 > 0
        nvalid = float(valid.sum())
        pred_u = z.argmax(-1)
        strict = torch.topk(z, K, dim=-1).indices
        s_strict = selector_scores(z, h, preds, strict, P, S, Wh)
        sel_tok = strict.gather(-1, s_strict.argmax(-1, keepdim=True)).squeeze(-1)
        covered = r["covered"]
        # the serving walk: official propose() on positions 1..B-1, the anchor token first
        anchor_tok = labels[:, 0]
        path, _, _ = drafter.propose(h[:, 1:], anchor_tok, lm_head, 0.0)
        own = greedy_walk(z[:, 1:], h[:, 1:], anchor_tok, P, S, Wh, K)
        assert torch.equal(path, own), "own greedy walk differs from the official select"
        torch.manual_seed(c["sample_seed"])
        spath, scand, sq = drafter.propose(h[:, 1:], anchor_tok, lm_head, float(c["sample_temperature"]))

        def lead_run(ok):  # leading run over k >= 1, rows without weight count as passed (gen_golden's streak)
            okk = ok | ~valid
            return torch.cumprod(okk[:, 1:].long(), dim=1) * valid[:, 1:].long()

        serve_ok = torch.cat([torch.zeros(N, 1, dtype=torch.bool), path == labels[:, 1:]], 1)
        per_pos = lambda m: ((m & valid).double().sum(0) / valid.double().sum(0).clamp(min=1)).tolist()
        metrics = dict(
            acc=float(((pred_u == labels) & valid).sum()) / nvalid,
            agree_with_target=float(((pred_u == ver.argmax(-1)) & valid).sum()) / nvalid,
            streak=float(lead_run(pred_u == labels).sum()) / N,
            candidate_recall=float((covered & valid).sum()) / nvalid,
            selector_acc=float(((sel_tok == labels) & valid).sum()) / nvalid,
            selector_acc_covered=float(((sel_tok == labels) & valid & covered).sum()) / max(1.0, float((valid & covered).sum())),
            serving_acc=float((serve_ok & valid).sum()) / nvalid,
            serving_streak=float(lead_run(serve_ok).sum()) / N,
            oracle_streak=float(lead_run(covered).sum()) / N,
            per_pos_acc=per_pos(pred_u == labels),
            per_pos_recall=per_pos(covered),
            per_pos_selector_acc=per_pos(sel_tok == labels),
            covered_rows=int((covered & valid).sum()), uncovered_rows=int((~covered & valid).sum()),
            valid_rows=int(nvalid), weight_sum=float(w.sum()),
        )
    if not 0 < metrics["covered_rows"] < metrics["valid_rows"]:
        print(name, "WARNING: the case has", metrics["covered_rows"], "covered of", metrics["valid_rows"],
              "rows: both kinds are wanted")

    golden = {
        "tokens": tokens.to(torch.int32), "loss_mask": loss_mask.to(torch.uint8),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "target.hidden": hidden.float(), "target.final_norm": torch.cat(fnorm, 0).float(),
        "target.logits": torch.cat(tlog, 0).float(),
        "fwd.hidden": h.float(), "fwd.logits": z.float(),
        "rows.label": labels.to(torch.int32), "rows.pred": preds.to(torch.int32),
        "rows.w0": w0.float(), "rows.w": w.float(),
        "sel.cand": r["cand"].to(torch.int32), "sel.gold_index": r["gold_index"].to(torch.int32),
        "sel.covered": r["covered"].to(torch.uint8), "sel.scores": r["scores"].detach().float(),
        "sel.ce": r["sce"].detach().float(),
        "serve.path": path.to(torch.int32), "serve.sample_path": spath.to(torch.int32),
        "serve.sample_cand": scand.to(torch.int32), "serve.sample_q": sq.float(),
    }

    # ---------------- gradients ----------------
    named = dict(drafter.named_parameters())
    case_grads = {}
    for obj, kw in (("ce", dict(alpha=0.0)), ("d2", dict(alpha=c["alpha"])),
                    ("d2sg", dict(alpha=c["alpha"], stop_gradient=True)), ("kl2", dict(alpha=c["alpha"], kind="kl"))):
        drafter.zero_grad(set_to_none=True)
        rr = objective(drafter, **kw)
        rr["loss"].backward()
        gn = math.sqrt(sum(float((p.grad ** 2).sum()) for p in named.values() if p.grad is not None))
        case_grads[obj] = dict(loss=rr["loss"].item(), unary=rr["unary"].item(), sel=rr["sel"].item(), grad_norm=gn)
        for n, p in named.items():
            gr = p.grad if p.grad is not None else torch.zeros_like(p)
            golden[f"grad.{obj}.{release_name(n)}"] = gr.float().clone()
    # stop-gradient: the backbone's gradients equal the unary-only ones, the selector's equal d2's
    for n in named:
        rn = release_name(n)
        if rn.startswith("candidate_selector."):
            assert torch.allclose(golden[f"grad.d2sg.{rn}"], golden[f"grad.d2.{rn}"], rtol=1e-5, atol=1e-7), rn
        else:
            assert torch.allclose(golden[f"grad.d2sg.{rn}"], golden[f"grad.ce.{rn}"], rtol=1e-5, atol=1e-7), rn

    # ---------------- two AdamW steps on d2 ----------------
    d2 = copy.deepcopy(drafter)
    opt = torch.optim.AdamW(d2.parameters(), lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]), eps=ADAM["eps"],
                            weight_decay=ADAM["weight_decay"])
    step_losses = []
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        rr = objective(d2, c["alpha"])
        step_losses.append(rr["loss"].item())
        rr["loss"].backward()
        torch.nn.utils.clip_grad_norm_(d2.parameters(), ADAM["clip"])
        opt.step()
    with torch.no_grad():
        step_losses.append(objective(d2, c["alpha"])["loss"].item())
    for n, p in d2.named_parameters():
        golden[f"after2.{release_name(n)}"] = p.detach().float().clone()

    # ---------------- the selector schedule (SpecForge's _selector_alpha), AdamW on d2 ----------------
    schedule = None
    if c.get("schedule"):
        sc = c["schedule"]
        ds = copy.deepcopy(drafter)
        opt_s = torch.optim.AdamW(ds.parameters(), lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]),
                                  eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
        alphas, losses = [], []
        for s in range(sc["steps"]):
            a = selector_alpha(s, c["alpha"], sc["warmup_ratio"], sc["ramp_ratio"], sc["total_steps"])
            opt_s.zero_grad(set_to_none=True)
            rr = objective(ds, a, keep_graph=True)
            alphas.append(a)
            losses.append(rr["loss"].item())
            rr["loss"].backward()
            torch.nn.utils.clip_grad_norm_(ds.parameters(), ADAM["clip"])
            opt_s.step()
        assert alphas[0] == 0.0 and 0.0 < alphas[1] < c["alpha"] and alphas[-1] == c["alpha"], alphas
        schedule = dict(total_steps=sc["total_steps"], warmup_ratio=sc["warmup_ratio"], ramp_ratio=sc["ramp_ratio"],
                        alphas=alphas, losses=losses,
                        doc="AdamW steps on d2 (constant lr) with alpha_s = SpecForge's _selector_alpha(s); "
                            "losses[s] before step s's update")

    # ---------------- op-level goldens ----------------
    golden.update(conv_op_golden(off, g, c))
    sel_op, sel_op_loss = selector_op_golden(g, c, mode)
    golden.update(sel_op)

    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(outdir, "golden.safetensors"))
    case = dict(
        name=name, transformers_version=transformers.__version__, torch_version=torch.__version__,
        official_model=dict(path=os.path.basename(off_path), sha256=off_sha,
                            source="z-lab/dflash dflash/model.py (the DFlash2 version; see docs/dflash2.md)"),
        official_from_pretrained=fp_check, release_tensors=saved,
        config={k: v for k, v in c.items()}, layer_ids=list(c["layer_ids"]), mask_token_id=mask_id,
        block_size=B, gamma=c["gamma"], selector_top_k=K, selector_rank=c["rank"],
        conv_kernel_size=c["conv_kernel"], conv_group_size=c["conv_group"],
        output_multiplier=c["output_multiplier"], final_logit_softcapping=c["softcap"],
        selector_loss_alpha=c["alpha"], sample_temperature=c["sample_temperature"], sample_seed=c["sample_seed"],
        anchors=anchors, num_blocks=N, adamw=ADAM, adamw_d2_losses=step_losses,
        loss_ce=case_grads["ce"]["loss"], loss_d2=case_grads["d2"]["loss"], loss_sel=case_grads["d2"]["sel"],
        loss_kl=case_grads["kl2"]["unary"], loss_kl2=case_grads["kl2"]["loss"],
        grad_norm={k: v["grad_norm"] for k, v in case_grads.items()}, objectives=case_grads,
        selector_op_loss=sel_op_loss, metrics=metrics, golden_layout=GOLDEN_DOC,
    )
    if mode != "insert":  # cases made before issue 47 have neither key: they inserted, with a constant alpha
        case["selector_candidates"] = mode
    if schedule:
        case["selector_schedule"] = schedule
    with open(os.path.join(outdir, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    print(name, "N=%d ce=%.6f sel=%.6f d2=%.6f kl2=%.6f acc=%.3f recall=%.3f sel_acc=%.3f serve_streak=%.3f "
          "gn_d2=%.4f adamw=%s" % (N, case["loss_ce"], case["loss_sel"], case["loss_d2"], case["loss_kl2"],
                                   metrics["acc"], metrics["candidate_recall"], metrics["selector_acc"],
                                   metrics["serving_streak"], case["grad_norm"]["d2"], step_losses))


def conv_op_golden(off, g, c):
    """One official GroupedDynamicCausalConv on nb blocks of B rows: prepare, finish and their gradients."""
    Hc, B, k, gs = c["H"], c["block"], c["conv_kernel"], c["conv_group"]
    nb = 3
    conv = off.GroupedDynamicCausalConv(Hc, k, gs).double()
    with torch.no_grad():
        base = 0.3 * torch.randn(2, k, Hc, generator=g, dtype=torch.float32)
        base[:, 0] += 1.0
        conv.base_kernel.copy_(base.double())
        conv.kernel_projection.weight.copy_(0.1 * torch.randn(conv.kernel_projection.weight.shape, generator=g).double())
    x = torch.randn(nb, B, Hc, generator=g, dtype=torch.float32).double().requires_grad_(True)
    u = torch.randn(nb, B, Hc, generator=g, dtype=torch.float32).double().requires_grad_(True)
    gy = torch.randn(nb, B, Hc, generator=g, dtype=torch.float32).double()
    gz = torch.randn(nb, B, Hc, generator=g, dtype=torch.float32).double()
    y, dyn_finish = conv.prepare(x)
    zz = conv.finish(u, dyn_finish)
    ((y * gy).sum() + (zz * gz).sum()).backward()
    dyn = conv.kernel_projection(x).view(nb, B, 2, k, Hc // gs)
    # the convolution is causal within the block: row 0 of a block sees no earlier row (cross-check)
    ref0 = (conv.base_kernel[0, 0] + dyn[:, 0, 0, 0].repeat_interleave(gs, -1)) * x[:, 0]
    assert torch.allclose(y[:, 0], ref0), "prepare at block row 0 is not the tap-0 product"
    out = {"op.conv.x": x, "op.conv.u": u, "op.conv.base_kernel": conv.base_kernel,
           "op.conv.kernel_projection": conv.kernel_projection.weight, "op.conv.dyn": dyn, "op.conv.y": y,
           "op.conv.z": zz, "op.conv.gy": gy, "op.conv.gz": gz, "op.conv.dx": x.grad, "op.conv.du": u.grad,
           "op.conv.dbase_kernel": conv.base_kernel.grad, "op.conv.dkernel_projection": conv.kernel_projection.weight.grad}
    return {kk: v.detach().float().clone() for kk, v in out.items()}


def selector_op_golden(g, c, mode="insert"):
    """The selector objective alone on random rows, with covered and inserted golds both present."""
    R, Hs, Vs, rk, K = 24, c["H"], 96, c["rank"], c["top_k"]
    f = lambda *s, sc=1.0: (sc * torch.randn(*s, generator=g, dtype=torch.float32)).double()
    h = f(R, Hs).requires_grad_(True)
    z = f(R, Vs, sc=2.0).requires_grad_(True)
    P = f(Vs, rk, sc=0.5).requires_grad_(True)
    S = f(Vs, rk, sc=0.5).requires_grad_(True)
    Wh = f(rk, Hs, sc=0.1).requires_grad_(True)
    pred = torch.randint(0, Vs, (R,), generator=g)
    label = torch.randint(0, Vs, (R,), generator=g)
    top = torch.topk(z.detach(), K, -1).indices
    for rr in range(0, R, 2):  # every other row: the gold inside the top-K, at a varying slot
        label[rr] = top[rr, (rr // 2) % K]
    wr = torch.rand(R, generator=g).double()
    wr[3] = 0.0  # a row without weight
    ce, scores, cand, gold_index, covered = selector_ce(z, h, label, pred, P, S, Wh, K, mode)
    loss = (wr * ce).sum()
    loss.backward()
    out = {"op.sel.h": h, "op.sel.z": z, "op.sel.P": P, "op.sel.S": S, "op.sel.Wh": Wh, "op.sel.w": wr,
           "op.sel.scores": scores, "op.sel.ce": ce, "op.sel.dh": h.grad, "op.sel.dz": z.grad, "op.sel.dP": P.grad,
           "op.sel.dS": S.grad, "op.sel.dWh": Wh.grad}
    res = {k: v.detach().float().clone() for k, v in out.items()}
    res.update({"op.sel.label": label.to(torch.int32), "op.sel.pred": pred.to(torch.int32),
                "op.sel.cand": cand.to(torch.int32), "op.sel.gold_index": gold_index.to(torch.int32),
                "op.sel.covered": covered.to(torch.uint8)})
    return res, loss.item()


def main(argv):
    if len(argv) < 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 2
    off_path, out = argv[1], argv[2]
    names = argv[3:] or list(CASES)
    for n in names:
        if n not in CASES:
            sys.exit(f"unknown case {n}; cases: {', '.join(CASES)}")
    torch.set_default_dtype(torch.float32)
    off, sha = load_official(off_path)
    for n in names:
        make_case(off, sha, off_path, os.path.join(out, n), n, CASES[n])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
