"""tiktoken-format BPE ranks -> a Hugging Face byte-level BPE tokenizer.json, and a pure-Python encoder over
the ranks (the reference the built tokenizer is checked against; tools/dflash-make-tokenizer,
tests/data_tools/test_make_tokenizer.py).

A ranks file holds one token a line: base64 of the token's bytes, a space, its rank (= its id). tiktoken
encodes a pre-tokenized piece by repeatedly merging the adjacent pair whose concatenation has the lowest rank
(a piece that is itself a token is that token). A byte-level BPE model does the same when its merge list
holds, for every token of two or more bytes, each split of it into two tokens, ordered by the merged token's
rank (then the left part's, then the right part's rank): the pair it merges first is then always the one
whose merged token ranks lowest, as in tiktoken.
"""

import base64
import unicodedata


class BadRanks(Exception):
    """The ranks file is not tiktoken's base64-rank format; the message says where and why."""


def bytes_to_unicode():
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def load_ranks(path):
    """{token bytes: rank}; the ranks must be 0..N-1, each once, and every single byte must be a token."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise BadRanks(f"cannot read {path}: {e.strerror}")
    ranks, seen = {}, set()
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise BadRanks(f"{path}:{n}: want 'BASE64 RANK', got {line[:60]!r}")
        try:
            tok = base64.b64decode(parts[0], validate=True)
            rank = int(parts[1])
        except ValueError as e:
            raise BadRanks(f"{path}:{n}: {e}")
        if not tok or tok in ranks or rank in seen or rank < 0:
            raise BadRanks(f"{path}:{n}: empty or repeated token, or repeated/negative rank {rank}")
        ranks[tok] = rank
        seen.add(rank)
    if not ranks:
        raise BadRanks(f"{path}: no ranks in it")
    if max(seen) != len(ranks) - 1:
        raise BadRanks(f"{path}: ranks are not 0..{len(ranks) - 1} (largest {max(seen)})")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise BadRanks(f"{path}: {len(missing)} single bytes are not tokens (e.g. {missing[0]:#04x}): "
                       "byte-level BPE needs all 256")
    return ranks


def vocab_and_merges(ranks):
    """(vocab {byte-level string: id}, merges [[left, right], ...] in merge order) for ranks."""
    enc = bytes_to_unicode()

    def s(b):
        return "".join(enc[x] for x in b)

    vocab, merges = {}, []
    for tok, rank in ranks.items():
        vocab[s(tok)] = rank
        for i in range(1, len(tok)):
            left, right = tok[:i], tok[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    merges.sort()
    return vocab, [[s(m[3]), s(m[4])] for m in merges]


def tokenizer_json(ranks, pattern, added_tokens):
    """The tokenizer.json dict: NFC, split by `pattern` (isolated), byte level, BPE over the ranks, the added
    tokens [(id, content, special)] matched before everything else (not normalized)."""
    vocab, merges = vocab_and_merges(ranks)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": sp} for i, c, sp in added_tokens],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": dict(byte_level),
        "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }


class Encoder:
    """tiktoken's algorithm in plain Python (slow; a reference for tests and the builder's self-check): NFC,
    the added tokens split out first, each piece of `pattern` BPE-merged by rank."""

    def __init__(self, ranks, pattern, added_tokens):
        import regex  # \p{L} classes; a dependency of transformers
        self.ranks, self.pat = ranks, regex.compile(pattern)
        self.added = {c: i for i, c, _ in added_tokens}
        alts = sorted(self.added, key=len, reverse=True)
        self.split = regex.compile("(" + "|".join(regex.escape(a) for a in alts) + ")") if alts else None

    def _piece(self, b):
        r = self.ranks.get(b)
        if r is not None:
            return [r]
        parts = [b[i:i + 1] for i in range(len(b))]
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ranks[p] for p in parts]

    def encode(self, text):
        text = unicodedata.normalize("NFC", text)
        chunks = self.split.split(text) if self.split else [text]
        ids = []
        for c in chunks:
            if c in self.added:
                ids.append(self.added[c])
                continue
            for m in self.pat.finditer(c):
                ids.extend(self._piece(m.group(0).encode("utf-8")))
        return ids
