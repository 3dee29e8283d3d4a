"""Conversations JSONL -> messages; the chat template -> token ids and the assistant-only loss mask."""

import inspect
import json
import re
import types
from functools import update_wrapper

from jinja2 import nodes, pass_context
from jinja2.compiler import CodeGenerator
from jinja2.filters import make_attrgetter
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.visitor import NodeTransformer
from markupsafe import EscapeFormatter, Markup

from . import BadRecord

# ShareGPT speaker names -> chat roles. OpenAI role names map to themselves.
ROLE_MAP = {
    "system": "system",
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant",
    "tool": "tool", "function": "tool", "observation": "tool",
}
# Top-level fields a record may carry besides its messages: used (tools) or known metadata.
KNOWN_FIELDS = {"messages", "conversations", "tools", "id", "source", "dataset", "finish_reasons"}


def parse_record(line):
    """One JSONL line -> (messages, tools, unknown top-level field names). Raises BadRecord.

    Accepts OpenAI {"messages": [{"role", "content", ...}]} and ShareGPT {"conversations": [{"from",
    "value"}]}; roles human/gpt/system (and the OpenAI names) map to user/assistant/system. Content must be a
    string, or a list of {"type": "text", "text": ...} parts (joined). Extra keys of an OpenAI message
    (reasoning_content, tool_calls, ...) are kept for the template."""
    try:
        rec = json.loads(line)
    except ValueError as e:
        raise BadRecord(f"not valid JSON ({e.msg})")
    if "\\u" in line:  # a \uD800-style escape may decode to a lone surrogate, which no tokenizer can encode
        try:
            json.dumps(rec, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRecord("a string holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair): "
                            "not text")
    if not isinstance(rec, dict):
        raise BadRecord("a record must be a JSON object with \"messages\" or \"conversations\"")
    if "messages" in rec and "conversations" in rec:
        raise BadRecord("both \"messages\" and \"conversations\": which one is the conversation?")
    if "messages" in rec:
        raw, role_key, content_key = rec["messages"], "role", "content"
    elif "conversations" in rec:
        raw, role_key, content_key = rec["conversations"], "from", "value"
    else:
        raise BadRecord("no \"messages\" (OpenAI) or \"conversations\" (ShareGPT) field")
    if not isinstance(raw, list) or not raw:
        raise BadRecord("the conversation must be a non-empty list of messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise BadRecord(f"message {i} is not an object")
        if role_key not in m:
            raise BadRecord(f"message {i} has no \"{role_key}\"")
        who = m[role_key]
        role = ROLE_MAP.get(who.lower()) if isinstance(who, str) else None
        if role is None:
            raise BadRecord(f"message {i}: unknown role {json.dumps(who)} (known: {', '.join(sorted(ROLE_MAP))})")
        content = m.get(content_key)
        if isinstance(content, list):
            parts = []
            for p in content:
                if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                    parts.append(p["text"])
                else:
                    raise BadRecord(f"message {i}: content part {json.dumps(p)[:60]} is not text")
            content = "".join(parts)
        if content is None and role == "assistant" and m.get("tool_calls"):
            content = ""
        if not isinstance(content, str):
            raise BadRecord(f"message {i}: \"{content_key}\" must be a string")
        msg = {"role": role, "content": content}
        if role_key == "role":
            for k, v in m.items():
                if k not in ("role", "content"):
                    msg[k] = v
        messages.append(msg)
    tools = rec.get("tools")
    unknown = sorted(k for k in rec if k not in KNOWN_FIELDS)
    return messages, tools, unknown


def has_generation_tags(tokenizer):
    """Whether the tokenizer's chat template marks assistant text with {% generation %}."""
    t = getattr(tokenizer, "chat_template", None)
    if isinstance(t, dict):
        t = t.get("default")
    return isinstance(t, str) and "generation" in t and "endgeneration" in t


class Renderer:
    """Turns messages into (input_ids, loss_mask) with the tokenizer's chat template.

    method "prefix": render the conversation as text; each assistant turn's span is where the text rendered
    for the messages before it with the generation prompt stops agreeing with the full text, up to the end
    of the text rendered for the messages up to and including it (the template's end-of-turn marker, e.g.
    <|im_end|>, included). Templates that rewrite earlier turns once later ones exist (Qwen3 drops the empty
    <think></think> block of every assistant turn but the last) fail that prefix test; the turn's end is then
    found by locating its content in the full text and extending over the end-of-turn text the template
    writes after it. Tokens whose first character lies in a span get mask 1 (offsets of a fast tokenizer). An
    assistant turn before any user or tool message (a greeting) answers nothing: it stays context (mask 0).
    method "generation": transformers' return_assistant_tokens_mask, for templates with {% generation %}."""

    def __init__(self, tokenizer, method="auto", template_kwargs=None):
        self.tok = tokenizer
        self.kw = dict(template_kwargs or {})
        self.name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        self.bounded = bound_template_work()  # False: this transformers renders templates unmetered
        if method == "auto":
            method = "generation" if has_generation_tags(tokenizer) else "prefix"
        self.method = method
        if method == "prefix" and not getattr(tokenizer, "is_fast", False):
            raise ValueError("the prefix mask needs a fast tokenizer (tokenizer.json), for character offsets")

    def _render(self, messages, tools, gen_prompt):
        return render_chat(self.tok, messages, tools=tools, gen_prompt=gen_prompt, name=self.name, **self.kw)

    def __call__(self, messages, tools=None):
        if not any(m["role"] == "assistant" for m in messages):
            raise NoLoss("no assistant turn")
        if self.method == "generation":
            return self._generation(messages, tools)
        return self._prefix(messages, tools)

    def _generation(self, messages, tools):
        try:
            out = self.tok.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True,
                                               add_generation_prompt=False, return_assistant_tokens_mask=True,
                                               **self.kw)
        except TemplateWorkLimit as e:
            raise BadRecord(template_work_message(self.name, e))
        except Exception as e:
            raise BadRecord(f"the chat template refused the conversation: {type(e).__name__}: {e}")
        ids, mask = list(out["input_ids"]), [int(x) for x in out["assistant_masks"]]
        return ids, mask

    def spans(self, messages, tools=None):
        """The full text and the [start, end) character spans of the assistant turns in it."""
        full = self._render(messages, tools, False)
        spans, cursor = [], 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            if not any(p["role"] in ("user", "tool") for p in messages[:i]):
                continue  # before any prompt (a greeting): context, not an answer the target gives
            before = self._render(messages[:i], tools, True)
            start = _common_prefix(before, full)
            upto = self._render(messages[:i + 1], tools, False)
            if full.startswith(upto) and len(upto) > start:
                end = len(upto)
            else:
                end = self._locate_end(m, upto, full, start, i)
            if start < cursor:
                raise BadRecord(f"assistant turn at message {i} overlaps the turn before it in the rendered text "
                                "(use --mask generation with a template that has {% generation %})")
            spans.append((start, end))
            cursor = end
        return full, spans

    @staticmethod
    def _locate_end(m, upto, full, start, i):
        body = m["content"]
        if "</think>" in body:
            body = body.split("</think>")[-1]
        body = body.strip()
        if not body:
            raise BadRecord(f"message {i}: cannot find the end of an empty assistant turn in the rendered text")
        pos = full.find(body, start)
        if pos < 0:
            raise BadRecord(f"message {i}: the assistant content is not in the rendered conversation (the template "
                            "rewrites it); use --mask generation with a template that has {% generation %}")
        end = pos + len(body)
        at = upto.rfind(body)
        tail = upto[at + len(body):] if at >= 0 else ""
        return end + _common_prefix(tail, full[end:])

    def _prefix(self, messages, tools):
        full, spans = self.spans(messages, tools)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        mask, s = [0] * len(ids), 0
        for t, (a, _) in enumerate(offsets):
            while s < len(spans) and a >= spans[s][1]:
                s += 1
            if s < len(spans) and spans[s][0] <= a < spans[s][1]:
                mask[t] = 1
        return ids, mask


def render_chat(tok, messages, tools=None, gen_prompt=False, name=None, **template_kwargs):
    """messages through the tokenizer's chat template, as text (dflash-tokenize's turns; dflash-regenerate's
    prompts, gen_prompt=True). Metered once bound_template_work() has run: a render past the limits, or one
    the template refuses, is a BadRecord (a bad line) saying so."""
    try:
        return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen_prompt,
                                       **template_kwargs)
    except TemplateWorkLimit as e:
        raise BadRecord(template_work_message(name or getattr(tok, "name_or_path", "") or "the tokenizer", e))
    except Exception as e:  # jinja2 errors, raise_exception() in templates
        raise BadRecord(f"the chat template refused the conversation: {type(e).__name__}: {e}")


