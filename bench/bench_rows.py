"""The bench writer of bench/bench_common.h for the PyTorch references (bench/ref_*.py): the same `# key: value`
metadata, the same fixed-width rows with units under the header, and --json for one JSON line per case, so a
reference's numbers sit beside ours in one file and parse the same way (bench/README.md, "Output format").

    w = Writer("ref_target_forward", json_lines=args.json)
    w.begin(device_line(), timing_line(args.warmup, args.iters))
    w.meta("model", "8b")
    w.columns([text("case", 10), num("ms", "ms", 2)])
    w.row(["forward", 98.2])
"""
import json
import math
import os
import shlex
import socket
import subprocess
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


class Column:
    def __init__(self, key, unit="", precision=2, width=0):
        self.key, self.unit, self.precision = key, unit, precision
        w = max(width, len(key), len(unit) + 2 if unit else 0)
        self.width = max(w, 6) if precision >= 0 else w


def text(key, width=8):
    return Column(key, "", -1, width)


def num(key, unit, precision, width=0):
    return Column(key, unit, precision, width)


def _missing(v):
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def commit():
    """The checkout's commit (git rev-parse HEAD, -dirty with uncommitted changes), as the C++ build records it."""
    try:
        c = subprocess.run(["git", "-C", _HERE, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", _HERE, "diff", "--quiet", "HEAD", "--"], capture_output=True).returncode == 1
        return c + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def device_line(index=0):
    """The C++ drivers' device line, from torch (name, memory, SMs, compute capability, CUDA runtime)."""
    import torch
    if not torch.cuda.is_available():
        return "cpu (torch %s)" % torch.__version__
    p = torch.cuda.get_device_properties(index)
    return '%d "%s", %.1f GiB, %d SMs, sm_%d%d, torch %s CUDA %s' % (
        index, p.name, p.total_memory / 2**30, p.multi_processor_count, p.major, p.minor, torch.__version__,
        torch.version.cuda)


def timing_line(warmup, iters, clock="CUDA events"):
    return "%d warm-up + %d timed, %s, median" % (warmup, iters, clock)


def add_json_flag(ap):
    ap.add_argument("--json", action="store_true", help="one JSON line per case instead of the fixed-width rows")


class Writer:
    def __init__(self, bench, json_lines=False, out=None, argv=None):
        self.bench, self.json = bench, json_lines
        self.out = out or sys.stdout
        self.command = " ".join(shlex.quote(a) for a in (sys.argv if argv is None else argv))
        self.device, self.cols, self._header = "", [], False

    def _print(self, s):
        print(s, file=self.out, flush=True)

    def begin(self, device, timing):
        self.device = device
        self.meta("bench", self.bench)
        self.meta("command", self.command)
        self.meta("date", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.meta("build", commit())
        self.meta("host", socket.gethostname())
        self.meta("device", device)
        self.meta("timing", timing)
        self.meta("format", "one JSON line per case (the lines that start with '{')" if self.json
                  else "one row per case, units under the header; --json for JSON lines")

    def meta(self, key, value):
        self._print("# %s: %s" % (key, value))

    def note(self, s):
        self._print("# " + s)

    def columns(self, cols):
        self.cols, self._header = list(cols), False

    @staticmethod
    def cell_text(v, c):
        if _missing(v):
            return "-"
        if isinstance(v, str):
            return v.replace(" ", "_") or "-"  # a row splits on blanks
        return "%.*f" % (max(c.precision, 0), v)

    @staticmethod
    def _pad(s, c):
        return s.ljust(c.width) if c.precision < 0 else s.rjust(c.width)

    def row(self, cells):
        cells = list(cells) + [None] * (len(self.cols) - len(cells))
        if self.json:
            d = {"bench": self.bench, "commit": commit(), "device": self.device}
            for i, (c, v) in enumerate(zip(self.cols, cells)):
                k = "case" if i == 0 else c.key
                if _missing(v):
                    d[k] = None
                elif isinstance(v, str):
                    d[k] = v
                else:
                    d[k] = json.loads("%.*f" % (max(c.precision, 0), v))
            self._print(json.dumps(d))
            return
        if not self._header:
            names = "#" + "".join(" " + self._pad(c.key, c) for c in self.cols)
            units = "#" + "".join(" " + self._pad("(%s)" % c.unit if c.unit else "", c) for c in self.cols)
            self._print(names.rstrip())
            self._print(units.rstrip())
            self._header = True
        self._print((" " + "".join(" " + self._pad(self.cell_text(v, c), c) for c, v in zip(self.cols, cells))).rstrip())


def read_cases(lines):
    """The cases of a driver's --json output (a file may hold several drivers'): the lines that start with '{'."""
    return [json.loads(l) for l in lines if l.startswith("{")]


def read_rows(lines):
    """The cases of a driver's table output: every row under a `#` header, as a dict keyed like the JSON lines
    (numbers as float, "-" as None). Works on a file holding several drivers' tables."""
    cases, keys, prev = [], None, None
    for l in lines:
        l = l.rstrip("\n")
        if l.startswith("#"):
            # a header is the `#` line followed by the units line (starting "#" and only "(...)" fields)
            if prev is not None and all(f.startswith("(") for f in l[1:].split()) and prev[1:].split():
                keys = prev[1:].split()
            prev = l
            continue
        prev = None
        if keys and l.startswith("  "):
            f = l.split()
            if len(f) != len(keys):
                continue
            d = {}
            for i, (k, v) in enumerate(zip(keys, f)):
                k = "case" if i == 0 else k
                if v == "-":
                    d[k] = None
                else:
                    try:
                        d[k] = float(v)
                    except ValueError:
                        d[k] = v
            cases.append(d)
    return cases


# The C++ drivers' tables, for the references that sit beside them (same keys, units and widths).
def forward_columns():  # bench_target_forward.cpp: forward_columns()
    return [text("case", 14), text("impl", 8), text("model", 5), num("T", "", 0), num("nseq", "", 0),
            num("ms", "ms", 2, 8), num("min_ms", "ms", 2), num("pct", "%", 1), num("tok_per_s", "tok/s", 0, 9),
            num("tflops", "TFLOP/s", 1), num("gb_per_s", "GB/s", 0), num("mem_gib", "GiB", 2)]


def hybrid_columns():  # bench_hybrid_forward.cpp: hybrid_columns()
    return [text("case", 19), text("impl", 8), text("model", 11), num("T", "", 0), num("nseq", "", 0),
            num("ms", "ms", 2, 8), num("min_ms", "ms", 2), num("max_ms", "ms", 2), num("pct", "%", 1),
            num("ops", "", 0), num("tok_per_s", "tok/s", 1, 9), num("tflops", "TFLOP/s", 1), num("peak_gib", "GiB", 2),
            num("growth_gib", "GiB", 2)]


def step_columns():  # drafter_bench.cpp: step_columns()
    return [text("case", 18), text("impl", 18), text("model", 5), text("arch", 7), num("block", "", 0),
            text("objective", 9), text("state", 5), num("det", "", 0), num("ms", "ms", 1, 7), num("min_ms", "ms", 1),
            num("max_ms", "ms", 1), num("pct", "%", 1), num("tflop", "TFLOP", 2), num("tflops", "TFLOP/s", 0),
            num("mem_gib", "GiB", 2)]


def _read_any(lines):
    """Both formats from one file; each case gets the `# bench:` it came under."""
    out, bench, table = [], None, []
    for l in lines:
        l = l.rstrip("\n")
        if l.startswith("# bench: "):
            if table:
                out += [dict(bench=bench, **c) for c in read_rows(table)]
            bench, table = l[len("# bench: "):], []
        elif l.startswith("{"):
            out.append(json.loads(l))
        else:
            table.append(l)
    if table:
        out += [dict(bench=bench, **c) for c in read_rows(table)]
    return out


def main(argv=None):
    """Side by side: the cases of one or more outputs (ours and the references', rows or JSON lines) as one
    table, e.g. python3 bench/bench_rows.py out/bench.txt --case step."""
    import argparse
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--case", action="append", help="only these cases (repeatable)")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead")
    a = ap.parse_args(argv)
    cases = []
    for f in a.files:
        with open(f, errors="replace") as fh:
            cases += _read_any(fh.readlines())
    if a.case:
        cases = [c for c in cases if c.get("case") in a.case]
    if a.json:
        for c in cases:
            print(json.dumps(c))
        return 0
    keys = []  # every key some case has a value for, in first-seen order
    for c in cases:
        keys += [k for k, v in c.items() if v is not None and k not in keys and k not in ("commit", "device")]
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return ("%.0f" % v) if v == int(v) and abs(v) >= 1000 else ("%g" % v if abs(v) < 1e6 else "%.0f" % v)
        return str(v)
    grid = [[fmt(c.get(k)) for k in keys] for c in cases]
    w = [max([len(k)] + [len(r[i]) for r in grid]) for i, k in enumerate(keys)]
    print(("#" + "".join(" " + k.ljust(w[i]) for i, k in enumerate(keys))).rstrip())
    for r in grid:
        print((" " + "".join(" " + v.ljust(w[i]) for i, v in enumerate(r))).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
