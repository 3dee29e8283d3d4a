"""tools/dflash-regenerate (transformers backend) on a tiny random Qwen3 built here (make_tiny_qwen3.py):
every assistant turn replaced by the target's greedy answer, prompts kept, output ready for dflash-tokenize.
TemplateWork needs no torch: the prompts' chat template is metered, and a template past its limits is a bad
line found before any model is loaded."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import unittest

from common import (HERE, REGENERATE, TOKENIZE, ENV, TempDir, limit_address_space, make_tokenizer, records, run,
                    write_jsonl)

HAVE_TORCH = importlib.util.find_spec("torch") is not None
NO_TORCH = ("no torch here: DFLASH_TORCH=1 tools/setup.sh adds it (PyPI's wheel brings ~5 GB of CUDA libraries); "
            "the template-work tests ran without it")
# Three nested range(1000) loops: 1e9 iterations, a render that never ends unless the meter stops it.
RUNAWAY = ("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}x"
           "{% endfor %}{% endfor %}{% endfor %}")
CHATML = ("{%- for message in messages %}{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def with_template(src, dst, template):
    """A copy of the model (or tokenizer) directory src whose tokenizer has another chat template."""
    from transformers import AutoTokenizer
    shutil.copytree(src, dst)
    tok = AutoTokenizer.from_pretrained(dst, local_files_only=True)
    tok.chat_template = template
    tok.save_pretrained(dst)
    return dst


CONVS = [
    {"id": "a", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "old answer one"},
        {"role": "user", "content": "And two plus two?"},
        {"role": "assistant", "content": "old answer two"}]},
    {"conversations": [{"from": "human", "value": "Tell me a story about a dragon."},
                       {"from": "gpt", "value": "old story"}]},
    {"messages": [{"role": "user", "content": "Please write a short poem about the sea."}]},  # prompt only
    {"conversations": [{"from": "gpt", "value": "Hello! How can I help?"},  # a greeting before any prompt: kept
                       {"from": "human", "value": "Two plus two?"}, {"from": "gpt", "value": "old four"}]},
]


@unittest.skipUnless(HAVE_TORCH, NO_TORCH)
class Regenerate(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = TempDir()
        make_tokenizer(cls.d("tok"), "qwen3")
        subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_qwen3.py"), cls.d("tok"), cls.d("model")],
                       check=True, capture_output=True, env=ENV)
        cls.inp = write_jsonl(cls.d("in.jsonl"), CONVS + ["not json"])

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def regen(self, out, *args, expect=0):
        rc, so, se = run(REGENERATE, "--model", self.d("model"), "--input", self.inp, "--output", out,
                         "--max-new-tokens", 8, "--backend", "transformers", *args)
        self.assertEqual(rc, expect, f"exit {rc}\n{so}\n{se}")
        return so, se

    def load(self, path):
        with open(path) as f:
            return [json.loads(x) for x in f]

    def greedy(self, messages, n):
        """The reference: the model's argmax, one token at a time, no generate()."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained(self.d("model"), local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(self.d("model"), local_files_only=True).float().eval()
        ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                  add_special_tokens=False)["input_ids"]
        new = []
        with torch.no_grad():
            for _ in range(n):
                t = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
                if t == tok.convert_tokens_to_ids("<|im_end|>"):
                    break
                new.append(t)
        return tok.decode(new, skip_special_tokens=True)

    def test_regenerates_every_assistant_turn_greedily(self):
        out = self.d("out.jsonl")
        so, se = self.regen(out, "--batch-size", 2, "--on-bad-line", "skip")
        self.assertIn("in.jsonl:5: not valid JSON (Expecting value) (skipped)", se)
        self.assertIn("4 conversations, 5 responses", so)
        got = self.load(out)
        self.assertEqual(len(got), 4)
        self.assertEqual(got[3]["messages"][0], {"role": "assistant", "content": "Hello! How can I help?"})
        self.assertEqual(got[3]["finish_reasons"][0], "kept")
        self.assertEqual(got[0]["id"], "a")
        for g, c in zip(got, CONVS):
            src = c.get("messages") or [{"role": {"human": "user", "gpt": "assistant"}[m["from"]], "content": m["value"]}
                                        for m in c["conversations"]]
            prompts = [m for m in src if m["role"] != "assistant"]
            self.assertEqual([m for m in g["messages"] if m["role"] != "assistant"], prompts)
            answers = [m["content"] for m in g["messages"] if m["role"] == "assistant"]
            self.assertEqual(len(answers), max(1, sum(m["role"] == "assistant" for m in src)))
            self.assertTrue(all(a and not a.startswith("old") for a in answers), answers)
            self.assertEqual(len(g["finish_reasons"]), len(answers))
        # greedy: the first answer of each conversation is the model's own argmax continuation, and a later
        # turn is conditioned on the regenerated earlier one
        m0 = got[0]["messages"]
        self.assertEqual(m0[2]["content"], self.greedy(m0[:2], 8))
        self.assertEqual(m0[4]["content"], self.greedy(m0[:4], 8))
        self.assertEqual(got[2]["messages"][1]["content"], self.greedy(got[2]["messages"][:1], 8))
        # batching does not change the answers (left padding is masked)
        self.regen(self.d("out1.jsonl"), "--batch-size", 1, "--on-bad-line", "skip")
        self.assertEqual(self.load(self.d("out1.jsonl")), got)

    def test_limit_bad_lines_and_options(self):
        self.regen(self.d("lim.jsonl"), "--limit", 1)
        self.assertEqual(len(self.load(self.d("lim.jsonl"))), 1)
        _, se = self.regen(self.d("bad.jsonl"), expect=3)
        self.assertIn("in.jsonl:5: not valid JSON", se)
        self.assertFalse(os.path.exists(self.d("bad.jsonl")))
        self.regen(self.d("x.jsonl"), "--max-new-tokens", 0, expect=2)
        try:
            import vllm  # noqa: F401
        except ImportError:
            _, se = self.regen(self.d("x.jsonl"), "--backend", "vllm", expect=2)
            self.assertIn("vLLM does not import", se)

    def test_template_past_its_limit_on_a_later_turn_is_a_bad_line(self):
        # The template runs away once a prompt has more than two messages: the first conversation's second
        # round (its first prompt, checked before the model loads, is fine). That conversation is a bad line,
        # found when its prompt is rendered; the others are regenerated as before.
        model = with_template(self.d("model"), self.d("model-later"),
                              "{%- if messages|length > 2 %}" + RUNAWAY + "{%- endif %}" + CHATML)
        out = self.d("later.jsonl")
        rc, so, se = run(REGENERATE, "--model", model, "--input", self.inp, "--output", out, "--max-new-tokens", 8,
                         "--backend", "transformers", "--batch-size", 2, "--on-bad-line", "skip")
        self.assertEqual(rc, 0, se)
        self.assertIn(f"in.jsonl:1: the chat template of {model} does too much work: more than 1000000 loop "
                      "iterations and macro calls in one render", se)
        self.assertIn("wrote " + out + ": 3 conversations", so)
        self.assertIn("bad lines skipped: 2 (lines 1, 5)", so)
        self.assertEqual([len(r["messages"]) for r in self.load(out)], [2, 2, 3])
        inp = write_jsonl(self.d("later-in.jsonl"), CONVS)  # without the line that is not JSON
        rc, so, se = run(REGENERATE, "--model", model, "--input", inp, "--output", self.d("later2.jsonl"),
                         "--max-new-tokens", 8, "--backend", "transformers")
        self.assertEqual(rc, 3, se)
        self.assertIn(f"later-in.jsonl:1: the chat template of {model} does too much work", se)
        self.assertNotIn("Traceback", se)
        self.assertFalse(os.path.exists(self.d("later2.jsonl")) or os.path.exists(self.d("later2.jsonl.tmp")))

    def test_output_feeds_dflash_tokenize(self):
        out = self.d("for-tok.jsonl")
        self.regen(out, "--on-bad-line", "skip", "--no-enable-thinking")
        rc, so, se = run(TOKENIZE, self.d("model"), out, self.d("regen.h5"), "--no-enable-thinking")
        self.assertEqual(rc, 0, se)
        self.assertEqual(len(records(self.d("regen.h5"))), 4)
        self.assertNotIn("is not used", se)  # finish_reasons and id are known fields


