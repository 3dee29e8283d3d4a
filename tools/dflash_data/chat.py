"""Conversations JSONL -> messages; the chat template -> token ids and the assistant-only loss mask."""

import json

from jinja2 import nodes, pass_context
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

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
        try:
            return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                add_generation_prompt=gen_prompt, **self.kw)
        except TemplateWorkLimit as e:
            raise BadRecord(self._too_much_work(e))
        except Exception as e:  # jinja2 errors, raise_exception() in templates
            raise BadRecord(f"the chat template refused the conversation: {type(e).__name__}: {e}")

    def _too_much_work(self, e):
        return (f"the chat template of {self.name} does too much work: {e} in one render (dflash-tokenize's "
                "limit; loops nested without bound or runaway recursion in the template?)")

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
            raise BadRecord(self._too_much_work(e))
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
# is bounded").
MAX_TEMPLATE_STEPS = 1_000_000
MAX_TEMPLATE_CHARS = 128 * 2 ** 20
MAX_POWER_BITS = 1 << 16  # x ** y: 2 ** 65536 is already far past any use in a template
_SIZED = (str, bytes, list, tuple, dict, set, frozenset, range)


class TemplateWorkLimit(Exception):
    """A render went past MAX_TEMPLATE_STEPS or MAX_TEMPLATE_CHARS (the message says which)."""


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


class MeteredSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox for chat templates with every render metered: steps (loop iterations, macro
    calls) and data (characters written by {{ }} and by template text in loops; what filters, calls, `+`
    and `~` take and make; `*` and `**` checked before they compute)."""

    code_generator_class = _MeteredCodeGenerator
    intercepted_binops = frozenset(["*", "**", "+"])

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("finalize", self._written)
        super().__init__(*args, **kwargs)
        self.filters.update(METER_FILTERS)
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

    def call(self, context, obj, /, *args, **kwargs):
        """A call's work grows with its receiver (text.count(x)) and arguments; its result is data built."""
        receiver = getattr(obj, "__self__", None)
        n = len(receiver) if isinstance(receiver, _SIZED) else 0
        if args or kwargs:
            n += self._arg_sizes(args, kwargs)
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
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_TEMPLATE_CHARS:
                raise TemplateWorkLimit(f"a sequence of {len(seq)} repeated {n} times: more than "
                                        f"{MAX_TEMPLATE_CHARS} characters")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and \
                right * abs(left).bit_length() > MAX_POWER_BITS:
            raise TemplateWorkLimit(f"{left} ** {right}: more than {MAX_POWER_BITS} bits")
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
