#!/usr/bin/env python3
"""A PyTorch reference DFlash trainer: SpecForge's DFlash online recipe as its code does it, on one GPU, for a
list of GPU-time budgets, saving a release-format drafter at each (what dflash-eval --drafter loads).

What it follows (sgl-project/SpecForge: scripts/train_dflash.py before the runtime refactor, OnlineDFlashModel,
BF16Optimizer, CosineAnnealingWarmupLR, examples/configs/qwen3-8b-dflash-online.yaml):
  - the target runs online in this process: frozen, bf16, the layers build_target_layer_ids picks captured
    (--target-forward truncated: forward hooks, stop after the last captured layer; full: the whole model with
    output_hidden_states, as SpecForge's HF target engine);
  - batches of --batch-size (4) records of <= --max-length (1024 here; the recipe's 3072) tokens, padded to the
    longest, shuffled per epoch (DistributedSampler: randperm seeded seed + epoch); records with fewer than
    2 x block_size loss tokens dropped (SpecForge's filter);
  - per-sequence anchors (--num-anchors 512, [B, N]), flex_attention with create_block_mask, block 16, mask
    token 151669, loss weights exp(-(k-1)/gamma) with gamma 7, lm_head + CE in chunks of 128 blocks under
    checkpointing (bench/quality/dflash_ref.py);
  - the drafter in bf16 with fp32 master weights (BF16Optimizer): grad norm over the bf16 grads, clip
    coefficient min(1, max_norm / (norm + 1e-6)), torch.optim.AdamW with its defaults (betas 0.9 / 0.999,
    eps 1e-8) and weight decay 0, lr 6e-4, linear warmup over 4% of the steps then cosine to 0;
  - initialisation N(0, 0.02) for linears, 1 for norms (Qwen3PreTrainedModel._init_weights via post_init).
A time budget has no step count, and the schedule needs one: before training, --calib-steps steps run on a
throw-away copy of the drafter (this also compiles flex_attention; RNG states are restored afterwards), and
the run plans total_steps = max budget / median step time (--total-steps N overrides). Training time is the
sum of CUDA-synchronised step times (data, target forward, drafter forward/backward, optimizer); saving and
calibration are outside it. At the first step whose cumulative time reaches a budget, the drafter is saved to
OUT/budget-XXXXs/ with train_stats.json (steps, sequences, tokens, anchors, seconds); the run ends at the last
budget or after total_steps (the remaining budgets then get the final drafter, with its real seconds).

  python3 bench/quality/ref_train_dflash.py --target T --data train.h5 --out OUT --budgets 60,120,240
CPU test (tiny): --device cpu --attention sdpa --budgets 1000 --total-steps 4 --calib-steps 0
"""
import argparse
import copy
import hashlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash_ref as R  # noqa: E402


class BF16AdamW:
    """SpecForge's BF16Optimizer: AdamW over fp32 master copies of the bf16 parameters, clipping on the bf16 grads."""

    def __init__(self, params, lr, max_grad_norm, weight_decay=0.0):
        self.params = [p for p in params if p.requires_grad]
        self.masters = [p.detach().clone().to(torch.float32).requires_grad_(True) for p in self.params]
        self.opt = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay)
        self.max_grad_norm = max_grad_norm

    def step(self, lr):
        grads = [p.grad.detach() for p in self.params if p.grad is not None]
        norm = torch.stack([g.float().square().sum() for g in grads]).sum().sqrt()
        coef = torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.detach().to(torch.float32).mul_(coef)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.opt.zero_grad()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.data.copy_(m.data.to(p.dtype))
                p.grad = None
        return norm


def batches(records, batch_size, seed, epoch):
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(len(records), generator=g).tolist()
    for i in range(0, len(order), batch_size):
        yield [records[j] for j in order[i:i + batch_size]]


def collate(recs, device):
    """DataCollatorWithPadding: zero-pad to the longest record of the batch."""
    S = max(len(ids) for ids, _ in recs)
    ids = torch.zeros(len(recs), S, dtype=torch.long)
    mask = torch.zeros(len(recs), S, dtype=torch.float32)
    att = torch.zeros(len(recs), S, dtype=torch.long)
    for i, (x, m) in enumerate(recs):
        ids[i, :len(x)], mask[i, :len(x)], att[i, :len(x)] = x, m, 1
    nb = device.type == "cuda"
    return ids.to(device, non_blocking=nb), mask.to(device, non_blocking=nb), att.to(device, non_blocking=nb)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 24), b""):
            h.update(chunk)
    return h.hexdigest()


