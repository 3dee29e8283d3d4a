"""Writes the token dataset dflash-train reads (docs/data.md "File format", format_version 1), or the
pre-tokenized JSONL dflash-prep reads."""

import json
import os
import tempfile

FORMAT_VERSION = 1


class Records:
    """Records accumulated in memory: int32 ids and uint8 masks, one numpy array per record."""

    def __init__(self):
        self.ids, self.masks = [], []
        self.tokens = self.loss_tokens = 0

    def add(self, ids, mask):
        import numpy as np
        a, m = np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)
        self.ids.append(a)
        self.masks.append(m)
        self.tokens += len(a)
        self.loss_tokens += int(m.sum())

    def __len__(self):
        return len(self.ids)


def write_h5(path, records, vocab_size, tokenizer_name):
    """/tokens int32 [N], /offsets int64 [nseq+1], /loss_mask uint8 [N] (contiguous), attributes vocab_size
    (int64), tokenizer (string), format_version (int64) -- what write_token_dataset writes. Goes to a temp file
    in the same directory, renamed over `path`, so an existing dataset is never left half-written."""
    import h5py
    import numpy as np
    lengths = np.fromiter((len(a) for a in records.ids), dtype=np.int64, count=len(records.ids))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=d)
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("tokens", data=np.concatenate(records.ids).astype("<i4"), dtype="<i4")
            f.create_dataset("offsets", data=offsets.astype("<i8"), dtype="<i8")
            f.create_dataset("loss_mask", data=np.concatenate(records.masks).astype("u1"), dtype="u1")
            f.attrs["vocab_size"] = np.int64(vocab_size)
            f.attrs["tokenizer"] = str(tokenizer_name)
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_jsonl(path, records):
    """One {"input_ids": [...], "loss_mask": [...]} per line: dflash-prep's input."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            for ids, mask in zip(records.ids, records.masks):
                f.write(json.dumps({"input_ids": ids.tolist(), "loss_mask": mask.tolist()}) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