class NoLoss(Exception):
    """A well-formed record that has nothing to train on (counted as dropped, with the reason)."""


def _common_prefix(a, b):
    n = min(len(a), len(b))
    i = 0
    # compare in blocks first: conversations are long and mostly equal
    step = 256
    while i + step <= n and a[i:i + step] == b[i:i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


# ---- the chat template's work, bounded ----------------------------------------------------------------
# A chat template is a program that comes with the model's files. transformers runs it in Jinja's sandbox,
# which blocks escapes to Python and caps each range() at 100000 items, but not their nesting: three nested
# range(1000) loops are 1e9 iterations, a render that never ends. So every render is metered: its loop
# iterations and macro calls (steps), and the data it writes or builds (characters; items of lists and
# ranges), each against a limit far above what real templates use (docs/data.md "The chat template's work
# is bounded"). The operations that can build much more than they are given -- `x * n`, `x ** y`, `fmt % x`,
# str.format, and the filters and str methods that pad, indent, wrap, replace or join -- are checked before
# they build: a small template must not fill memory before the meter sees the result. dflash-tokenize and
# dflash-regenerate both render through it (bound_template_work).
MAX_TEMPLATE_STEPS = 1_000_000
MAX_TEMPLATE_CHARS = 128 * 2 ** 20
MAX_POWER_BITS = 1 << 16  # x ** y: 2 ** 65536 is already far past any use in a template
_SIZED = (str, bytes, list, tuple, dict, set, frozenset, range)
_HUGE = 1 << 62  # a width or count too long to be a number Python formats (it would refuse it, or run out)


class TemplateWorkLimit(Exception):
    """A render went past MAX_TEMPLATE_STEPS or MAX_TEMPLATE_CHARS (the message says which)."""


def template_work_message(name, e):
    """The bad-line text both tools print for a render stopped by the meter."""
    return (f"the chat template of {name} does too much work: {e} in one render (the data tools' limit, "
            "docs/data.md \"The chat template's work is bounded\"; loops nested without bound or runaway "
            "recursion in the template?)")


# The meter's calls in a template are filters of MeteredSandbox (Jinja allows no node types of one's own).
# They take the context so that Jinja never runs them once at compile time in place of every render.
@pass_context
def _meter_begin(context, _):
    context.environment.meter_begin()


@pass_context
def _meter_step(context, chars):
    return context.environment.meter_step(chars)


@pass_context
def _meter_size(context, value):
    if isinstance(value, _SIZED):  # MeteredSandbox.meter_size inlined: this runs twice for every filter
        context.environment._charge(len(value))
    return value


@pass_context
def _meter_arg(context, value):
    return context.environment.meter_arg(value)


METER_FILTERS = {"dflash_meter_begin": _meter_begin, "dflash_meter_step": _meter_step,
                 "dflash_meter_size": _meter_size, "dflash_meter_arg": _meter_arg}


def _meter(name, value, lineno):
    return nodes.Filter(value, f"dflash_meter_{name}", [], [], None, None, lineno=lineno)


def _literal_chars(body):
    """Characters of template text a loop or macro body writes each time it runs (an upper bound: the text
    of its branches and inner loops counts too)."""
    total = 0
    for stmt in body:
        for n in [stmt, *stmt.find_all((nodes.TemplateData, nodes.Const))]:
            if isinstance(n, nodes.TemplateData):
                total += len(n.data)
            elif isinstance(n, nodes.Const) and isinstance(n.value, str):
                total += len(n.value)
    return total


class _Meter(NodeTransformer):
    """Rewrites a parsed template so that it counts its work as it runs: a step at the top of every loop
    body and macro (and in a loop's `if`: filtered-out iterations are work too), the size of what goes into
    and comes out of every filter and `~`, and the filters' arguments checked."""

    def _step(self, node):
        node = self.generic_visit(node)  # inner loops first: they count their own iterations
        chars = nodes.Const(_literal_chars(node.body), lineno=node.lineno)
        node.body.insert(0, nodes.ExprStmt(_meter("step", chars, node.lineno), lineno=node.lineno))
        return node

    def visit_For(self, node):
        node = self._step(node)
        if node.test is not None:
            node.test = nodes.And(_meter("step", nodes.Const(0), node.lineno), node.test, lineno=node.lineno)
        return node

    visit_Macro = visit_CallBlock = _step

    def visit_Filter(self, node):
        node = self.generic_visit(node)
        node.args = [_meter("arg", a, node.lineno) for a in node.args]
        for kw in node.kwargs:
            kw.value = _meter("arg", kw.value, node.lineno)
        if node.node is None:  # {% filter %} block: its text is already counted, and it must stay a Filter
            return node
        node.node = _meter("size", node.node, node.lineno)
        return _meter("size", node, node.lineno)

    def visit_Concat(self, node):
        return _meter("size", self.generic_visit(node), node.lineno)


class _MeteredCodeGenerator(CodeGenerator):
    """Jinja's code generator, on the template as _Meter rewrote it, the meter reset as the render starts."""

    def visit_Template(self, node, frame=None):
        node = _Meter().visit(node)
        node.body.insert(0, nodes.ExprStmt(_meter("begin", nodes.Const(0), 1), lineno=1))
        super().visit_Template(node, frame)


# ---- sizes of what an operation would build, found before it builds ----
def _int(v):
    return v if isinstance(v, int) else 0


def _number(digits):
    return int(digits) if len(digits) <= 18 else _HUGE


def _slen(v):
    """Length of the text v becomes (str(v))."""
    return len(v) if isinstance(v, str) else len(str(v))


_LINE_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines' boundaries


def _nlines(s):
    return 1 + sum(s.count(c) for c in _LINE_BREAKS)


# one %-conversion: (mapping key), flags, width, .precision, length modifier, conversion character
_PRINTF_SPEC = re.compile(r"%(?:\(([^()]*)\))?[-+ #0]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?(.?)", re.S | re.A)


def _printf_bound(fmt, args, limit=_HUGE):
    """An upper bound on len(fmt % args), found without building it: fmt's own text, and for each conversion
    its width and precision (written in fmt or taken by `*`) and the length of its value's text; counted
    until it passes limit. Where fmt % args fails, the bound of the part before the failure (Python builds
    no more than that)."""
    if isinstance(args, tuple):
        pos, mapping = args, None
    else:
        pos = (args,)
        mapping = args if hasattr(args, "__getitem__") and not isinstance(args, str) else None
    escape = 6 if isinstance(fmt, Markup) else 1  # Markup's % escapes its arguments ('&' -> '&amp;')
    if isinstance(fmt, bytes):
        fmt = fmt.decode("latin-1")  # the same conversions, one character per byte
    total, k, seen = len(fmt), 0, {}

    def take():  # the next positional argument; IndexError when there is none (Python: not enough arguments)
        nonlocal k
        k += 1
        return pos[k - 1]

    def number(digits_or_star):
        if digits_or_star == "*":
            v = take()
            return abs(v) if isinstance(v, int) else 0
        return _number(digits_or_star) if digits_or_star else 0

    def text_len(v, conv):
        key = (id(v), conv)
        if key not in seen:
            if conv == "s":
                seen[key] = _slen(v)
            elif conv in "ra":
                seen[key] = len(repr(v) if conv == "r" else ascii(v))
            elif conv == "c":
                seen[key] = 1
            elif conv in "diouxX":
                x = v if isinstance(v, int) else int(v)
                seen[key] = x.bit_length() // 3 + 4  # octal has the most digits; sign and 0o prefix
            else:
                float(v)
                seen[key] = 330  # 1e308 with 'f': 309 digits, a sign, a point (the precision counts apart)
        return seen[key] * escape

    try:
        for m in _PRINTF_SPEC.finditer(fmt):
            key, width, prec, conv = m.groups()
            if conv == "%":
                continue
            if conv == "(":  # a mapping key with parentheses in it: not read here, so not bounded
                return _HUGE
            if conv not in "diouxXeEfFgGcrsa" or not conv:
                break
            total += number(width) + number(prec or "")
            total += text_len(mapping[key] if key is not None else take(), conv) + 8
            if total > limit:
                break
    except Exception:  # noqa: BLE001  (no argument, no key, not a number: Python fails there too)
        pass
    return total


def _spec_bound(spec):
    """An upper bound on what a str.format field's spec adds to its value's text: the sum of the numbers in it
    (width, precision; a digit fill character too)."""
    return sum(_number(d) for d in re.findall(r"\d+", spec))


def _join_bound(env, items, sep, attribute=None):
    if attribute is not None:
        items = map(make_attrgetter(env, attribute), items)
    total = count = 0
    for x in items:
        total += _slen(x)
        count += 1
    return total + max(0, count - 1) * _slen(sep)


def _replace_bound(s, old, new, count=-1, text=True):
    if text:  # the filter: on the texts of its arguments (str.replace / bytes.replace: as they are)
        s, old, new = str(s), str(old), str(new)
    times = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    return len(s) + times * max(0, len(new) - len(old))


def _b_center(env, value, width=80, *_, **__):
    return max(_slen(value), _int(width))


def _b_indent(env, s, width=4, *_, **__):
    s = str(s)
    ind = len(width) if isinstance(width, str) else _int(width)
    return len(s) + 1 + _nlines(s) * (ind + 1) + ind


def _b_wordwrap(env, s, width=79, break_long_words=True, wrapstring=None, *_, **__):
    s = str(s)  # every wrapped line holds a character at least: at most len(s) + paragraphs joins
    return len(s) + (len(s) + _nlines(s)) * (1 if wrapstring is None else _slen(wrapstring))


def _b_format(env, value, *args, **kwargs):
    return _printf_bound(str(value), kwargs or args, env.room())


def _b_replace(env, s, old="", new="", count=None, *_, **__):
    return _replace_bound(s, old, new, -1 if count is None else count, text=True)


def _b_join(env, value, d="", attribute=None, *_, **__):
    return _join_bound(env, value, d, attribute)


def _b_urlize(env, value, trim_url_limit=None, nofollow=False, target=None, rel=None, *_, **__):
    s = str(value)  # each word may become <a href="WORD" rel=.. target=..>WORD</a>, escaped (up to 5x)
    return 10 * len(s) + (len(s) // 2 + 1) * (_slen(target or "") + _slen(rel or "") + 64)


# filter name -> (bound, whether the value is an iterable to read once before the filter does)
_FILTER_BOUNDS = {"center": (_b_center, False), "indent": (_b_indent, False), "wordwrap": (_b_wordwrap, False),
                  "format": (_b_format, False), "replace": (_b_replace, False), "join": (_b_join, True),
                  "urlize": (_b_urlize, False)}


def _m_pad(s, width=0, *_, **__):
    return max(len(s), _int(width))


def _m_expandtabs(s, tabsize=8, *_, **__):
    return len(s) + s.count(b"\t" if isinstance(s, bytes) else "\t") * max(0, _int(tabsize))


def _m_replace(s, old="", new="", count=-1, *_, **__):
    return _replace_bound(s, old, new, count, text=False)


def _m_join(s, items=(), *_, **__):
    return sum(len(x) for x in items if isinstance(x, (str, bytes))) + max(0, len(items) - 1) * len(s)


def _m_translate(s, table=None, *_, **__):
    values = table.values() if isinstance(table, dict) else table if isinstance(table, (list, tuple)) else ()
    return len(s) * max([1] + [_slen(v) for v in values if isinstance(v, str)])


# str (and bytes) method name -> bound of its result
_STR_METHOD_BOUNDS = {"center": _m_pad, "ljust": _m_pad, "rjust": _m_pad, "zfill": _m_pad,
                      "expandtabs": _m_expandtabs, "replace": _m_replace, "join": _m_join,
                      "translate": _m_translate}


def _b_tojson(func, args, kwargs):
    """json.dumps with indent k writes L0 + (L1 - L0) * k characters, where L0 and L1 are its lengths with
    indent 0 and 1 (one more newline per item either way; k more spaces per level of each line)."""
    try:
        bound = inspect.signature(func).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return 0
    indent = bound.arguments.get("indent")
    k = len(indent) if isinstance(indent, str) else _int(indent)
    if k <= 16:  # 16 times the indent-1 text at most: let it build, then count it
        return 0
    lengths = []
    for one in (0, 1):
        bound.arguments["indent"] = one
        lengths.append(len(func(*bound.args, **bound.kwargs)))
    return lengths[0] + (lengths[1] - lengths[0]) * k


class _MeteredFormatter(SandboxedFormatter):
    """The sandbox's str.format, each field's width and precision checked before the field is built and the
    fields built so far counted (one field repeated a million times is as much text as a million fields)."""

    def __init__(self, env, **kwargs):
        super().__init__(env, **kwargs)
        self._built = 0

    def format_field(self, value, format_spec):
        self._env.refuse_past_room(self._built + _spec_bound(format_spec), f"a format field {{:{format_spec[:24]}}}")
        rv = super().format_field(value, format_spec)
        self._built += len(rv)
        self._env.refuse_past_room(self._built, "str.format's fields")
        return rv


class _MeteredEscapeFormatter(_MeteredFormatter, EscapeFormatter):
    pass


class _GuardedFilters(dict):
    """The environment's filters: a filter set under a name the meter knows (transformers sets its own tojson
    after the environment is made) is checked before it builds."""

    def __init__(self, env, filters):
        super().__init__()
        self._env = env
        for name, func in filters.items():
            self[name] = func

    def __setitem__(self, name, func):
        super().__setitem__(name, self._env.guarded_filter(name, func))


class MeteredSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox for chat templates with every render metered: steps (loop iterations, macro
    calls) and data (characters written by {{ }} and by template text in loops; what filters, calls, `+`
    and `~` take and make; `*`, `**`, `%`, str.format and the padding, indenting, wrapping, replacing and
    joining filters and str methods checked before they build)."""

    code_generator_class = _MeteredCodeGenerator
    intercepted_binops = frozenset(["*", "**", "+", "%"])

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("finalize", self._written)
        super().__init__(*args, **kwargs)
        self.filters = _GuardedFilters(self, self.filters)
        self.filters.update(METER_FILTERS)  # dict.update: not through __setitem__ (nothing to guard)
        if "lipsum" in self.globals:
            lipsum = self.globals["lipsum"]

            def guarded_lipsum(n=5, html=True, min=20, max=100):
                self.refuse_past_room(_int(n) * (_int(max) * 16 + 16), f"lipsum({n}, max={max})")
                return lipsum(n, html, min, max)
            self.globals["lipsum"] = guarded_lipsum
        self.meter_begin()

    def meter_begin(self):
        self._steps = self._chars = 0

    def meter_step(self, chars):
        self._steps += 1
        if self._steps > MAX_TEMPLATE_STEPS:
            raise TemplateWorkLimit(f"more than {MAX_TEMPLATE_STEPS} loop iterations and macro calls")
        self._charge(chars)
        return True

    def _charge(self, n):
        self._chars += n
        if self._chars > MAX_TEMPLATE_CHARS:
            raise TemplateWorkLimit(f"more than {MAX_TEMPLATE_CHARS} characters written or built")

    def room(self):
        """Characters (or items) this render may still write or build."""
        return MAX_TEMPLATE_CHARS - self._chars

    def refuse_past_room(self, n, what):
        """Before an operation builds n characters (or items): refused if the render has less room left."""
        room = self.room()
        if n > room:
            raise TemplateWorkLimit(f"{what} would build {n} characters or items, more than the {room} left of "
                                    f"the {MAX_TEMPLATE_CHARS} a render may write or build")

    def meter_size(self, value):
        if isinstance(value, _SIZED):
            self._charge(len(value))
        return value

    def meter_arg(self, value):
        if isinstance(value, int) and abs(value) > MAX_TEMPLATE_CHARS:
            raise TemplateWorkLimit(f"an argument of {value}, more than the {MAX_TEMPLATE_CHARS} characters a "
                                    "render may build")
        return self.meter_size(value)

    def _written(self, value):
        """finalize: every {{ }} output passes here."""
        self._charge(len(value) if isinstance(value, str) else len(str(value)))
        return value

    def guarded_filter(self, name, func):
        """func, checked before it builds when name is a filter that can build more than it is given; map's
        items counted as they come (it calls filters by name, past the template's own meter calls)."""
        lead = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0  # the context it is passed first
        if name == "map":
            def guarded(*args, **kwargs):
                for item in func(*args, **kwargs):
                    yield self.meter_size(item)
        elif name == "tojson":
            def guarded(*args, **kwargs):
                self.refuse_past_room(_b_tojson(func, args, kwargs), "tojson's indent")
                return func(*args, **kwargs)
        elif name in _FILTER_BOUNDS:
            bound, materialize = _FILTER_BOUNDS[name]

            def guarded(*args, **kwargs):
                if materialize and len(args) > lead and not isinstance(args[lead], (str, list, tuple)):
                    args = (*args[:lead], list(args[lead]), *args[lead + 1:])  # read once, for both
                try:
                    n = bound(self, *args[lead:], **kwargs)
                except TypeError:  # arguments the filter refuses too
                    n = 0
                self.refuse_past_room(n, f"the filter {name}")
                return func(*args, **kwargs)
        else:
            return func
        return update_wrapper(guarded, func)

    def wrap_str_format(self, value):
        """Jinja 3.1.6's wrap_str_format (str.format and format_map in the sandbox), with _MeteredFormatter."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or \
                value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str):
            return None
        f_self = value.__self__
        is_format_map = value.__name__ == "format_map"

        def wrapper(*args, **kwargs):
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs, args = args[0], ()
            formatter = _MeteredEscapeFormatter(self, escape=f_self.escape) if isinstance(f_self, Markup) \
                else _MeteredFormatter(self)
            return type(f_self)(formatter.vformat(f_self, args, kwargs))

        return update_wrapper(wrapper, value)

    def call(self, context, obj, /, *args, **kwargs):
        """A call's work grows with its receiver (text.count(x)) and arguments; its result is data built. The
        str methods that can build more than they are given are checked first."""
        receiver = getattr(obj, "__self__", None)
        n = len(receiver) if isinstance(receiver, _SIZED) else 0
        if args or kwargs:
            n += self._arg_sizes(args, kwargs)
        if isinstance(receiver, (str, bytes)) and getattr(obj, "__name__", None) in _STR_METHOD_BOUNDS:
            name = obj.__name__
            if name == "join" and args and not isinstance(args[0], (str, list, tuple)):
                args = (list(args[0]), *args[1:])  # read once, for both
            try:
                bound = _STR_METHOD_BOUNDS[name](receiver, *args, **kwargs)
            except TypeError:  # arguments the method refuses too
                bound = 0
            self.refuse_past_room(bound, f"{type(receiver).__name__}.{name}")
        rv = super().call(context, obj, *args, **kwargs)
        self._charge(n + len(rv) if isinstance(rv, _SIZED) else n)  # one check: calls are in every line
        return rv

    def _arg_sizes(self, args, kwargs):
        n = 0
        for v in (*args, *kwargs.values()):
            if isinstance(v, _SIZED):
                n += len(v)
            elif isinstance(v, int):
                self.meter_arg(v)
        return n

    def call_binop(self, context, operator, left, right):
        if operator == "*":
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int):
                self.refuse_past_room(len(seq) * n, f"a sequence of {len(seq)} repeated {n} times")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                right * abs(left).bit_length() > MAX_POWER_BITS:
            raise TemplateWorkLimit(f"{left} ** {right}: more than {MAX_POWER_BITS} bits")
        elif operator == "%" and isinstance(left, (str, bytes)):
            self.refuse_past_room(_printf_bound(left, right, self.room()), f"the format {left[:24]!r} % ...")
        return self.meter_size(super().call_binop(context, operator, left, right))


def bound_template_work():
    """Makes transformers compile chat templates in MeteredSandbox (its module-level sandbox class, compiled
    templates cached by text). False when this transformers compiles them some other way: unmetered then."""
    try:
        from transformers.utils import chat_template_utils as ctu
    except ImportError:
        return False
    compile_ = getattr(ctu, "_compile_jinja_template", None)
    if compile_ is None or not hasattr(ctu, "ImmutableSandboxedEnvironment"):
        return False
    if ctu.ImmutableSandboxedEnvironment is not MeteredSandbox:
        ctu.ImmutableSandboxedEnvironment = MeteredSandbox
        if hasattr(compile_, "cache_clear"):
            compile_.cache_clear()  # a template compiled before would stay unmetered
    try:
        return isinstance(compile_("{{ 1 }}").environment, MeteredSandbox)
    except Exception:  # noqa: BLE001  (another signature: this version is not one the meter knows)
        return False
