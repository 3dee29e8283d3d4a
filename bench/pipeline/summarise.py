#!/usr/bin/env python3
"""Summarises a pipeline benchmark run's metrics.h5 (bench/pipeline/README.md): steady-state batches/s
(steps after the warm-up, from /steps/time_s), each role's busy/wait split from /ranks, GPU power.
Usage: summarise.py METRICS.h5 [--skip N] [--target-s S --drafter-s S] [--separate-gpus]
(standalone seconds per batch; --separate-gpus: the target and the drafter had a GPU each, so the ceiling
is the slower role's rate, min(1/t, 1/d), not the one-GPU 1/(t + d))"""
import argparse

import h5py
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("metrics")
ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
ap.add_argument("--target-s", type=float, help="standalone target seconds per batch (--measure-only)")
ap.add_argument("--drafter-s", type=float, help="standalone drafter seconds per batch (--measure-only)")
ap.add_argument("--separate-gpus", action="store_true", help="target and drafter on GPUs of their own")
a = ap.parse_args()
f = h5py.File(a.metrics, "r")
t = f["steps/time_s"][:]
tok = f["steps/tokens"][:]
n = len(t)
assert n > a.skip + 2, f"only {n} steps"
span = t[-1] - t[a.skip]
bps = (n - 1 - a.skip) / span
print(f"# {a.metrics}: {n} steps, topology {f.attrs.get('topology', '?')}")
print(f"{'steady batches/s':32s} {bps:10.3f}   (steps {a.skip + 1}..{n}, {span:.1f} s)")
print(f"{'steady Ktok/s':32s} {tok[a.skip + 1:].sum() / span / 1e3:10.2f}")
r = f["ranks"]
role, ts = r["role"][:], r["time_s"][:]
names = {0: "target", 1: "drafter"}
for code, name in names.items():
    sel = role == code
    if not sel.any():
        continue
    cols = ["compute_s", "credit_wait_s", "data_wait_s", "allreduce_s", "optimizer_s"]
    tot = {c: r[c][:][sel].sum() for c in cols if c in r}
    busy = r["busy_s"][:][sel].sum()
    wait = r["wait_s"][:][sel].sum()
    batches = r["batches"][:][sel].sum()
    split = ", ".join(f"{c[:-2]} {v:.2f}s" for c, v in tot.items() if v > 0)
    print(f"{name + ' busy/wait':32s} busy {busy:.2f}s wait {wait:.2f}s over {batches} batches ({split})")
    if name == "drafter":
        step_s = (tot.get("compute_s", 0) + tot.get("optimizer_s", 0)) / max(batches, 1)
        dw = tot.get("data_wait_s", 0) / max(batches, 1)
        print(f"{'drafter data wait / step time':32s} {100 * dw / max(step_s, 1e-12):9.2f} %  ({dw * 1e3:.1f} ms of {step_s * 1e3:.1f} ms)")
        # The same after the first logging interval (which holds the wait for the target's first batch).
        iv = r["interval"][:]
        st = sel & (iv > iv[sel].min())
        nb = r["batches"][:][st].sum()
        if nb > 0:
            s_st = (r["compute_s"][:][st].sum() + r["optimizer_s"][:][st].sum()) / nb
            dw_st = r["data_wait_s"][:][st].sum() / nb
            print(f"{'  steady (after interval 1)':32s} {100 * dw_st / max(s_st, 1e-12):9.2f} %  ({dw_st * 1e3:.1f} ms of {s_st * 1e3:.1f} ms, {nb} batches)")
if a.target_s and a.drafter_s:
    print(f"{'standalone target b/s':32s} {1 / a.target_s:10.3f}")
    print(f"{'standalone drafter b/s':32s} {1 / a.drafter_s:10.3f}")
    if a.separate_gpus:
        ceiling = min(1 / a.target_s, 1 / a.drafter_s)
        slower = "target" if a.target_s > a.drafter_s else "drafter"
        print(f"{'ceiling min(1/t, 1/d)':32s} {ceiling:10.3f}   ({slower}-bound) -> run at {100 * bps / ceiling:.1f} % of it")
    else:
        ceiling = 1.0 / (a.target_s + a.drafter_s)
        print(f"{'one-GPU ceiling 1/(1/t+1/d)':32s} {ceiling:10.3f}   -> run at {100 * bps / ceiling:.1f} % of it")
g = f["gpus"]
if g.attrs.get("available", 0) and "power_w" in g:
    p = g["power_w"][:]
    p = p.reshape(p.shape[0], -1)
    for i in range(p.shape[1]):
        print(f"{'GPU %d power (NVML) mean / max' % i:32s} {np.nanmean(p[:, i]):8.0f} W / {np.nanmax(p[:, i]):.0f} W over {p.shape[0]} samples")
else:
    print(f"{'GPU power':32s} not measured: {g.attrs.get('reason', '?')}")
