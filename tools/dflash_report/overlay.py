"""Several runs on the same axes (dflash-report A.h5 B.h5 ... --png out.png; docs/report.md "Several runs on
the same axes"): one colour per run, its legend the run's name, split and machine.

  loss by tokens trained   loss by time
  acc by tokens trained    streak by tokens trained
  throughput (trained Ktok/s per report interval) by time
  held-out loss by tokens trained (when a run has /eval), tau (when a run measured it)

The training curves are drawn over the tokens trained, not the step: a step trains one batch per drafter, so
a run with two drafters trains twice the tokens of a run with one in the same number of steps. Time is
minutes since each run's start (a resumed run's segments follow each other). Faint: every step; bold: the
moving mean (about 25 windows over each run).
"""

import os

import matplotlib

matplotlib.use("Agg")  # no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .dashboard import _smooth  # noqa: E402
from .export import Timeline, interval_throughput  # noqa: E402


def run_names(paths):
    """A short distinct name per run: its directory's name (runs/7-1/metrics.h5 -> 7-1), else the file's stem;
    repeated names get the parent directories until they differ, else [k]."""
    def parts(p):
        p = os.path.abspath(p)
        d, b = os.path.split(p)
        stem = os.path.splitext(b)[0]
        chain = [x for x in d.split(os.sep) if x]
        return ([] if b == "metrics.h5" else [stem]) + list(reversed(chain))
    chains = [parts(p) for p in paths]

    def at(c, depth):
        return "/".join(reversed(c[:depth]))
    names = []
    for i, c in enumerate(chains):
        name = None
        for depth in range(1, len(c) + 1):
            if not any(j != i and at(o, depth) == at(c, depth) for j, o in enumerate(chains)):
                name = at(c, depth)
                break
        names.append(name or at(c, 1) or f"run{i + 1}")  # the same file twice: numbered below
    counts, seen = {n: names.count(n) for n in names}, {}
    for i, n in enumerate(names):
        if counts[n] > 1:
            seen[n] = seen.get(n, 0) + 1
            names[i] = f"{n} [{seen[n]}]"
    return names


def label(run, name):
    return f"{name}: {run.topology} on {run.nodes} x {run.gpus_per_node} {run.unit}s ({run.backend})"


def _curves(run):
    """(Timeline, x of each step: tokens trained by then, or the step without /steps/tokens, its kind)."""
    tl = Timeline(run)
    st = run.steps
    tok = st.get("tokens")
    if tok is not None and len(tok) == len(tl.step) and len(tok):
        return tl, np.cumsum(np.asarray(tok, dtype=float)), "tokens"
    return tl, tl.step.astype(float), "step"


def _token_unit(runs):
    """Tokens trained in M (or K for short runs: a CPU test run trains a few thousand)."""
    most = max([float(np.sum(r.steps.get("tokens", [0]))) for r in runs] + [0.0])
    return (1e6, "Mtok trained") if most >= 1e6 else (1e3, "Ktok trained")


def panel_names(runs):
    names = ["loss", "loss by time", "acc", "streak", "throughput"]
    if any(len((r.eval or {}).get("step", [])) for r in runs):
        names.append("held-out loss")
    if any(np.isfinite(np.asarray((r.eval or {}).get("tau", []), dtype=float)).any() for r in runs):
        names.append("tau")
    return names


def write_png(runs, names, path):
    panels = panel_names(runs)
    nrows = (len(panels) + 1) // 2
    fig, ax = plt.subplots(nrows, 2, figsize=(15, 4.2 * nrows), squeeze=False)
    axes = {p: ax[i // 2][i % 2] for i, p in enumerate(panels)}
    xlabels = set()
    scale, tok_label = _token_unit(runs)
    for k, (run, name) in enumerate(zip(runs, names)):
        c = f"C{k % 10}"
        lab = label(run, name)
        tl, x, kind = _curves(run)
        n = max(1, len(x) // 25)  # ~25 windows over each run (a window longer than a short run is no mean)
        xlabel = tok_label if kind == "tokens" else "step"
        if kind == "tokens":
            x = x / scale
        xlabels.add(xlabel)
        st = run.steps
        for key in ("loss", "acc", "streak"):
            y = st.get(key)
            if y is None or len(y) != len(x) or not len(x):
                continue
            a = axes[key]
            a.plot(x, y, lw=0.5, c=c, alpha=0.25)
            a.plot(x, _smooth(y, n), lw=1.6, c=c, label=lab)
        if "loss" in st and len(st["loss"]) == len(x) and len(x):
            a = axes["loss by time"]
            m = tl.cont / 60
            a.plot(m, st["loss"], lw=0.5, c=c, alpha=0.25)
            a.plot(m, _smooth(st["loss"], n), lw=1.6, c=c, label=lab)
        th = interval_throughput(run, tl)
        if th is not None and th["tokens"] is not None:
            # interval 0 of each segment (the models loading) is left out when later intervals exist
            first = np.concatenate([[True], th["segment"][1:] != th["segment"][:-1]])
            keep = (th["dt"] > 0) & ~first
            if not keep.any():
                keep = th["dt"] > 0
            axes["throughput"].step(th["elapsed"][keep] / 60, th["tokens"][keep] / th["dt"][keep] / 1000.0,
                                    where="pre", c=c, lw=1.5, label=lab)
        ev = run.eval or {}
        if "held-out loss" in axes and len(ev.get("step", [])) and len(x):
            # tokens trained by each evaluation's step
            ex = np.interp(np.asarray(ev["step"], dtype=float), tl.step.astype(float), x) if xlabel != "step" \
                else np.asarray(ev["step"], dtype=float)
            axes["held-out loss"].plot(ex, ev["loss"], marker="o", ms=3, lw=1.3, c=c, label=lab)
            tau = np.asarray(ev.get("tau", []), dtype=float)
            if "tau" in axes and len(tau) == len(ex) and np.isfinite(tau).any():
                ok = np.isfinite(tau)
                axes["tau"].plot(ex[ok], tau[ok], marker="o", ms=4, lw=1.3, c=c, label=lab)
    xl = xlabels.pop() if len(xlabels) == 1 else f"{tok_label} (step where a run has no /steps/tokens)"
    titles = {"loss": ("training loss (faint: every step)", xl, "loss"),
              "loss by time": ("training loss by time", "minutes since the run's start", "loss"),
              "acc": ("accuracy", xl, "acc"), "streak": ("streak (leading correct per block)", xl, "streak"),
              "throughput": ("throughput: trained per report interval", "minutes since the run's start", "Ktok/s"),
              "held-out loss": ("held-out loss (--eval-data)", xl, "loss"),
              "tau": ("acceptance length tau (--eval-tau-every)", xl, "tau")}
    for p, a in axes.items():
        t, xlab, ylab = titles[p]
        a.set_title(t)
        a.set_xlabel(xlab)
        a.set_ylabel(ylab)
        if a.get_legend_handles_labels()[0]:
            a.legend(fontsize=7, loc="best")
        else:
            a.text(0.5, 0.5, "no data", ha="center", va="center", transform=a.transAxes)
    if len(panels) % 2:
        ax[-1][-1].set_visible(False)
    fig.suptitle(f"{len(runs)} runs on the same axes: " + ", ".join(f"{n} ({r.topology})" for r, n in zip(runs, names)),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return panels
