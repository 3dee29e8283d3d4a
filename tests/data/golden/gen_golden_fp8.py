"""FP8 golden (issue 46 item 2): the golden tiny targets run with transformers' fine-grained FP8 arithmetic.

For each case (qwen3-tiny-a dense, qwen35-tiny-a hybrid) this loads the committed float32 target with HF
transformers on the CPU in float32, quantizes every decoder-layer nn.Linear's weight to the fine-grained
format (128x128 blocks, transformers' `Fp8Quantize` rule; docs/fp8.md) -- except the hybrid's in_proj_a /
in_proj_b, which `--target-precision fp8` keeps (embedding, norms and lm_head are not decoder linears) --,
dequantizes it with transformers' own `_dequantize_fp8_weight`, and replaces each such linear's forward by
`act_quant_qdq(x) @ dequant(W)^T` (act_quant: per token, per group of 128 input channels, s = amax / 448,
q = e4m3(clamp(x / s, +-448)), x_hat = q * s; an all-zero group gives zeros). It runs the case's own tokens
(golden.safetensors `tokens`, `cu_seqlens`), one sequence at a time, and writes <case>/fp8.safetensors:
  fp8.hidden     [L, T, H] float32, each decoder layer's output (the layout of golden.safetensors' target.hidden)
  fp8.final_norm [T, H]    float32, the final norm of the last layer's output
and <case>/fp8.json (provenance, the rule, the quantized modules).

Why float32, not float64 as the other goldens: the C++ CPU backend runs FP8 in float32, and an activation
whose x / s lies on an e4m3 rounding boundary rounds to the neighbouring code under another dtype (one e4m3
step is 6 % of the value); the quantizers are computed in float32 by transformers too (`Fp8Quantize` casts to
float32; act_quant runs in the kernel's float32).

transformers' FP8 GEMM kernels (Triton / DeepGEMM, fetched from the hub, CUDA only) are not run: the
reference GEMM is float32 torch on the dequantized operands, which is what those kernels compute up to their
accumulation order.

usage: python gen_golden_fp8.py GOLDEN_DIR [CASE ...]   (default: both cases)
       python gen_golden_fp8.py --bf16-check GOLDEN_DIR [CASE ...]
The second form writes nothing: it runs the same model code and FP8 arithmetic with the model in bf16 (weights
quantized from their bf16 values, each quantized linear's input and output bf16, as a bf16 GPU forward has
them) and prints, per layer, its relative L2 error against fp8.safetensors and the ratio r of its distance from
the same bf16 model unquantized to the golden's distance from golden.safetensors' target.hidden: what
dflash-selftest's CUDA rows fp8.hidden[l] and fp8.shift are calibrated by (src/selftest/fp8_case.cpp).
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

E4M3 = torch.float8_e4m3fn
E4M3_MAX = torch.finfo(E4M3).max  # 448
BLOCK = 128
CASES = ("qwen3-tiny-a", "qwen35-tiny-a")
KEEP = ("in_proj_a", "in_proj_b")  # the hybrid's [nv, H] gates: bf16 under --target-precision fp8


def quantize_blocks(w):
    """transformers' Fp8Quantize._quantize_one, for shapes that need not divide 128: blocks at the edges are
    smaller (zero padding leaves their amax alone). Returns (codes e4m3 [out, in], weight_scale_inv float32
    [ceil(out/128), ceil(in/128)])."""
    rows, cols = w.shape
    rt, ct = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.zeros(rt * BLOCK, ct * BLOCK, dtype=torch.float32)
    padded[:rows, :cols] = w.to(torch.float32)
    blocks = padded.reshape(rt, BLOCK, ct, BLOCK)
    max_abs = blocks.abs().amax(dim=(-3, -1))
    safe_max_abs = torch.where(max_abs > 0, max_abs, torch.ones_like(max_abs))
    scales = E4M3_MAX / safe_max_abs
    scales = torch.where(max_abs > 0, scales, torch.ones_like(scales))
    inv_scales = (1.0 / scales).to(torch.float32)
    scaled = blocks * scales.unsqueeze(-1).unsqueeze(-3)
    codes = torch.clamp(scaled, min=-E4M3_MAX, max=E4M3_MAX).to(E4M3).reshape(rt * BLOCK, ct * BLOCK)
    return codes[:rows, :cols].contiguous(), inv_scales


def act_quant_qdq(x):
    """act_quant's arithmetic, quantized then dequantized: per token, per group of 128 channels."""
    shape = x.shape
    cols = shape[-1]
    ng = -(-cols // BLOCK)
    x2 = x.reshape(-1, cols).to(torch.float32)
    padded = torch.zeros(x2.shape[0], ng * BLOCK, dtype=torch.float32)
    padded[:, :cols] = x2
    g = padded.reshape(-1, ng, BLOCK)
    s = g.abs().amax(dim=-1, keepdim=True) / E4M3_MAX
    q = torch.clamp(g / torch.where(s > 0, s, torch.ones_like(s)), -E4M3_MAX, E4M3_MAX).to(E4M3)
    xhat = torch.where(s > 0, q.to(torch.float32) * s, torch.zeros_like(g))
    return xhat.reshape(-1, ng * BLOCK)[:, :cols].reshape(shape)


def to_fp8(model):
    """Replaces every decoder-layer linear (but KEEP) by the emulated FP8 linear; returns their names. The
    arithmetic is float32; the linear's output has the model's dtype."""
    done = []
    for name, mod in model.model.layers.named_modules():
        if not isinstance(mod, torch.nn.Linear) or name.rsplit(".", 1)[-1] in KEEP:
            continue
        codes, inv = quantize_blocks(mod.weight.detach())
        w_hat = _dequantize_fp8_weight(codes, inv, [BLOCK, BLOCK], torch.float32)
        assert mod.bias is None
        mod.forward = (lambda w, dt: (lambda x: (act_quant_qdq(x) @ w.t()).to(dt)))(w_hat, mod.weight.dtype)
        done.append("model.layers." + name)
    return done


def load_model(cdir, dtype):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(cdir, "target"), dtype=torch.float32)
    model.config._attn_implementation = "eager"
    return model.to(dtype).eval()


