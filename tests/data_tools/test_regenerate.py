"""tools/dflash-regenerate (transformers backend) on a tiny random Qwen3 built here (make_tiny_qwen3.py):
every assistant turn replaced by the target's greedy answer, prompts kept, output ready for dflash-tokenize."""
import json
import os
import subprocess
import sys
import unittest

from common import (HERE, REGENERATE, TOKENIZE, ENV, TempDir, make_tokenizer, records, run, write_jsonl)

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

    def test_output_feeds_dflash_tokenize(self):
        out = self.d("for-tok.jsonl")
        self.regen(out, "--on-bad-line", "skip", "--no-enable-thinking")
        rc, so, se = run(TOKENIZE, self.d("model"), out, self.d("regen.h5"), "--no-enable-thinking")
        self.assertEqual(rc, 0, se)
        self.assertEqual(len(records(self.d("regen.h5"))), 4)
        self.assertNotIn("is not used", se)  # finish_reasons and id are known fields


if __name__ == "__main__":
    unittest.main()
