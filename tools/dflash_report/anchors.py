"""What-if over the anchor count: the drafter's step grows with its anchors (every anchor is a block of B rows
through every drafter layer and B - 1 rows of lm_head loss), so a drafter side with spare capacity could train
on more blocks per batch at no cost in throughput (docs/report.md "What-if over the anchors").

Cost model, drafter busy seconds per batch as a function of the mean anchors per batch A:
  s_d(A) = a + b * A
fitted by least squares over the steady window's report intervals (x = the interval's mean anchors per batch
from /steps, y = the drafters' busy seconds per batch from /ranks) when the anchors vary enough between
intervals (spread >= MIN_SPREAD of the mean, >= 3 intervals) and the fit is sensible (b > 0, a >= 0); else
  a = the optimizer's seconds per batch (its AdamW step does not depend on the anchors), b = the rest / A_run
i.e. everything but the optimizer proportional to the anchors: conservative, since the drafter's per-token
context work (fc, context K/V) does not grow with them, so the anchor count it calls free is a lower bound.
The split model (model.py) then predicts each count with the run's split, the target side unchanged.
"""

import dataclasses

import numpy as np

from . import model
from .load import ROLE_DRAFTER

MULTIPLIERS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
MIN_SPREAD = 0.2      # (max - min) / mean of the intervals' anchors per batch needed to fit a + b A
NOISE_FRACTION = 0.03  # as analysis.NOISE_FRACTION: a gain under this is not worth a restart


def _interval_samples(run, sel, start_s, drafters_total, steps_mask=None):
    """(anchors per batch, drafter busy s per batch) for each report interval of the steady window (steps_mask:
    the measured segment's /steps rows; their clock restarts in every segment)."""
    r, st = run.ranks, run.steps
    if steps_mask is None:
        steps_mask = np.ones(len(st["time_s"]), dtype=bool)
    rows = sel[r["role"][sel] == ROLE_DRAFTER]
    out = []
    prev_end = start_s
    for iv in sorted(set(int(x) for x in r["interval"][rows])):
        m = rows[r["interval"][rows] == iv]
        end = float(r["time_s"][m].max())
        batches, busy = float(r["batches"][m].sum()), float(r["busy_s"][m].sum())
        in_iv = steps_mask & (st["time_s"] > prev_end) & (st["time_s"] <= end)
        prev_end = end
        if batches <= 0 or busy <= 0 or not in_iv.any():
            continue
        out.append((float(st["anchors"][in_iv].sum()) / (in_iv.sum() * drafters_total), busy / batches))
    return out


def fit_cost(samples, s_per_batch, optimizer_s_per_batch, anchors_run):
    """(a, b, how) of s_d(A) = a + b A: fitted when the samples allow, else the conservative rule above."""
    if len(samples) >= 3:
        x = np.array([s[0] for s in samples])
        y = np.array([s[1] for s in samples])
        if x.mean() > 0 and (x.max() - x.min()) / x.mean() >= MIN_SPREAD:
            b, a = np.polyfit(x, y, 1)
            if b > 0 and a >= 0:
                return float(a), float(b), (f"fitted over {len(samples)} report intervals "
                                            f"(anchors per batch {x.min():.0f}..{x.max():.0f})")
    a = min(optimizer_s_per_batch or 0.0, s_per_batch)
    return a, (s_per_batch - a) / anchors_run, ("the optimizer's share fixed, the rest proportional to the "
                                                "anchors (conservative: the anchors do not vary enough to fit)")


