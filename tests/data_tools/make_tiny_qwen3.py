#!/usr/bin/env python3
"""make_tiny_qwen3.py TOKENIZER_DIR OUTDIR: a tiny random-weight Qwen3 (hidden 32, 2 layers) built with
transformers (Qwen3Config + save_pretrained, seeded), its vocabulary the tokenizer's, the tokenizer copied
beside it: dflash-regenerate's test target. Nothing downloaded. Needs torch."""
import sys


def main():
    tok_dir, out = sys.argv[1], sys.argv[2]
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=1024,
                      tie_word_embeddings=False, eos_token_id=eos, bos_token_id=None,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():  # peaked predictions, so greedy decoding is not a coin toss between near-ties
        model.lm_head.weight.mul_(20.0)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    print(f"tiny Qwen3 (vocab {len(tok)}) -> {out}")


if __name__ == "__main__":
    main()
