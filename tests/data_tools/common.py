"""Helpers of the data-tool tests: paths, running the tools, a tiny tokenizer per template."""
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" in the test log

HERE = os.path.dirname(os.path.realpath(__file__))
SRC = os.environ.get("DFLASH_SRC") or os.path.dirname(os.path.dirname(HERE))
TOKENIZE = os.path.join(SRC, "tools", "dflash-tokenize")
REGENERATE = os.path.join(SRC, "tools", "dflash-regenerate")
BIN = os.environ.get("DFLASH_BIN", "")
ENV = dict(os.environ, DFLASH_NO_REEXEC="1")  # the python running the tests, never another one


def run(tool, *args):
    """Runs a tool with this python; returns (exit code, stdout, stderr)."""
    p = subprocess.run([sys.executable, tool] + [str(a) for a in args], capture_output=True, text=True, env=ENV,
                       timeout=600)
    return p.returncode, p.stdout, p.stderr


_BASE_VM = []


def limit_address_space(extra=2 << 30):
    """A preexec_fn: the tool runs in `extra` bytes of address space beyond what this python takes once
    transformers' tokenizer classes are imported (with torch installed they import it: ~3 GB of mappings).
    A render that builds a huge string before the meter sees it runs out of memory there, at once."""
    if not _BASE_VM:
        out = subprocess.run([sys.executable, "-c", "from transformers import AutoTokenizer  # noqa\n"
                              "print([int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmPeak')][0])"],
                             capture_output=True, text=True, env=ENV, check=True).stdout
        _BASE_VM.append(int(out.split()[-1]) * 1024)
    limit = _BASE_VM[0] + extra
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def make_tokenizer(out, template="chatml"):
    subprocess.run([sys.executable, os.path.join(HERE, "make_tiny_tokenizer.py"), out, "--template", template],
                   check=True, capture_output=True, env=ENV)
    return out


def write_jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path


class TempDir:
    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="dflash-data-tools-")

    def __call__(self, *names):
        return os.path.join(self.path, *names)

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


def read_h5(path):
    import h5py
    with h5py.File(path, "r") as f:
        return {k: f[k][:] for k in ("tokens", "offsets", "loss_mask")}, dict(f.attrs), \
            {k: f[k].dtype.str for k in ("tokens", "offsets", "loss_mask")}


def masked_runs(tok, ids, mask):
    """The decoded text of each run of consecutive mask-1 tokens."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(int(t))
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


def records(h5):
    d, _, _ = read_h5(h5)
    o = d["offsets"]
    return [(d["tokens"][o[i]:o[i + 1]].tolist(), d["loss_mask"][o[i]:o[i + 1]].tolist()) for i in range(len(o) - 1)]
