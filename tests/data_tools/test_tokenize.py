"""tools/dflash-tokenize: chat JSONL -> the target's chat template -> assistant-only loss mask -> dataset.

Every test makes its own tokenizer (tests/data_tools/make_tiny_tokenizer.py: a BPE trained here, saved with a
chat template); nothing is downloaded."""
import json
import os
import sys
import unittest

from common import (BIN, ENV, SRC, TOKENIZE, TempDir, limit_address_space, make_tokenizer, masked_runs, read_h5,
                    records, run, write_jsonl)

OPENAI = {"messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "And two plus two?"},
    {"role": "assistant", "content": "Two plus two is four."}]}
SHAREGPT = {"id": "s1", "conversations": [
    {"from": "system", "value": "Answer the question briefly."},
    {"from": "human", "value": "Tell me a story about a dragon."},
    {"from": "gpt", "value": "Sure, here is a story: the dragon jumps over the lazy dog."}]}
EXPECT_CHATML = [["The capital of France is Paris.<|im_end|>\n", "Two plus two is four.<|im_end|>\n"],
                 ["Sure, here is a story: the dragon jumps over the lazy dog.<|im_end|>\n"]]


class Tokenize(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from transformers import AutoTokenizer
        cls.d = TempDir()
        cls.tok = {}
        for t in ("chatml", "qwen3", "qwen38", "generation"):
            make_tokenizer(cls.d("tok-" + t), t)
            cls.tok[t] = AutoTokenizer.from_pretrained(cls.d("tok-" + t), local_files_only=True)
        cls.chat = write_jsonl(cls.d("chat.jsonl"), [OPENAI, "", SHAREGPT])

    @classmethod
    def tearDownClass(cls):
        cls.d.cleanup()

    def tokenize(self, template, inp, out, *args, expect=0):
        rc, so, se = run(TOKENIZE, self.d("tok-" + template), inp, out, *args)
        self.assertEqual(rc, expect, f"exit {rc}\n{so}\n{se}")
        return so, se

    def test_openai_and_sharegpt_mask_only_assistant_turns(self):
        out = self.d("chatml.h5")
        so, _ = self.tokenize("chatml", self.chat, out)
        data, attrs, dtypes = read_h5(out)
        # exactly the layout dflash-train reads (docs/data.md)
        self.assertEqual(dtypes, {"tokens": "<i4", "offsets": "<i8", "loss_mask": "|u1"})
        self.assertEqual(attrs["format_version"], 1)
        self.assertEqual(attrs["vocab_size"], 400)  # no config.json: the tokenizer's size
        self.assertEqual(attrs["tokenizer"], os.path.abspath(self.d("tok-chatml")))
        recs = records(out)
        self.assertEqual(len(recs), 2)
        tok = self.tok["chatml"]
        for (ids, mask), want, conv in zip(recs, EXPECT_CHATML, [OPENAI, SHAREGPT]):
            self.assertEqual(masked_runs(tok, ids, mask), want)
        # the ids are what the template + tokenizer give (transformers' own tokenize=True path)
        ids = tok.apply_chat_template(OPENAI["messages"], tokenize=True, return_dict=True)["input_ids"]
        self.assertEqual(recs[0][0], list(ids))
        self.assertIn("2 records", so)
        self.assertIn("longest record %d tokens" % max(len(r[0]) for r in recs), so)
        self.assertIn("loss mask by prefix", so)

    def test_greeting_before_any_prompt_is_context(self):
        conv = {"conversations": [{"from": "gpt", "value": "Hello! How can I help?"},
                                  {"from": "human", "value": "Two plus two?"}, {"from": "gpt", "value": "Four."}]}
        p = write_jsonl(self.d("greet.jsonl"), [conv])
        for t in ("chatml", "qwen3"):
            self.tokenize(t, p, self.d(f"greet-{t}.h5"), "--no-enable-thinking")
            self.assertEqual(masked_runs(self.tok[t], *records(self.d(f"greet-{t}.h5"))[0]), ["Four.<|im_end|>\n"])

    def test_output_mode_follows_the_umask(self):
        old = os.umask(0o027)  # the child inherits it; mkstemp alone would give 0600
        try:
            self.tokenize("chatml", self.chat, self.d("umask.h5"))
        finally:
            os.umask(old)
        self.assertEqual(os.stat(self.d("umask.h5")).st_mode & 0o777, 0o640)

    def test_vocab_from_config_json(self):
        import shutil
        model = self.d("model-with-config")
        shutil.copytree(self.d("tok-chatml"), model)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 512}, f)
        rc, so, se = run(TOKENIZE, model, self.chat, self.d("cfg.h5"))
        self.assertEqual(rc, 0, se)
        self.assertEqual(read_h5(self.d("cfg.h5"))[1]["vocab_size"], 512)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"vocab_size": 100}, f)  # the tokenizer's ids do not fit this target
        rc, so, se = run(TOKENIZE, model, self.chat, self.d("cfg2.h5"))
        self.assertEqual(rc, 3, se)
        self.assertIn("outside the target's vocabulary 100", se)

    def test_generation_tags_agree_with_prefix_rendering(self):
        a, b = self.d("gen-auto.h5"), self.d("gen-prefix.h5")
        so, _ = self.tokenize("generation", self.chat, a)
        self.assertIn("loss mask by generation", so)
        self.tokenize("generation", self.chat, b, "--mask", "prefix")
        self.assertEqual(records(a), records(b))
        self.assertEqual([masked_runs(self.tok["generation"], *r) for r in records(a)], EXPECT_CHATML)
        _, se = self.tokenize("chatml", self.chat, self.d("x.h5"), "--mask", "generation", expect=2)
        self.assertIn("no {% generation %} tags", se)

    def test_qwen3_template_thinking_choice(self):
        # Qwen3's template is not prefix-stable (the empty think block is written on the last assistant turn
        # only); the mask must still cover each assistant turn, and the think block follows enable_thinking.
        tok = self.tok["qwen3"]
        on, off = self.d("q-on.h5"), self.d("q-off.h5")
        self.tokenize("qwen3", self.chat, on)
        so, _ = self.tokenize("qwen3", self.chat, off, "--no-enable-thinking")
        self.assertIn("enable_thinking=false", so)
        runs_on = [masked_runs(tok, *r) for r in records(on)]
        runs_off = [masked_runs(tok, *r) for r in records(off)]
        self.assertEqual(runs_on, [
            ["The capital of France is Paris.<|im_end|>\n", "<think>\n\n</think>\n\nTwo plus two is four.<|im_end|>\n"],
            ["<think>\n\n</think>\n\nSure, here is a story: the dragon jumps over the lazy dog.<|im_end|>\n"]])
        # thinking off: the empty think block is part of the generation prompt, not of the answer
        self.assertEqual(runs_off, EXPECT_CHATML)
        for (ids, _), conv in zip(records(off), [OPENAI["messages"], None]):
            if conv:
                want = tok.apply_chat_template(conv, tokenize=True, return_dict=True, enable_thinking=False)
                self.assertEqual(ids, list(want["input_ids"]))
        # reasoning kept on the last turn, dropped from earlier ones by the template: still masked right
        conv = {"messages": [{"role": "user", "content": "Two plus two?"},
                             {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nFour."},
                             {"role": "user", "content": "Three times three?"},
                             {"role": "assistant", "content": "<think>\nmultiply\n</think>\n\nNine."}]}
        p = write_jsonl(self.d("think.jsonl"), [conv])
        self.tokenize("qwen3", p, self.d("think.h5"))
        self.assertEqual(masked_runs(tok, *records(self.d("think.h5"))[0]),
                         ["Four.<|im_end|>\n", "<think>\nmultiply\n</think>\n\nNine.<|im_end|>\n"])

    def test_qwen38_reasoning_effort_and_preserve_thinking(self):
        # Qwen3.8's template variables through the named options: the ids are the template's with those
        # variables, the reasoning kept or dropped is masked as the answer it belongs to.
        tok = self.tok["qwen38"]
        msgs = [{"role": "user", "content": "Two plus two?"},
                {"role": "assistant", "reasoning_content": "add them", "content": "Four."},
                {"role": "user", "content": "Three times three?"},
                {"role": "assistant", "reasoning_content": "multiply", "content": "Nine."}]
        p = write_jsonl(self.d("q38.jsonl"), [{"messages": msgs}])

        def text_and_runs(out, *args, **kw):
            so, _ = self.tokenize("qwen38", p, out, *args)
            ids, mask = records(out)[0]
            want = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, **kw)["input_ids"]
            self.assertEqual(ids, list(want), args)
            return so, tok.decode(ids), masked_runs(tok, ids, mask)

        so, text, runs = text_and_runs(self.d("q38-default.h5"))
        self.assertIn("template kwargs: none", so)
        self.assertTrue(text.startswith("<|im_start|>system\nReasoning effort is set to xhigh."), text)
        self.assertEqual(runs, ["add them\n</think>\n\nFour.<|im_end|>\n", "multiply\n</think>\n\nNine.<|im_end|>\n"])

        so, text, runs = text_and_runs(self.d("q38-low.h5"), "--reasoning-effort", "low", reasoning_effort="low")
        self.assertIn('reasoning_effort="low"', so)
        self.assertTrue(text.startswith("<|im_start|>system\nReasoning effort is set to low."), text)
        _, text, _ = text_and_runs(self.d("q38-medium.h5"), "--reasoning-effort", "medium", reasoning_effort="medium")
        self.assertTrue(text.startswith("<|im_start|>user\n"), text)

        so, text, runs = text_and_runs(self.d("q38-drop.h5"), "--no-preserve-thinking", "--reasoning-effort", "medium",
                                       preserve_thinking=False, reasoning_effort="medium")
        self.assertIn("preserve_thinking=false", so)
        self.assertNotIn("add them", text)  # the earlier turn's reasoning is dropped by the template
        self.assertEqual(runs, ["Four.<|im_end|>\n", "multiply\n</think>\n\nNine.<|im_end|>\n"])
        so, _, runs_keep = text_and_runs(self.d("q38-keep.h5"), "--preserve-thinking", preserve_thinking=True)
        self.assertIn("preserve_thinking=true", so)
        self.assertEqual(runs_keep[0], "add them\n</think>\n\nFour.<|im_end|>\n")

        # the named option and --template-kwarg for the same variable: refused; a template error is a bad line
        _, se = self.tokenize("qwen38", p, self.d("q38-x.h5"), "--reasoning-effort", "low", "--template-kwarg",
                              'reasoning_effort="high"', expect=2)
        self.assertIn("both set reasoning_effort", se)
        _, se = self.tokenize("qwen38", p, self.d("q38-y.h5"), "--reasoning-effort", "extreme", expect=3)
        self.assertIn("Unexpected reasoning effort extreme", se)

    def test_max_length_cut_skip_error(self):
        long_conv = {"messages": [{"role": "user", "content": "hi " * 10},
                                  {"role": "assistant", "content": "Sure, here is a list: apples, oranges. " * 6}]}
        p = write_jsonl(self.d("long.jsonl"), [OPENAI, long_conv])
        full = records(self.tokenize("chatml", p, self.d("full.h5")) and self.d("full.h5"))
        n = len(full[1][0]) - 10
        self.assertGreater(n, len(full[0][0]))
        so, _ = self.tokenize("chatml", p, self.d("cut.h5"), "--max-length", n)
        cut = records(self.d("cut.h5"))
        self.assertEqual(cut[1], (full[1][0][:n], full[1][1][:n]))
        self.assertIn("cut to --max-length %d: 1 records (10 tokens dropped)" % n, so)
        so, _ = self.tokenize("chatml", p, self.d("skip.h5"), "--max-length", n, "--long-record", "skip")
        self.assertEqual(len(records(self.d("skip.h5"))), 1)
        self.assertIn("longer than --max-length %d: 1 (line 2)" % n, so)
        _, se = self.tokenize("chatml", p, self.d("err.h5"), "--max-length", n, "--long-record", "error", expect=3)
        self.assertIn("long.jsonl:2: %d tokens, longer than --max-length %d" % (len(full[1][0]), n), se)
        self.assertFalse(os.path.exists(self.d("err.h5")))
        # cut inside the prompt: nothing to learn is left, the record is dropped and said so
        _, se = self.tokenize("chatml", p, self.d("short.h5"), "--max-length", 12, expect=3)
        self.assertIn("no records left (2 lines read, 2 dropped: no assistant token within --max-length 12: 2)", se)

    def test_lone_surrogate_is_a_bad_line_not_a_traceback(self):
        lone = '{"messages": [{"role": "user", "content": "hi \\ud800"}, {"role": "assistant", "content": "ok"}]}'
        p = write_jsonl(self.d("surrogate.jsonl"), [OPENAI, lone])
        _, se = self.tokenize("chatml", p, self.d("sur.h5"), expect=3)
        self.assertIn("surrogate.jsonl:2: a string holds a lone UTF-16 surrogate", se)
        self.assertNotIn("Traceback", se)
        self.tokenize("chatml", p, self.d("sur.h5"), "--on-bad-line", "skip")

    def test_bad_lines_fail_or_skip_with_line_numbers(self):
        p = write_jsonl(self.d("bad.jsonl"), [
            OPENAI, "not json", {"messages": [{"role": "alien", "content": "x"}]},
            {"messages": [{"role": "user", "content": "only a question"}]},
            {"conversations": [{"from": "human", "value": 5}]}, dict(SHAREGPT, note="kept?")])
        _, se = self.tokenize("chatml", p, self.d("bad.h5"), expect=3)
        self.assertIn("bad.jsonl:2: not valid JSON", se)
        self.assertFalse(os.path.exists(self.d("bad.h5")))
        so, se = self.tokenize("chatml", p, self.d("bad.h5"), "--on-bad-line", "skip")
        self.assertIn("bad.jsonl:3: message 0: unknown role \"alien\"", se)
        self.assertIn("bad.jsonl:5: message 0: \"value\" must be a string", se)
        self.assertEqual(se.count("field \"note\" is not used"), 1)
        self.assertIn("2 records", so)
        self.assertIn("dropped 4 records: bad line: 3 (lines 2, 3, 5); no assistant turn: 1 (line 4)", so)

    def test_runaway_template_is_a_bad_line_not_a_hang(self):
        # Jinja's sandbox caps each range() but not their nesting: 1e9 iterations ran practically forever. The
        # tool's meter stops the render past its limit, named with the template's model, as a bad line.
        import shutil
        import subprocess
        from transformers import AutoTokenizer
        model = self.d("tok-runaway")
        shutil.copytree(self.d("tok-chatml"), model)
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        tok.chat_template = ("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}x"
                             "{% endfor %}{% endfor %}{% endfor %}")
        tok.save_pretrained(model)
        cmd = [sys.executable, TOKENIZE, model, self.chat, self.d("runaway.h5")]
        p = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=120)  # before: no end
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn(f"chat.jsonl:1: the chat template of {model} does too much work: more than 1000000 loop "
                      "iterations and macro calls in one render", p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertFalse(os.path.exists(self.d("runaway.h5")))
        p = subprocess.run(cmd + ["--on-bad-line", "skip"], capture_output=True, text=True, env=ENV, timeout=120)
        self.assertEqual(p.returncode, 3, p.stderr)
        self.assertIn("no records left (2 lines read, 2 dropped: bad line: 2)", p.stderr)

    def test_template_meter(self):
        # Each way a template can run away, stopped in the sandbox the tool gives transformers; the real
        # templates render as before (the other tests compare the tool's ids with apply_chat_template's).
        sys.path.insert(0, os.path.join(SRC, "tools"))
        from dflash_data.chat import MeteredSandbox, TemplateWorkLimit, bound_template_work
        self.assertTrue(bound_template_work(), "this transformers compiles templates out of the meter's reach")
        steps, chars = "more than 1000000 loop iterations", "more than 134217728 characters"
        runaway = {
            "{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}{% endfor %}{% endfor %}"
            "{% endfor %}": steps,
            "{% set r = range(1000)|list %}{% for a in r %}{% for b in r %}{% for c in r %}{% endfor %}{% endfor %}"
            "{% endfor %}": steps,
            "{% for a in range(100000) %}{% for b in range(100000) if false %}{% endfor %}{% endfor %}": steps,
            "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}": steps,
            "{% for a in range(100000) %}{% for b in range(100) %}" + "y" * 5000 + "{% endfor %}{% endfor %}": chars,
            "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}": chars,
            "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}": chars,
            "{% set big = range(100000)|list %}{% for a in range(100000) %}{% set _ = big|sum %}{% endfor %}": chars,
            "{{ 'x' * 10 ** 10 }}": "a sequence of 1 repeated 10000000000 times",
            "{% set l = [0] * 10 ** 10 %}": "a sequence of 1 repeated 10000000000 times",
            "{{ 9 ** 999999999 }}": "9 ** 999999999: more than 65536 bits",
            "{{ 'x'|center(10 ** 10) }}": "an argument of 10000000000",
            "{{ 'x'.center(10 ** 10) }}": "an argument of 10000000000",
        }
        env = MeteredSandbox()
        for template, why in runaway.items():
            with self.assertRaises(TemplateWorkLimit, msg=template) as e:
                env.from_string(template).render()
            self.assertIn(why, str(e.exception), template)
        # within the limits: the same text as Jinja's own sandbox, and the meter starts again every render
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        fine = ("{% macro m(x) %}<{{ x|upper }}>{% endmacro %}{% for a in range(300) if a % 3 %}{{ m(a ~ '') }}"
                "{% endfor %}{{ 'ab' * 3 }}{{ 2 ** 64 }}{% filter upper %}done{% endfilter %}")
        self.assertEqual(env.from_string(fine).render(), ImmutableSandboxedEnvironment().from_string(fine).render())
        t = env.from_string("{% for a in range(1000) %}{% for b in range(599) %}{% endfor %}{% endfor %}ok")
        self.assertEqual([t.render(), t.render()], ["ok", "ok"])  # 600000 steps each: over the limit if carried

    def test_string_building_is_checked_before_it_builds(self):
        # A format width, a padding, an indent or a join asks for far more text than the template holds. Built
        # first and counted after, it filled memory before the meter saw it (a bad line with a MemoryError at
        # best). Now each is refused before it builds: a bad line within seconds in 2 GiB of address space
        # (beyond the libraries'), saying what it would have built, and an ordinary line next to them still
        # tokenizes.
        import shutil
        import subprocess
        import time
        from transformers import AutoTokenizer
        cases = {
            "percent-width": "'%9999999999s' % 'x'",
            "percent-star": "'%*s' % (9999999999, 'x')",
            "percent-precision": "'%.2000000000f' % 1.0",
            "percent-repeated": "'%s' * 100000 % (('y' * 10000,) * 100000)",
            "format-width": "'{:>9999999999}'.format('x')",
            "format-nested-width": "'{:{}}'.format('x', '9999999999')",
            "format-repeated": "('{0}' * 100000).format('y' * 100000)",
            "format-filter": "'%9999999999s'|format('x')",
            "center-mapped": "range(100)|map('center', 100000000)|list|length",
            "ljust-rjust": "'x'.ljust(100000000) ~ 'x'.rjust(100000000)",
            "indent": "('a\\n' * 1000000)|indent(2000)",
            "wordwrap": "('a ' * 1000000)|wordwrap(1, wrapstring='y' * 1000)",
            "join": "([''] * 1000000)|join('y' * 1000000)",
            "replace": "('x' * 100000)|replace('x', 'y' * 100000)",
            "repetition": "'x' * 10 ** 10",
        }
        model = self.d("tok-builds")
        shutil.copytree(self.d("tok-chatml"), model)
        tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
        tok.chat_template = ("{%- set c = messages[0]['content'] %}" + "".join(
            f"{{%- {'el' * (i > 0)}if c == '{name}' %}}{{{{ {expr} }}}}" for i, (name, expr) in enumerate(cases.items()))
            + "{%- endif %}" + tok.chat_template)
        tok.save_pretrained(model)
        lines = [{"messages": [{"role": "user", "content": c}, {"role": "assistant", "content": "ok"}]}
                 for c in [*cases, "an ordinary question"]]
        inp = write_jsonl(self.d("builds.jsonl"), lines)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, TOKENIZE, model, inp, self.d("builds.h5"), "--on-bad-line", "skip"],
                           capture_output=True, text=True, env=ENV, timeout=300,
                           preexec_fn=limit_address_space(2 << 30))
        took = time.monotonic() - t0
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        for i, name in enumerate(cases, 1):
            said = [x for x in p.stderr.splitlines() if f"builds.jsonl:{i}: " in x]
            self.assertEqual(len(said), 1, (name, p.stderr))
            self.assertIn(f"the chat template of {model} does too much work: ", said[0], name)
            self.assertIn(" would build ", said[0], name)  # refused before it built, not counted after
        self.assertIn(f"bad line: {len(cases)}", p.stdout)
        self.assertEqual(len(records(self.d("builds.h5"))), 1)
        self.assertLess(took, 90, "each refusal takes a fraction of a second; the rest is the tool's start")

    def test_metered_templates_render_byte_identically(self):
        # The meter changes no text: transformers' own sandbox and the metered one render the same for Qwen3's
        # template as released (tools and tool calls, reasoning) and the tests' templates, both thinking choices.
        sys.path.insert(0, os.path.join(SRC, "tools"))
        from dflash_data.chat import MeteredSandbox, bound_template_work
        from transformers.utils import chat_template_utils as ctu
        self.assertTrue(bound_template_work())
        compile_ = getattr(ctu, "_cached_compile_jinja_template", None) or ctu._compile_jinja_template.__wrapped__

        def compiled(template, metered):
            saved = ctu.ImmutableSandboxedEnvironment
            from jinja2.sandbox import ImmutableSandboxedEnvironment
            ctu.ImmutableSandboxedEnvironment = MeteredSandbox if metered else ImmutableSandboxedEnvironment
            try:
                return compile_(template)
            finally:
                ctu.ImmutableSandboxedEnvironment = saved
        msgs = [{"role": "system", "content": "You are a helpful assistant."}]
        for i in range(19):
            msgs.append({"role": "user", "content": f"Question {i}: what is {i} % 7, and '{i}' * 3?"})
            if i % 5 == 3:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                    "name": "calc", "arguments": {"expr": f"{i} % 7", "width": 9999999999}}}]})
                msgs.append({"role": "tool", "content": f"{i % 7}"})
            msgs.append({"role": "assistant", "reasoning_content": f"think {i}" * (i % 3), "content": f"It is {i % 7}."})
        tools = [{"type": "function", "function": {"name": "calc", "description": "evaluates %s {:>9}",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        with open(os.path.join(SRC, "tools", "dflash_data", "templates", "qwen3.jinja")) as f:
            templates = {"qwen3.jinja": f.read(), **{t: self.tok[t].chat_template for t in self.tok}}
        for name, template in templates.items():
            for kw in ({"add_generation_prompt": True, "enable_thinking": False}, {"add_generation_prompt": False},
                       {"add_generation_prompt": True, "enable_thinking": True, "reasoning_effort": "low"}):
                for with_tools in (tools, None):
                    args = dict(messages=msgs, tools=with_tools, bos_token="", eos_token="<|im_end|>", **kw)
                    want = compiled(template, False).render(**args)
                    got = compiled(template, True).render(**args)
                    self.assertEqual(got, want, (name, kw, with_tools is not None))

    def test_nothing_to_train_on_is_exit_3(self):
        p = write_jsonl(self.d("none.jsonl"), [{"messages": [{"role": "user", "content": "q"}]}])
        _, se = self.tokenize("chatml", p, self.d("none.h5"), expect=3)
        self.assertIn("no records left", se)

    def test_bad_options_exit_2(self):
        for args in (["--max-length", "-1"], ["--bogus"], ["--on-bad-line", "maybe"], ["--workers", "0"]):
            rc, _, se = run(TOKENIZE, self.d("tok-chatml"), self.chat, self.d("o.h5"), *args)
            self.assertEqual(rc, 2, (args, se))
        rc, _, se = run(TOKENIZE, self.d("tok-chatml"), self.chat, self.d("o.txt"))
        self.assertEqual(rc, 2, se)
        rc, _, se = run(TOKENIZE, self.d("no-such-model"), self.chat, self.d("o.h5"))
        self.assertEqual(rc, 3, se)
        # A model directory without tokenizer files (a target's config.json and weights only) says so, not "no
        # chat template" (transformers 5 builds an empty tokenizer there).
        os.makedirs(self.d("weights-only"), exist_ok=True)
        with open(self.d("weights-only/config.json"), "w") as f:
            json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 512}, f)
        rc, _, se = run(TOKENIZE, self.d("weights-only"), self.chat, self.d("o.h5"))
        self.assertEqual(rc, 3, se)
        self.assertIn("has no tokenizer files", se)
        self.assertNotIn("chat template", se)
        rc, _, se = run(TOKENIZE, self.d("tok-chatml"), self.d("no-such.jsonl"), self.d("o.h5"))
        self.assertEqual(rc, 3, se)
        rc, so, _ = run(TOKENIZE, "--version")
        self.assertEqual(rc, 0)
        self.assertRegex(so, r"^dflash-tokenize \d+\.\d+")

    def test_workers_and_jsonl_output_through_dflash_prep(self):
        many = write_jsonl(self.d("many.jsonl"), [OPENAI, SHAREGPT] * 20)
        self.tokenize("qwen3", many, self.d("w1.h5"))
        self.tokenize("qwen3", many, self.d("w2.h5"), "--workers", "2")
        self.assertEqual(records(self.d("w1.h5")), records(self.d("w2.h5")))
        self.tokenize("qwen3", many, self.d("w1.jsonl"))
        with open(self.d("w1.jsonl")) as f:
            lines = [json.loads(x) for x in f]
        self.assertEqual([(r["input_ids"], r["loss_mask"]) for r in lines], records(self.d("w1.h5")))
        prep = os.path.join(BIN, "dflash-prep")
        if not os.path.exists(prep):
            self.skipTest(f"no {prep}: build dflash-prep (DFLASH_BIN) for the hand-off check")
        import subprocess
        subprocess.run([prep, self.d("w1.jsonl"), self.d("prep.h5"), "--vocab-size", "400", "--require-mask"],
                       check=True, capture_output=True)
        self.assertEqual(records(self.d("prep.h5")), records(self.d("w1.h5")))


if __name__ == "__main__":
    unittest.main()