def target_identity(target_dir):
    """The target's weights hash (train_target.py writes it into train_info.json) so the summary can tell a
    drafter trained on another build of the target."""
    p = os.path.join(target_dir, "train_info.json")
    if os.path.exists(p):
        with open(p) as f:
            return json.load(f).get("weights_sha256")
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="HF Qwen3 checkpoint (train_target.py's output)")
    ap.add_argument("--data", required=True, help="token dataset (docs/data.md), dflash-tokenize's output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budgets", default="60,120,240", help="GPU seconds of training at which to save a drafter")
    ap.add_argument("--draft-layers", type=int, default=2)
    ap.add_argument("--target-layers", default="", help="L1,L2,... (default: build_target_layer_ids)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--mask-token", type=int, default=R.QWEN3_MASK_TOKEN)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--num-anchors", type=int, default=512)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--chunk-blocks", type=int, default=128)
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup-ratio", type=float, default=0.04)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--total-steps", type=int, default=0, help="the schedule's steps (0: planned from --calib-steps)")
    ap.add_argument("--calib-steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--attention", default="flex", choices=["flex", "sdpa"], help="sdpa: CPU tests only")
    ap.add_argument("--compile-block-mask", action="store_true", help="create_block_mask(_compile=True); SpecForge does not")
    ap.add_argument("--target-forward", default="truncated", choices=["truncated", "full"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
                    help="target and drafter dtype (float32: CPU tests only, where bf16 matmuls crawl)")
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args()

    dev = torch.device(args.device)
    if args.attention == "flex":
        # Records and anchor counts vary, so flex_attention sees new shapes: after the first recompile dynamo marks
        # them dynamic; a larger recompile budget keeps a rare extra shape from falling back to the unfused eager
        # path (SpecForge keeps torch's default, so this can only help the reference).
        import torch._dynamo as dynamo
        for name in ("cache_size_limit", "recompile_limit"):
            if hasattr(dynamo.config, name):
                setattr(dynamo.config, name, max(64, getattr(dynamo.config, name)))
    budgets = sorted(float(b) for b in args.budgets.split(",") if b.strip())
    torch.manual_seed(args.seed)  # accelerate's set_seed, as SpecForge's script
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(args.seed)

    from transformers import Qwen3ForCausalLM
    with open(os.path.join(args.target, "config.json")) as f:
        tcfg = json.load(f)
    dtype = getattr(torch, args.dtype)
    target = Qwen3ForCausalLM.from_pretrained(args.target, dtype=dtype).to(dev).eval()
    target.requires_grad_(False)
    ids = [int(x) for x in args.target_layers.split(",") if x.strip()] or None
    dcfg = R.drafter_config(tcfg, args.draft_layers, args.block_size, args.mask_token, ids)
    layer_ids = dcfg["dflash_config"]["target_layer_ids"]
    feats = R.TargetFeatures(target, layer_ids, args.target_forward)

    with torch.device(dev):
        drafter = R.DFlashDrafter(dcfg)
    inv_freq = drafter.rotary_emb.inv_freq.clone()
    drafter = drafter.to(dtype)  # DFlashDraftModel(...).to(dtype=torch.bfloat16)
    # .to() casts RoPE's inv_freq buffer to bf16 too (SpecForge's drafter trains with it so); dflash-eval and the
    # serving engines use fp32 frequencies, so keep them: a deviation that can only help the reference.
    drafter.rotary_emb.inv_freq = inv_freq
    model = R.OnlineDFlash(drafter, target.model.embed_tokens, target.lm_head, args.num_anchors, args.gamma,
                           args.chunk_blocks, args.attention, args.compile_block_mask)
    nparams = sum(p.numel() for p in drafter.parameters())
    print(f"[ref] target {args.target}: {tcfg['num_hidden_layers']} layers, hidden {tcfg['hidden_size']}; drafter "
          f"{args.draft_layers} layers, {nparams / 1e6:.1f} M parameters, target layers {layer_ids}; attention "
          f"{args.attention}, target forward {args.target_forward}; torch {torch.__version__}", flush=True)

    records = [(x[:args.max_length], m[:args.max_length]) for x, m in R.read_token_dataset(args.data)]
    n0 = len(records)
    records = [r for r in records if float(r[1].sum()) >= 2 * args.block_size]
    print(f"[ref] data {args.data}: {n0} records, {len(records)} with >= {2 * args.block_size} loss tokens", flush=True)

    def run_step(m, opt, recs, lr):
        input_ids, loss_mask, att = collate(recs, dev)
        hs = feats(input_ids, att)
        loss, acc, st = m(input_ids, hs, loss_mask)
        loss.backward()
        norm = opt.step(lr)
        return loss, acc, norm, st, int(att.sum().item()), int(att.numel())

    # ---- calibration: the step time on a throw-away copy, to plan the schedule's steps ---------------------
    calib = []
    if args.total_steps <= 0 and args.calib_steps > 0:
        cpu_rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if dev.type == "cuda" else None
        dcopy = copy.deepcopy(drafter)
        mcopy = R.OnlineDFlash(dcopy, target.model.embed_tokens, target.lm_head, args.num_anchors, args.gamma,
                               args.chunk_blocks, args.attention, args.compile_block_mask)
        ocopy = BF16AdamW(dcopy.parameters(), args.lr, args.max_grad_norm, args.weight_decay)
        it = batches(records, args.batch_size, args.seed + 1000003, 0)
        for i in range(args.calib_steps):
            recs = next(it, None)
            if recs is None:
                it = batches(records, args.batch_size, args.seed + 1000003, i)
                recs = next(it)
            sync(dev)
            t0 = time.perf_counter()
            run_step(mcopy, ocopy, recs, args.lr * 0.01)
            sync(dev)
            calib.append(time.perf_counter() - t0)
        del dcopy, mcopy, ocopy
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        steady = calib[2:] if len(calib) > 4 else calib
        total_steps = max(1, int(budgets[-1] / statistics.median(steady)))
        print(f"[ref] calibration: {len(calib)} steps, first {calib[0]:.2f} s (compile), median "
              f"{statistics.median(steady) * 1e3:.1f} ms -> {total_steps} steps planned for {budgets[-1]:.0f} s", flush=True)
    else:
        total_steps = max(1, args.total_steps or 1)
    warmup = int(args.warmup_ratio * total_steps)

    opt = BF16AdamW(drafter.parameters(), args.lr, args.max_grad_norm, args.weight_decay)
    os.makedirs(args.out, exist_ok=True)
    steps_log = open(os.path.join(args.out, "steps.csv"), "w")
    steps_log.write("step,seconds,loss,acc,lr,grad_norm,tokens,padded_tokens,anchors,blocks\n")
    tsha = target_identity(args.target)
    snaps = []
    seconds = 0.0
    step = seqs = tokens = padded = anchors = 0
    epoch = 0
    it = batches(records, args.batch_size, args.seed, epoch)
    bi = 0
    recent = []
    drafter.train()

    def snapshot(budget):
        st = {"trainer": "reference (SpecForge DFlash online recipe, PyTorch)", "budget_s": budget,
              "seconds": seconds, "steps": step, "sequences": seqs, "tokens": tokens, "padded_tokens": padded,
              "anchors": anchors, "epochs": epoch + bi / max(1, (len(records) + args.batch_size - 1) // args.batch_size),
              "loss_recent": statistics.mean(r[0] for r in recent) if recent else None,
              "acc_recent": statistics.mean(r[1] for r in recent) if recent else None,
              "total_steps": total_steps, "warmup_steps": warmup, "target_sha256": tsha}
        d = os.path.join(args.out, f"budget-{int(round(budget)):04d}s")
        R.save_drafter(drafter, d, st)
        snaps.append(dict(st, dir=d))
        print(f"[ref] saved {d}: {step} steps, {seconds:.1f} s, {tokens} tokens, {anchors} anchors", flush=True)

    while budgets and step < total_steps:
        recs = next(it, None)
        if recs is None:
            epoch += 1
            it = batches(records, args.batch_size, args.seed, epoch)
            bi = 0
            continue
        bi += 1
        lr = R.lr_at(step, args.lr, total_steps, warmup)
        sync(dev)
        t0 = time.perf_counter()
        loss, acc, norm, st, ntok, npad = run_step(model, opt, recs, lr)
        sync(dev)
        dt = time.perf_counter() - t0
        seconds += dt
        step += 1
        seqs += len(recs)
        tokens += ntok
        padded += npad
        anchors += st["anchors"]
        lv, av, gn = float(loss.item()), float(acc.item()), float(norm.item())
        recent = (recent + [(lv, av)])[-50:]
        steps_log.write(f"{step},{seconds:.4f},{lv:.5f},{av:.5f},{lr:.6e},{gn:.4f},{ntok},{npad},{st['anchors']},{st['blocks']}\n")
        if step % args.log_every == 0 or step == 1:
            print(f"[ref] step {step}/{total_steps} {seconds:.1f}s loss {lv:.4f} acc {av:.3f} lr {lr:.2e} "
                  f"grad_norm {gn:.3f} ({dt * 1e3:.0f} ms, {st['anchors']} anchors, {ntok} tokens)", flush=True)
        while budgets and seconds >= budgets[0]:
            snapshot(budgets.pop(0))
    while budgets:  # total_steps came first: the remaining budgets get the final drafter
        snapshot(budgets.pop(0))
    steps_log.close()
    run = {"trainer": "reference", "args": vars(args), "drafter_config": dcfg, "params": nparams,
           "calibration_s": calib, "total_steps": total_steps, "warmup_steps": warmup, "snapshots": snaps,
           "target_sha256": tsha, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump(run, f, indent=2)
    print(f"[ref] done: {step} steps in {seconds:.1f} s of training", flush=True)


if __name__ == "__main__":
    main()
