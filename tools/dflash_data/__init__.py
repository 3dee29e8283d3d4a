"""dflash_data: chat data -> token datasets for dflash-train (tools/dflash-tokenize, tools/dflash-regenerate).

docs/data.md "From chat data to a dataset" walks through both tools.
"""

import os
import re
import sys

# Exit codes shared with the C++ programs (README "Exit codes").
EXIT_BAD_OPTIONS = 2
EXIT_BAD_INPUT = 3
EXIT_SYSTEM = 8

TOOLS_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def version():
    """The project's version (CMakeLists.txt's project(... VERSION x)), the one dflash-train --version prints."""
    path = os.path.join(TOOLS_DIR, "..", "CMakeLists.txt")
    try:
        with open(path) as f:
            m = re.search(r"project\(\s*dflash-train\b[^)]*\bVERSION\s+([0-9][0-9.]*)", f.read())
        return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


# The files a Hugging Face tokenizer keeps its vocabulary in (fast, SentencePiece, BPE, WordPiece), and
# tiktoken ranks (*.tiktoken).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
NO_TOKENIZER_HINT = ("copy the target's tokenizer files beside its config.json (tools/dflash-make-tokenizer DIR builds "
                     "Qwen3's offline); build/dflash-make-tiny writes one into its tiny target")


def has_tokenizer_files(model_dir):
    """Whether model_dir holds a tokenizer's vocabulary. transformers 5 builds an empty tokenizer (one token, no
    chat template) from a directory with only config.json, so the tools check before loading, to say what is
    missing rather than "no chat template"."""
    try:
        names = os.listdir(model_dir)
    except OSError:
        return False
    return any(n in TOKENIZER_FILES or n.endswith(".tiktoken") for n in names)


def venv_dir():
    """Where tools/setup.sh installs the Python packages of the data tools (a venv over Debian's python3)."""
    return os.environ.get("DFLASH_VENV") or os.path.join(os.path.expanduser("~"), ".local", "share", "dflash-train",
                                                         "venv")


def reexec_in_venv_or_exit(tool, modules, script, hint=None):
    """Called when importing `modules` failed: re-runs `script` under the project's venv python if that is not
    the running interpreter and exists, else exits 2 naming what is missing and how to install it."""
    py = os.path.join(venv_dir(), "bin", "python3")
    if os.path.exists(py) and os.path.realpath(sys.prefix) != os.path.realpath(venv_dir()) and \
            not os.environ.get("DFLASH_NO_REEXEC"):
        os.environ["DFLASH_NO_REEXEC"] = "1"  # once: a venv without the packages must not loop
        os.execv(py, [py, os.path.realpath(script)] + sys.argv[1:])
    sys.stderr.write(f"{tool}: needs the Python packages {', '.join(modules)} ("
                     + (hint or f"tools/setup.sh installs them into {venv_dir()}; or: pip install -r "
                        "requirements-data.txt") + ")\n")
    sys.exit(EXIT_BAD_OPTIONS)


class BadRecord(Exception):
    """A line of the input that cannot become a record; the message says why (without the line number)."""


class Progress:
    """A progress line on stderr, at most once a second, overwritten in place (\\r); done() ends it."""

    def __init__(self, tool, total_bytes=0):
        import time
        self._time = time.monotonic
        self.tool, self.total = tool, total_bytes
        self.last, self.shown = self._time(), False

    def update(self, text, done_bytes=None, force=False):
        now = self._time()
        if not force and now - self.last < 1.0:
            return
        self.last = now
        pct = f" ({100.0 * done_bytes / self.total:.0f}%)" if done_bytes is not None and self.total > 0 else ""
        sys.stderr.write(f"\r{self.tool}: {text}{pct}   ")
        sys.stderr.flush()
        self.shown = True

    def done(self):
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
