#!/usr/bin/env python3
"""make_tiny_tokenizer.py OUTDIR [--template chatml|qwen3|qwen38|generation] [--vocab N]

A tiny byte-level BPE tokenizer trained here with the `tokenizers` library (nothing downloaded), saved as a
transformers PreTrainedTokenizerFast with a Jinja chat template: what dflash-tokenize's tests use as "the
target's tokenizer". Its ids stay below --vocab (default 400), so they fit dflash-make-tiny's 512-token target.
Templates: chatml (prefix-stable), qwen3 (Qwen3's rules: the empty <think></think> block on the last assistant
turn only, enable_thinking=false in the generation prompt -- not prefix-stable), qwen38 (Qwen3.8's
reasoning_effort and preserve_thinking variables), generation (chatml with {% generation %} tags, for
return_assistant_tokens_mask)."""
import argparse
import os

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

CHATML = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

GENERATION = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")

QWEN3 = (
    "{%- set ns = namespace(last_query_index=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' "
    "+ content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}")

# Qwen3.8's rules (its released template without tools and images, the instructions shortened):
# reasoning_effort xhigh (the default) or low writes a system instruction, medium none; an assistant turn's
# reasoning_content goes in its <think> block, which every turn has while preserve_thinking is true (the
# default) and only the turns after the last user message have when it is false; enable_thinking=false
# closes the think block in the generation prompt.
QWEN38 = (
    "{%- set effort = reasoning_effort if reasoning_effort is defined else 'xhigh' %}"
    "{%- set thinking = not (enable_thinking is defined and enable_thinking is false) %}"
    "{%- set keep = not (preserve_thinking is defined and preserve_thinking is false) %}"
    "{%- set ns = namespace(last_query_index=-1, instr='') %}"
    "{%- if thinking and effort == 'xhigh' %}{%- set ns.instr = 'Reasoning effort is set to xhigh.' %}"
    "{%- elif thinking and effort == 'low' %}{%- set ns.instr = 'Reasoning effort is set to low.' %}"
    "{%- elif thinking and effort != 'medium' %}{{- raise_exception('Unexpected reasoning effort ' + effort) }}"
    "{%- endif %}"
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\n' + (ns.instr + '\n\n' if ns.instr else '') + messages[0].content + '<|im_end|>\n' }}"
    "{%- elif ns.instr %}{{- '<|im_start|>system\n' + ns.instr + '<|im_end|>\n' }}{%- endif %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query_index = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' }}"
    "{%- if keep or loop.index0 > ns.last_query_index %}"
    "{%- set r = (message.reasoning_content or '').strip() %}"
    "{{- '<think>\n' + (r + '\n' if r else '\n') + '</think>\n\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if thinking %}{{- '<think>\n' }}{%- else %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}"
    "{%- endif %}")

TEMPLATES = {"chatml": CHATML, "qwen3": QWEN3, "qwen38": QWEN38, "generation": GENERATION}

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Please write a short poem about the sea and the sky.",
    "def add(a, b):\n    return a + b\n",
    "Two plus two is four. Three times three is nine.",
    "You are a helpful assistant. Answer the question briefly.",
    "Hello! How can I help you today? Tell me a story about a dragon.",
    "Sure, here is a list: apples, oranges, bananas, and pears.",
    "Let me think step by step about the question before answering.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--template", choices=sorted(TEMPLATES), default="chatml")
    ap.add_argument("--vocab", type=int, default=400)
    a = ap.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    assert tok.get_vocab_size() <= a.vocab, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATES[a.template]
    os.makedirs(a.out, exist_ok=True)
    fast.save_pretrained(a.out)
    print(f"tokenizer ({a.template}, {len(fast)} tokens) -> {a.out}")


if __name__ == "__main__":
    main()
