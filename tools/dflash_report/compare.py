"""Several runs side by side (dflash-report A.h5 B.h5 ...): the numbers that decide between splits, one
column per run, and which run trained fastest. The seeds compared 7-1 with 6-2 exactly this way."""

import os

import numpy as np

from .analysis import NOISE_FRACTION, SCHEMA_VERSION


def _last_tenth_mean(run, key):
    v = run.steps.get(key)
    if v is None or len(v) == 0:
        return None
    n = max(1, len(v) // 10)  # single steps are noisy: the mean of the last tenth
    return float(np.mean(v[-n:]))


def summary(run, rep):
    """One run's column: a flat dict of the numbers compared. A run whose split changed (/segments) is
    compared as its last segment: its split and the rates measured on it (analysis.analyse)."""
    obs, svc, pw, r = rep["observed"], rep["service"], rep["power"], rep["run"]
    q = obs["queues"]
    over = rep.get("oversubscription")
    return {
        "file": rep["file"], "topology": r["topology"], "backend": r["backend"], "nodes": r["nodes"],
        "ranks_per_node": r["gpus_per_node"], "unit": r.get("unit", "GPU"), "steps": r["steps"],
        "targets_per_node": r["targets_per_node"], "drafters_per_node": r["drafters_per_node"],
        "idle_per_node": r["gpus_per_node"] - r["targets_per_node"] - r["drafters_per_node"],
        # job starts recorded in /segments (None: a file without the table), the split of the last one above
        "segments": len(rep["segments"]) if rep.get("segments") else None,
        "elapsed_s": r["elapsed_s"], "batches_per_s": obs["batches_per_s"], "ktok_per_s": obs["ktok_per_s"],
        "target_ceiling_bps": obs["target_ceiling_bps"], "drafter_ceiling_bps": obs["drafter_ceiling_bps"],
        "bottleneck": obs["bottleneck"],
        "target_s_per_batch": svc["target"]["s_per_batch"], "drafter_s_per_batch": svc["drafter"]["s_per_batch"],
        "q_hs_full_frac": q.get("q_hs_full_frac"), "q_hs_empty_frac": q.get("q_hs_empty_frac"),
        "power_w": pw.get("total_w"),
        "ktok_per_kw": (obs["ktok_per_s"] / (pw["total_w"] / 1000.0)) if pw.get("total_w") else None,
        "loss_last_tenth": _last_tenth_mean(run, "loss"), "acc_last_tenth": _last_tenth_mean(run, "acc"),
        "streak_last_tenth": _last_tenth_mean(run, "streak"),
        "best": rep["best"], "distorted": bool(over and over["run_distorted"]),
        # --eval-tau-every: the best tau and its step (None without tau)
        "tau_best": rep["tau"]["best"]["tau"] if rep.get("tau") else None,
        "tau_best_step": rep["tau"]["best"]["step"] if rep.get("tau") else None,
        # blocks trained: runs with other anchor rules (--anchors-per-record) differ here, not in Ktok/s
        "anchors_per_batch": (rep.get("anchors") or {}).get("anchors_per_batch"),
        "kblocks_per_s": (obs["batches_per_s"] * rep["anchors"]["anchors_per_batch"] / 1000.0
                          if rep.get("anchors") else None),
    }


def compare(pairs):
    """pairs: [(Run, report)] -> the comparison (JSON-ready): every run's column and the fastest."""
    cols = [summary(run, rep) for run, rep in pairs]
    base = cols[0]["batches_per_s"]
    for c in cols:
        c["vs_first_frac"] = c["batches_per_s"] / base - 1.0 if base else None
    fastest = max(range(len(cols)), key=lambda i: cols[i]["ktok_per_s"])
    return {"schema_version": SCHEMA_VERSION, "runs": cols, "fastest": fastest,
            "verdict": verdict(cols, fastest), "reports": [rep for _, rep in pairs]}


def _who(c):
    return f"{c['topology']} ({_name(c['file'])})"


def _plural(n, unit):
    return f"{n} {unit}{'' if n == 1 else 's'}"


def verdict(cols, fastest):
    f = cols[fastest]
    others = [c for i, c in enumerate(cols) if i != fastest]
    gains = [f["ktok_per_s"] / c["ktok_per_s"] - 1.0 if c["ktok_per_s"] else None for c in others]
    if others and all(d is not None and d < NOISE_FRACTION for d in gains):
        # no run is faster by more than the noise: say so instead of crowning one
        s = (f"{' and '.join(_who(c) for c in cols)} trained equally fast: "
             f"{' and '.join(format(c['ktok_per_s'], '.2f') for c in cols)} Ktok/s, within "
             f"{100 * NOISE_FRACTION:.0f}% of each other (measurement noise).")
    else:
        parts = [f"{_who(f)} trained fastest: {f['ktok_per_s']:.2f} Ktok/s"]
        for c, d in zip(others, gains):
            pct = "?" if d is None else format(100 * d, "+.0f") + "%"
            parts.append(f"{pct} over {_who(c)}" + (" (within noise)" if d is not None and d < NOISE_FRACTION else ""))
        s = parts[0] + (", " + ", ".join(parts[1:]) if len(parts) > 1 else "") + "."
    s += _machines(cols)
    distorted = [c["topology"] for c in cols if c["distorted"]]
    if distorted:
        s += (f" {', '.join(distorted)} ran oversubscribed (more busy ranks than cores): "
              f"{'its' if len(distorted) == 1 else 'their'} timings are distorted.")
    if len({c["steps"] for c in cols}) > 1:
        s += " Loss and accuracy are over different numbers of steps."
    return s


def _machines(cols):
    """What the runs' machines differ in, named: the backend; else the nodes and the ranks (GPUs) per node,
    which ranks of each stayed idle, and whether the busy ones are as many (then the runs compare as splits)."""
    backends = [c["backend"] for c in cols]
    if len(set(backends)) > 1:
        return (f" The runs used different backends ({' vs '.join(backends)}): their speeds do not compare, nor do "
                "their splits.")
    unit = cols[0]["unit"]
    diffs = []
    if len({c["nodes"] for c in cols}) > 1:
        diffs.append(f"nodes ({' vs '.join(str(c['nodes']) for c in cols)})")
    if len({c["ranks_per_node"] for c in cols}) > 1:
        diffs.append(f"{unit}s per node ({' vs '.join(str(c['ranks_per_node']) for c in cols)})")
    if not diffs:
        return ""
    s = f" The runs differ {'only ' if len(diffs) == 1 else ''}in {' and '.join(diffs)}"
    idle = [c for c in cols if c["idle_per_node"] > 0]
    s += (": " + "; ".join(f"{_who(c)} left {_plural(c['idle_per_node'], unit)} per node idle" for c in idle) + "."
          if idle else ".")
    busy = [c["nodes"] * (c["targets_per_node"] + c["drafters_per_node"]) for c in cols]
    if len(set(busy)) == 1:
        if len({c["topology"] for c in cols}) == 1 and len({c["nodes"] for c in cols}) == 1:
            s += (f" {'Both' if len(cols) == 2 else 'All'} keep {_plural(busy[0], unit)} busy as "
                  f"{cols[0]['topology']}, so they compare as the same split: a difference in speed is not the "
                  f"split's doing (an idle {unit} does no work).")
        else:
            s += f" All keep {_plural(busy[0], unit)} busy: they compare split for split."
    else:
        s += (f" They keep {' and '.join(str(b) for b in busy)} {unit}s busy: a difference in speed comes from the "
              f"extra {unit}s as much as from the split (to compare splits of one machine, read one run's what-if).")
    return s


def _name(path):
    """runs/7-1/metrics.h5 -> runs/7-1 (the run directory names the run better than the file)."""
    d, b = os.path.split(path)
    return d if b == "metrics.h5" and d else path


def _cell(v, fmt):
    if v is None:
        return "-"
    if isinstance(v, str):
        return v
    return format(v, fmt)


ROWS = [  # (label, key, format)
    ("topology", "topology", ""),
    ("backend", "backend", ""),
    ("nodes x ranks", None, ""),
    ("idle per node", "idle_per_node", "d"),
    ("steps", "steps", "d"),
    ("segments", "segments", "d"),
    ("elapsed s", "elapsed_s", ".0f"),
    ("trained b/s", "batches_per_s", ".3f"),
    ("vs first run", "vs_first_frac", "+.1%"),
    ("Ktok/s", "ktok_per_s", ".2f"),
    ("anchors/batch", "anchors_per_batch", ".0f"),
    ("Kblocks/s", "kblocks_per_s", ".3f"),
    ("target ceiling b/s", "target_ceiling_bps", ".3f"),
    ("drafter ceiling b/s", "drafter_ceiling_bps", ".3f"),
    ("bottleneck", "bottleneck", ""),
    ("target s/batch", "target_s_per_batch", ".3f"),
    ("drafter s/batch", "drafter_s_per_batch", ".3f"),
    ("q_hs full", "q_hs_full_frac", ".0%"),
    ("q_hs empty", "q_hs_empty_frac", ".0%"),
    ("power W", "power_w", ".0f"),
    ("Ktok/s per kW", "ktok_per_kw", ".2f"),
    ("loss (last tenth)", "loss_last_tenth", ".4f"),
    ("acc (last tenth)", "acc_last_tenth", ".3f"),
    ("streak (last tenth)", "streak_last_tenth", ".2f"),
    ("tau (best)", "tau_best", ".3f"),
    ("  at step", "tau_best_step", "d"),
    ("best split (model)", "best", ""),
    ("timings distorted", "distorted", ""),
]


def text(cmp):
    import textwrap
    cols = cmp["runs"]
    L = [f"dflash-report: {len(cols)} runs side by side"]
    for i, c in enumerate(cols):
        L.append(f"  [{i + 1}] {c['file']}")
    L.append("")
    width = max(12, max(len(_name(c["file"])) for c in cols) + 2)
    width = min(width, 28)
    width = max(width, 2 + max(len("yes (oversubscribed)") if c["distorted"] else 0 for c in cols))
    L.append(f"  {'':<20}" + "".join(f"[{i + 1}]".rjust(width) for i in range(len(cols))))
    for label, key, fmt in ROWS:
        cells = []
        for c in cols:
            if key is None:
                v = f"{c['nodes']} x {c['ranks_per_node']} {c['unit']}s"
            elif key == "distorted":
                v = "yes (oversubscribed)" if c["distorted"] else "no"
            else:
                v = c.get(key)
            cells.append(_cell(v, fmt).rjust(width))
        L.append(f"  {label:<20}" + "".join(cells))
    L.append("")
    L.append("VERDICT")
    L.extend(textwrap.wrap(cmp["verdict"], width=110, initial_indent="  ", subsequent_indent="  "))
    return "\n".join(L) + "\n"