def forward(model, gold):
    """Every decoder layer's output [L, T, H] and the final norm [T, H] (float32) on the case's tokens, one
    sequence at a time."""
    tokens, cu = gold["tokens"].long(), gold["cu_seqlens"].tolist()
    captured = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
             for layer in model.model.layers]
    hid, fn = [], []
    with torch.no_grad():
        for a, b in zip(cu[:-1], cu[1:]):
            captured.clear()
            model(input_ids=tokens[a:b][None])
            hs = torch.stack([h[0] for h in captured])  # [L, S, H]
            hid.append(hs)
            fn.append(model.model.norm(hs[-1]))
    for h in hooks:
        h.remove()
    return torch.cat(hid, 1).float(), torch.cat(fn, 0).float()


def bf16_check(golden_dir, case):
    cdir = os.path.join(golden_dir, case)
    gold = load_file(os.path.join(cdir, "golden.safetensors"))
    ref = load_file(os.path.join(cdir, "fp8.safetensors"))
    plain_h, plain_n = forward(load_model(cdir, torch.bfloat16), gold)
    fp8_model = load_model(cdir, torch.bfloat16)
    to_fp8(fp8_model)
    h, n = forward(fp8_model, gold)
    rel = lambda a, b: float((a - b).norm() / b.norm())
    rows = [(h[l], plain_h[l], ref["fp8.hidden"][l], gold["target.hidden"][l]) for l in range(h.shape[0])]
    rows.append((n, plain_n, ref["fp8.final_norm"], gold["target.final_norm"]))
    print(case, "(bf16 model, the golden's FP8 arithmetic; the last column is the final norm)")
    print("  error vs fp8.safetensors:", " ".join("%.4f" % rel(a, r) for a, _, r, _ in rows))
    print("  r (shift / golden shift):", " ".join("%.3f" % (float((a - p).norm()) / float((r - g).norm()))
                                                   for a, p, r, g in rows))


def make(golden_dir, case):
    cdir = os.path.join(golden_dir, case)
    model = load_model(cdir, torch.float32)
    quantized = to_fp8(model)
    gold = load_file(os.path.join(cdir, "golden.safetensors"))
    hidden, final_norm = forward(model, gold)
    bf16 = gold["target.hidden"].float()
    rel = float((hidden - bf16).norm() / bf16.norm())
    save_file({"fp8.hidden": hidden.contiguous(), "fp8.final_norm": final_norm.contiguous()},
              os.path.join(cdir, "fp8.safetensors"))
    note = dict(
        case=case, torch_version=torch.__version__, transformers_version=transformers.__version__,
        dtype="float32 on the CPU", script="tests/data/golden/gen_golden_fp8.py",
        weights="per 128x128 block (edge blocks smaller): scale = 448 / amax (1 for an all-zero block), "
                "codes = float8_e4m3fn(clamp(w * scale, +-448)), weight_scale_inv = 1 / scale; dequantized by "
                "transformers.integrations.finegrained_fp8._dequantize_fp8_weight",
        activations="per token, per group of 128 input channels: s = amax / 448, "
                    "codes = float8_e4m3fn(clamp(x / s, +-448)), input = codes * s (0 for an all-zero group)",
        gemm="float32 torch matmul of the dequantized operands (transformers' CUDA FP8 kernels are not run)",
        kept_unquantized="embedding, norms, lm_head, and the decoder linears named " + "/".join(KEEP),
        quantized_linears=quantized,
        tensors={"fp8.hidden": list(hidden.shape), "fp8.final_norm": list(final_norm.shape)},
        relative_l2_to_target_hidden=rel)
    with open(os.path.join(cdir, "fp8.json"), "w") as f:
        json.dump(note, f, indent=1)
    print(case, "linears quantized:", len(quantized), "relative L2 to the unquantized hidden: %.4g" % rel)


if __name__ == "__main__":
    torch.manual_seed(0)
    args = sys.argv[1:]
    run = make
    if args and args[0] == "--bf16-check":
        run, args = bf16_check, args[1:]
    for c in args[1:] or CASES:
        run(args[0], c)
