"""The qwen38-tiny-a golden case: a tiny Qwen3.8-27B-shaped target, computed by Hugging Face transformers
(Qwen3_5ForConditionalGeneration, the class of the Qwen3.8 release) in float64 on the CPU from float32
weights. Target only, like gen_golden.py's qwen35 case; nothing in it is the project's own code.

Qwen3.8-27B has Qwen3.6-27B's architecture and config keys (model_type qwen3_5, the text model under
text_config, its weights under model.language_model.). This case keeps the release's shape at a tiny width:
three Gated DeltaNet layers then one gated full-attention layer, twice; 6 query heads per KV head (24/4);
3 linear value heads per key head (48/16); partial RoPE 0.25 with an interleaved multimodal section
([3, 3, 2] here, [11, 11, 10] for head_dim 256); and the release's keys that leave the text forward
unchanged: output_gate_type "swish", mtp_num_hidden_layers, mtp_use_dedicated_embeddings,
mamba_ssm_dtype, full_attention_interval, language_model_only, a (tiny) vision tower.

Writes OUTDIR/qwen38-tiny-a/: target/ (config.json, model.safetensors, generation_config.json),
golden.safetensors (tokens, cu_seqlens, target.hidden [L, T, H], target.final_norm, target.logits),
case.json. Needs torch and transformers (5.17.0 made the committed case).

usage: python gen_golden_qwen38.py OUTDIR
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers.models.qwen3_5 import configuration_qwen3_5 as cq
from transformers.models.qwen3_5 import modeling_qwen3_5 as mm

SEED = 3808
V = 512                 # token ids drawn from [0, 500): the special ids below stay out of the text
SEQS = (31, 26)
LAYERS = 8              # (3 linear + 1 full) x 2, full_attention_interval 4


def make_config():
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(LAYERS)]
    text = dict(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                num_attention_heads=6, num_key_value_heads=1, head_dim=64,
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=6, layer_types=layer_types,
                full_attention_interval=4, hidden_act="silu", rms_norm_eps=1e-6,
                rope_parameters={"rope_theta": 1e7, "rope_type": "default", "partial_rotary_factor": 0.25,
                                 "mrope_interleaved": True, "mrope_section": [3, 3, 2]},
                partial_rotary_factor=0.25, attn_output_gate=True, output_gate_type="swish",
                mamba_ssm_dtype="float32", mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False,
                attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False,
                initializer_range=0.08, max_position_embeddings=4096, bos_token_id=510, eos_token_id=510,
                pad_token_id=None)
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                  patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[])
    cfg = cq.Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=505, video_token_id=506,
                           vision_start_token_id=503, vision_end_token_id=504, tie_word_embeddings=False,
                           language_model_only=False)
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    # Older releases drop these from text_config when they are HF defaults; the release keeps them.
    cfg.text_config.full_attention_interval = 4
    cfg.text_config.output_gate_type = "swish"
    cfg.text_config.mamba_ssm_dtype = "float32"
    cfg.text_config.mtp_num_hidden_layers = 1
    cfg.text_config.mtp_use_dedicated_embeddings = False
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    return cfg


def main(outroot):
    outdir = os.path.join(outroot, "qwen38-tiny-a")
    os.makedirs(outdir, exist_ok=True)
    g = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    model = mm.Qwen3_5ForConditionalGeneration(make_config()).float().eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n and "visual" not in n:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))  # zero-centred (1 + w) norms
            if n.endswith("A_log") or n.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
    model.save_pretrained(os.path.join(outdir, "target"), safe_serialization=True)
    cfg_path = os.path.join(outdir, "target", "config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    text = saved["text_config"]
    for key, want in (("output_gate_type", "swish"), ("mtp_num_hidden_layers", 1), ("mamba_ssm_dtype", "float32")):
        assert text.get(key) == want, (key, text.get(key))
    assert text["rope_parameters"].get("mrope_section") == [3, 3, 2], text["rope_parameters"]

    model = model.double()
    lm = model.model.language_model
    captured = []
    hooks = [layer.register_forward_hook(lambda m, i, o: captured.append(o[0] if isinstance(o, tuple) else o))
             for layer in lm.layers]
    toks, hid, fn, lg, cu = [], [], [], [], [0]
    with torch.no_grad():
        for S in SEQS:
            ids = torch.randint(0, 500, (S,), generator=g)
            captured.clear()
            out = model(input_ids=ids[None])
            hs = torch.stack([h[0] for h in captured])
            assert hs.shape == (LAYERS, S, 64), hs.shape
            toks.append(ids); hid.append(hs); fn.append(lm.norm(hs[-1])); lg.append(out.logits[0])
            cu.append(cu[-1] + S)
    for h in hooks:
        h.remove()
    golden = {"tokens": torch.cat(toks).to(torch.int32), "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
              "target.hidden": torch.cat(hid, 1).float(), "target.final_norm": torch.cat(fn, 0).float(),
              "target.logits": torch.cat(lg, 0).float()}
    save_file({k: v.contiguous() for k, v in golden.items()}, os.path.join(outdir, "golden.safetensors"))
    with open(os.path.join(outdir, "case.json"), "w") as f:
        json.dump(dict(name="qwen38-tiny-a", transformers_version=transformers.__version__, seqs=list(SEQS),
                       torch_version=torch.__version__, generator="gen_golden_qwen38.py"), f, indent=1)
        f.write("\n")
    print("qwen38-tiny-a ok:", sorted(os.listdir(outdir)), sorted(os.listdir(os.path.join(outdir, "target"))))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    torch.set_default_dtype(torch.float32)
    main(sys.argv[1])