def whatif(run, sel, start_s, meas, dft, own, steps_mask=None):
    """The anchors section of the report, or None when the run recorded no anchors (or is colocated). steps_mask: the /steps rows
    of the measured segment (None: all)."""
    st = run.steps
    if own.split == "colocated":  # its budget is a split's (the drafter side keeping up with the targets)
        return None
    if "anchors" not in st or not len(st["anchors"]) or float(np.sum(st["anchors"])) <= 0:
        return None
    drafters_total = own.drafters * meas.nodes
    n = len(st["anchors"])
    seg = steps_mask if steps_mask is not None and len(steps_mask) == n and steps_mask.any() else np.ones(n, bool)
    win = seg & (st["time_s"] > start_s) if len(st.get("time_s", [])) == n else seg.copy()
    if not win.any():
        win = seg
    per_batch = st["anchors"][win].astype(float) / drafters_total
    a_run = float(per_batch.mean())
    if a_run <= 0:
        return None
    cap = run.option("max-anchors", None, int)
    per_record = run.option("anchors-per-record", 0, int) or 0
    opt_frac, busy_frac = dft.get("optimizer_frac"), dft.get("busy_frac")
    opt_s = opt_frac / busy_frac * dft["s_per_batch"] if (opt_frac is not None and busy_frac) else 0.0
    samples = _interval_samples(run, sel, start_s, drafters_total, seg) if len(st.get("time_s", [])) == n else []
    a, b, how = fit_cost(samples, dft["s_per_batch"], opt_s, a_run)
    # The cost model reproduces the run's own drafter time at its own anchors (so its bias cancels, as the
    # split what-if's "vs run" does): scale it to the measured mean.
    scale = dft["s_per_batch"] / (a + b * a_run)
    a, b = a * scale, b * scale

    def predict(anchors):
        return model.predict(dataclasses.replace(meas, drafter_s_per_batch=a + b * anchors), own.targets,
                             own.drafters)
    base = predict(a_run)
    # The most anchors whose drafter side still keeps up with the targets: s_d(A) + allreduce = N D / target cap.
    budget = meas.nodes * own.drafters / base.target_cap_bps - base.allreduce_s_per_batch
    free = (budget - a) / b if b > 0 else None
    tokens = meas.tokens_per_batch or None
    if free is not None and tokens:
        free = min(free, tokens)  # a batch has no more anchors than tokens
    if free is not None:
        free = float(np.floor(free))  # whole anchors, still within the budget
    counts = [a_run * k for k in MULTIPLIERS]
    if free is not None and free > 0:
        counts.append(free)
    rows = []
    for n in sorted(set(round(c) for c in counts if c >= 1)):
        p = predict(n)
        rows.append({"anchors_per_batch": int(n), "drafter_s_per_batch": a + b * n,
                     "drafter_cap_bps": p.drafter_cap_bps, "batches_per_s": p.batches_per_s,
                     "ktok_per_s": p.ktok_per_s, "kblocks_per_s": p.batches_per_s * n / 1000.0,
                     "vs_run_frac": p.batches_per_s / base.batches_per_s - 1.0, "limit": p.limit,
                     "this_run": abs(n - a_run) < 0.5, "free": free is not None and int(n) == int(free)})
    cap_bound = float(np.mean(per_batch >= cap - 0.5)) if cap else None
    return {"anchors_per_batch": a_run, "max_anchors": cap, "anchors_per_record": per_record,
            "cap_bound_frac": cap_bound, "cost_a_s": a, "cost_b_s_per_anchor": b, "cost_model": how,
            "drafter_wait_frac": (1.0 - busy_frac) if busy_frac is not None else None,
            "free_anchors_per_batch": int(free) if free is not None and free > 0 else None,
            "rows": rows, "sentence": sentence(a_run, free, busy_frac, base, per_record)}


def sentence(a_run, free, busy_frac, base, per_record):
    wait = f"the drafters wait {100 * (1 - busy_frac):.0f}% of the time" if busy_frac is not None else ""
    if base.limit == "drafter" or free is None or free < a_run * (1 + NOISE_FRACTION):
        return (f"Anchors: {a_run:.0f} per batch; the drafter side is the bottleneck, so more anchors per batch "
                "would cost throughput (the ANCHORS table prices them).")
    knob = (f"--anchors-per-record above {per_record} with --max-anchors >= {int(free)}" if per_record
            else f"--max-anchors {int(free)}, or --anchors-per-record")
    return (f"Anchors: {wait}: up to {int(free)} anchors per batch ({free / a_run:.1f}x this run's {a_run:.0f}) "
            f"would cost no throughput ({knob}, if the drafter's memory allows: --dry-run prints it).")
