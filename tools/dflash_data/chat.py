"""Conversations JSONL -> messages; the chat template -> token ids and the assistant-only loss mask."""

import json

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
        if method == "auto":
            method = "generation" if has_generation_tags(tokenizer) else "prefix"
        self.method = method
        if method == "prefix" and not getattr(tokenizer, "is_fast", False):
            raise ValueError("the prefix mask needs a fast tokenizer (tokenizer.json), for character offsets")

    def _render(self, messages, tools, gen_prompt):
        try:
            return self.tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                                add_generation_prompt=gen_prompt, **self.kw)
        except Exception as e:  # jinja2 errors, raise_exception() in templates
            raise BadRecord(f"the chat template refused the conversation: {type(e).__name__}: {e}")

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
