"""Writes the token dataset dflash-train reads (docs/data.md "File format", format_version 1), or the
pre-tokenized JSONL dflash-prep reads."""

import json
import os
import tempfile

FORMAT_VERSION = 1
BLOCK = 1 << 24  # tokens copied per step into the HDF5 file


class Records:
    """Records spooled to two temp files beside the output (int32 ids, uint8 masks) and their lengths in
    memory, so a dataset of billions of tokens needs no more RAM than its offsets. close() removes them."""

    def __init__(self, directory):
        self.dir = tempfile.mkdtemp(prefix=".dflash-tokenize.", dir=directory)
        self._ids = open(os.path.join(self.dir, "ids.bin"), "wb")
        self._mask = open(os.path.join(self.dir, "mask.bin"), "wb")
        self.lengths = []
        self.tokens = self.loss_tokens = 0

    def add(self, ids, mask):
        import numpy as np
        a, m = np.asarray(ids, dtype="<i4"), np.asarray(mask, dtype="u1")
        self._ids.write(a.tobytes())
        self._mask.write(m.tobytes())
        self.lengths.append(len(a))
        self.tokens += len(a)
        self.loss_tokens += int(m.sum())

    def __len__(self):
        return len(self.lengths)

    def arrays(self):
        """(ids, mask, offsets): memory-mapped ids and masks, offsets int64 [n+1]."""
        import numpy as np
        self._ids.flush()
        self._mask.flush()
        ids = np.memmap(self._ids.name, dtype="<i4", mode="r", shape=(self.tokens,))
        mask = np.memmap(self._mask.name, dtype="u1", mode="r", shape=(self.tokens,))
        offsets = np.zeros(len(self.lengths) + 1, dtype="<i8")
        np.cumsum(np.asarray(self.lengths, dtype=np.int64), out=offsets[1:])
        return ids, mask, offsets

    def close(self):
        import shutil
        for f in (self._ids, self._mask):
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def current_umask():
    """The process's umask, read without setting it (/proc/self/status); os.umask can only read by setting,
    which races with threads creating files. 0o022 where the kernel does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _atomic(path, write):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=d)
    # mkstemp makes 0600; a dataset gets the mode open() would give it, as the user's umask says
    os.fchmod(fd, 0o666 & ~current_umask())
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_h5(path, records, vocab_size, tokenizer_name):
    """/tokens int32 [N], /offsets int64 [nseq+1], /loss_mask uint8 [N] (contiguous), attributes vocab_size
    (int64), tokenizer (string), format_version (int64) -- what write_token_dataset writes. Goes to a temp file
    in the same directory, renamed over `path`, so an existing dataset is never left half-written."""
    import h5py
    import numpy as np
    ids, mask, offsets = records.arrays()

    def write(tmp):
        with h5py.File(tmp, "w") as f:
            t = f.create_dataset("tokens", shape=(len(ids),), dtype="<i4")
            f.create_dataset("offsets", data=offsets, dtype="<i8")
            m = f.create_dataset("loss_mask", shape=(len(mask),), dtype="u1")
            for a in range(0, len(ids), BLOCK):
                t[a:a + BLOCK] = ids[a:a + BLOCK]
                m[a:a + BLOCK] = mask[a:a + BLOCK]
            f.attrs["vocab_size"] = np.int64(vocab_size)
            f.attrs["tokenizer"] = str(tokenizer_name)
            f.attrs["format_version"] = np.int64(FORMAT_VERSION)
    _atomic(path, write)


def write_jsonl(path, records):
    """One {"input_ids": [...], "loss_mask": [...]} per line: dflash-prep's input."""
    ids, mask, offsets = records.arrays()

    def write(tmp):
        with open(tmp, "w") as f:
            for r in range(len(offsets) - 1):
                a, b = int(offsets[r]), int(offsets[r + 1])
                f.write(json.dumps({"input_ids": ids[a:b].tolist(), "loss_mask": mask[a:b].tolist()}) + "\n")
    _atomic(path, write)
