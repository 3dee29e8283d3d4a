#!/usr/bin/env python3
"""bench/bench_rows.py, the Python twin of the bench writer, prints what tests/bench/test_bench_writer.cpp
expects of the C++ one (the same table, byte for byte), its --json lines parse, read_rows / read_cases read
both back, and the references' column sets are the C++ drivers' (read from their sources)."""
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench_rows as br  # noqa: E402


def run(json_lines):
    out = io.StringIO()
    w = br.Writer("test_bench", json_lines=json_lines, out=out, argv=["test_bench", "--model", "8b"])
    w.begin('0 "Fake GPU", 1.0 GiB', br.timing_line(2, 5))
    w.meta("model", "8b")
    w.columns([br.text("case", 10), br.text("model", 5), br.num("T", "", 0), br.num("step_ms", "ms", 2),
               br.num("tok_per_s", "tok/s", 0)])
    w.row(["forward", "8b", 16384, 98.214, 166823.4])
    w.row(["gemm", "8b", 16384, 70.5])
    w.row(["b c", "", float("nan")])
    w.note("all checks passed")
    return out.getvalue().splitlines()


def cpp_columns(path, fn):
    """The columns a C++ driver's `fn()` returns, read from its source: text("key", w) and num("key", "unit", p[, w])."""
    src = open(path).read()
    i = src.index("std::vector<bench::Column> %s() {" % fn)
    body = src[i:src.index("\n}\n", i)]
    cols = []
    for kind, args in re.findall(r'\b(text|num)\(([^()]*)\)', body):
        a = [x.strip().strip('"') for x in args.split(",")]
        cols.append(br.text(a[0], int(a[1])) if kind == "text" else
                    br.num(a[0], a[1], int(a[2]), int(a[3]) if len(a) > 3 else 0))
    return [(c.key, c.unit, c.precision, c.width) for c in cols]


def main():
    # The references' tables are the drivers' (same keys, units, precision, widths): ours and theirs line up.
    bench_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
    for fn, src in (("forward_columns", "bench_target_forward.cpp"), ("hybrid_columns", "bench_hybrid_forward.cpp"),
                    ("step_columns", "drafter_bench.cpp")):
        want = cpp_columns(os.path.join(bench_dir, src), fn)
        got = [(c.key, c.unit, c.precision, c.width) for c in getattr(br, fn)()]
        assert want and got == want, (fn, got, want)

    t = run(False)
    assert t[0] == "# bench: test_bench", t[0]
    assert t[1] == "# command: test_bench --model 8b", t[1]
    assert t[6] == "# timing: 2 warm-up + 5 timed, CUDA events, median", t[6]
    want = ["# case       model      T step_ms tok_per_s",
            "#                            (ms)   (tok/s)",
            "  forward    8b     16384   98.21    166823",
            "  gemm       8b     16384   70.50         -",
            "  b_c        -          -       -         -",
            "# all checks passed"]
    assert t[9:15] == want, "\n".join(t[9:15])
    rows = br.read_rows(t)
    assert rows == [{"case": "forward", "model": "8b", "T": 16384.0, "step_ms": 98.21, "tok_per_s": 166823.0},
                    {"case": "gemm", "model": "8b", "T": 16384.0, "step_ms": 70.5, "tok_per_s": None},
                    {"case": "b_c", "model": None, "T": None, "step_ms": None, "tok_per_s": None}], rows
    j = br.read_cases(run(True))
    assert len(j) == 3 and j[0]["case"] == "forward" and j[0]["step_ms"] == 98.21 and j[1]["tok_per_s"] is None, j
    assert j[0]["bench"] == "test_bench" and j[0]["device"] == '0 "Fake GPU", 1.0 GiB', j[0]
    json.dumps(j)
    # Side by side: a file with two drivers' tables (ours, then a reference's) and a JSON line.
    ours, ref, js = io.StringIO(), io.StringIO(), io.StringIO()
    for out, bench, impl, js_lines in ((ours, "drafter_bench", "ours", False), (ref, "ref_drafter_step", "torch-flex", False),
                                       (js, "ref_dflash2_step", "torch-sdpa", True)):
        w = br.Writer(bench, json_lines=js_lines, out=out, argv=[bench])
        w.begin("dev", br.timing_line(2, 10))
        w.columns(br.step_columns())
        w.row(["step", impl, "8b", "dflash", 16, "ce", "fp32", None, 150.0, 149.0, 151.0, None, None, None, 40.0])
        w.row(["gemm", impl, "8b", "dflash", 16, "ce", "fp32", None, 60.0])
    lines = ("nvidia-smi line\n" + ours.getvalue() + ref.getvalue() + js.getvalue()).splitlines(True)
    cases = [c for c in br._read_any(lines) if c["case"] == "step"]
    assert [c["bench"] for c in cases] == ["drafter_bench", "ref_drafter_step", "ref_dflash2_step"], cases
    assert [c["impl"] for c in cases] == ["ours", "torch-flex", "torch-sdpa"] and all(c["ms"] == 150.0 for c in cases), cases
    print("PASS")


if __name__ == "__main__":
    main()
