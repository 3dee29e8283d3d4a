#!/usr/bin/env python3
"""Every repository path a document or a comment cites must exist.

Moves leave stale citations behind (a comment naming src/old/place.cpp after the file moved); this test
finds them. It reads every *.md, and the comments of the sources under src/ include/ kernels/ apps/ tools/
bench/ tests/ jobs/ cmake/ (// and /* */ in C++ and CUDA, # in scripts, configs and CMake), picks the tokens
that look like a repository path (a top-level folder such as src/ or docs/, then a name), drops a `:line`
suffix and checks that the file or folder is there. A stem stands for its files (src/model/qwen3_target
for .h and .cpp, bench/results/h200-run5 for h200-run5-*.txt), and src/x.h/.cpp for both. Not checked: URLs
and paths under another root (../shared, /models/..., $WORK/..., build/tests/...: the character before the
token is not a separator), paths in another repository (written right after its owner/name, e.g.
z-lab/dflash `tests/fixtures/x.json`), globs and placeholders (kernels/<op>.cu, tests/e2e/test_*.sh), and
bench/results/ (records of past runs: their paths are as they were then).

Usage: check_cited_paths.py [REPO_ROOT]   (default: this file's repository). Exit 1 listing each stale path.
"""
import os
import re
import subprocess
import sys

TOP = ("src", "docs", "kernels", "include", "bench", "tools", "jobs", "tests", "apps", "cmake")
COMMENTED = ("src", "include", "kernels", "apps", "tools", "bench", "tests", "jobs", "cmake")
C_LIKE = (".cpp", ".h", ".cu", ".cuh", ".c", ".hpp", ".cc")
HASH = (".py", ".sh", ".cfg", ".cmake", ".txt", ".yaml", ".yml", ".toml", ".sbatch", "")
SKIP_DIRS = ("third_party", ".git")
RECORDS = "bench/results/"

# A path token: a top-level folder, a slash, then name characters, ending on a name character. It must not
# follow a character that would make it part of a longer path, a URL or a variable (/ . - word $ { ~).
TOKEN = re.compile(r"(?<![\w./\-${}~])((?:%s)/[\w./+\-]*\w)" % "|".join(TOP))
GLOB_NEXT = set("*<{[?")
PATH_CHARS = re.compile(r"[\w./+\-]*")
OTHER_REPO = re.compile(r"[\w.\-]+/[\w.\-]+ `?$")  # "z-lab/dflash `" right before the token


def repo_files(root):
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "-co", "--exclude-standard"], check=True,
                             capture_output=True, text=True).stdout
        files = [f for f in out.splitlines() if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, subdirs, names in os.walk(root):
            subdirs[:] = [s for s in subdirs if s not in SKIP_DIRS and not s.startswith("build")]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    return [f for f in files if not f.startswith(SKIP_DIRS) and os.path.isfile(os.path.join(root, f))]


def comments(path, text):
    """The comment text of a source file, each piece with the line it starts on."""
    ext = os.path.splitext(path)[1]
    if ext in C_LIKE:
        for m in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S):
            yield text.count("\n", 0, m.start()) + 1, m.group(0)
    elif ext in HASH or os.path.basename(path) == "CMakeLists.txt":
        for n, line in enumerate(text.splitlines(), 1):
            i = line.find("#")
            if i >= 0 and not line.startswith("#!"):
                yield n, line[i:]


def exists(root, p, files):
    """p is a file or folder of the repository, or the stem of one or more of its files."""
    p = re.sub(r"/\.\w+$", "", p)  # a header and its source cited as one (name.h/.cpp): the header
    if os.path.exists(os.path.join(root, p)):
        return True
    return any(f.startswith(p) and f[len(p)] in "._-" for f in files if len(f) > len(p))


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    stale = []
    checked = 0
    files = sorted(repo_files(root))
    for f in files:
        if f.startswith(RECORDS):
            continue
        try:
            text = open(os.path.join(root, f), encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        if f.endswith(".md"):
            pieces = [(1, text)]
        elif f.split("/", 1)[0] in COMMENTED:
            pieces = list(comments(f, text))
        else:
            continue
        for first_line, piece in pieces:
            for m in TOKEN.finditer(piece):
                rest = m.end() + len(PATH_CHARS.match(piece, m.end()).group(0))
                if piece[rest:rest + 1] in GLOB_NEXT or OTHER_REPO.search(piece, 0, m.start()):
                    continue  # a glob or placeholder; a path in another repository
                p = m.group(1).rstrip(".")
                checked += 1
                if not exists(root, p, files):
                    line = first_line + piece.count("\n", 0, m.start())
                    stale.append(f"{f}:{line}: {p}")
    for s in stale:
        print("stale path:", s)
    print(f"{checked} cited paths checked, {len(stale)} stale")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