class TemplateWork(unittest.TestCase):
    """The prompts' chat template renders in dflash-tokenize's metered sandbox (tools/dflash_data/chat.py): a
    model directory whose template loops or builds without bound makes each conversation a bad line, before
    any model is loaded, instead of a render that never ends (no torch, no weights needed)."""

    @classmethod
    def setUpClass(cls):
        cls.d = TempDir()
        make_tokenizer(cls.d("tok"), "chatml")
        cls.inp = write_jsonl(cls.d("in.jsonl"), CONVS)

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def regen(self, model, out, *args):
        p = subprocess.run([sys.executable, REGENERATE, "--model", model, "--input", self.inp, "--output", out,
                            "--backend", "transformers", *args], capture_output=True, text=True, env=ENV,
                           timeout=120, preexec_fn=limit_address_space())  # before: no end, or out of memory
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(out) or os.path.exists(out + ".tmp"))
        return p

    def test_runaway_template_is_a_bad_line_not_a_hang(self):
        model = with_template(self.d("tok"), self.d("runaway"), RUNAWAY)
        p = self.regen(model, self.d("runaway.jsonl"))
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(f"in.jsonl:1: the chat template of {model} does too much work: more than 1000000 loop "
                      "iterations and macro calls in one render", p.stderr)
        p = self.regen(model, self.d("runaway.jsonl"), "--on-bad-line", "skip")
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(f"in.jsonl:4: the chat template of {model} does too much work", p.stderr)
        self.assertIn("in.jsonl: no conversations", p.stderr)

    def test_format_width_is_refused_before_it_builds(self):
        model = with_template(self.d("tok"), self.d("wide"), "{{ '%9999999999s' % 'x' }}" + CHATML)
        p = self.regen(model, self.d("wide.jsonl"))
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(f"in.jsonl:1: the chat template of {model} does too much work: the format '%9999999999s' % "
                      "... would build 10000000020 characters or items", p.stderr)


if __name__ == "__main__":
    unittest.main()
