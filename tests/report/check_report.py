#!/usr/bin/env python3
"""Checks dflash-report --json output against a scenario's "expect" section (tests/report/*.json), and
optionally the C++ model's what-if (dflash-synth-metrics --predict) against the report's Python one.

usage: check_report.py SCENARIO.json REPORT.json [CXX_PREDICT.json]     exit 0 = all checks pass
"""
import json
import re
import sys


def lookup(rep, path):
    node = rep
    parts = path.split(".")
    i = 0
    while i < len(parts):
        key = parts[i]
        if key == "whatif":
            split = parts[i + 1]
            node = next((w for w in node["whatif"] if w["split"] == split), None)
            if node is None:
                raise KeyError(f"no what-if row {split}")
            i += 2
            continue
        node = node[key]
        i += 1
    return node


def main(scenario_path, report_path, cxx_path=None):
    sc = json.load(open(scenario_path))
    rep = json.load(open(report_path))
    ex = sc["expect"]
    fails = []

    def check(ok, msg):
        print(("ok   " if ok else "FAIL ") + msg)
        if not ok:
            fails.append(msg)

    for item in ex.get("values", []):
        path, want, tol = item[0], item[1], item[2]
        mode = item[3] if len(item) > 3 else "rel"
        got = lookup(rep, path)
        ok = got is not None and (abs(got - want) <= tol if mode == "abs" else abs(got - want) <= tol * abs(want))
        check(ok, f"{path} = {got} (want {want} +- {tol}{'' if mode == 'abs' else ' rel'})")
    for path, floor in ex.get("at_least", []):
        got = lookup(rep, path)
        check(got is not None and got >= floor, f"{path} = {got} (want >= {floor})")
    for path in ex.get("none", []):
        got = lookup(rep, path)
        check(got is None, f"{path} = {got} (want null: not invented)")
    for key in ("best", "best_within_budget"):
        if key in ex:
            check(rep[key] == ex[key], f"{key} = {rep[key]} (want {ex[key]})")
    if "bottleneck" in ex:
        got = rep["observed"]["bottleneck"]
        check(got == ex["bottleneck"], f"bottleneck = {got} (want {ex['bottleneck']})")
    for pattern in ex.get("verdict_contains", []):
        check(re.search(pattern, rep["verdict"]) is not None, f"verdict matches /{pattern}/")

    if cxx_path:
        cxx = json.load(open(cxx_path))
        py_rows = {w["split"]: w for w in rep["whatif"]}
        check(len(cxx["whatif"]) == len(py_rows), f"C++ and Python list the same {len(py_rows)} splits")
        worst = 0.0
        for c in cxx["whatif"]:
            p = py_rows.get(c["split"])
            if p is None:
                check(False, f"C++ split {c['split']} missing in the report")
                continue
            for k in ("target_cap_bps", "drafter_cap_bps", "batches_per_s", "ktok_per_s", "power_w", "ktok_per_kw",
                      "eta_s", "allreduce_s_per_batch", "overlap"):
                a, b = c[k], p[k]
                if (a is None) != (b is None):
                    check(False, f"{c['split']}.{k}: C++ {a} vs Python {b}")
                elif a is not None:
                    worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
            for k in ("limit", "layout", "fit"):
                if c[k] != p[k]:
                    check(False, f"{c['split']}.{k}: C++ {c[k]} vs Python {p[k]}")
        check(worst < 1e-9, f"C++ and Python what-if agree (worst relative difference {worst:.2e})")
        check(cxx["best"] == rep["best"], f"C++ best {cxx['best']} = Python best {rep['best']}")
        if rep.get("power_budget_w"):
            check(cxx.get("best_within_budget") == rep["best_within_budget"],
                  f"C++ best within budget {cxx.get('best_within_budget')} = Python {rep['best_within_budget']}")
    print(f"{scenario_path}: {'all checks pass' if not fails else str(len(fails)) + ' FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
