"""The PNG dashboard: what metrics.h5 holds, one panel per question (docs/report.md "The dashboard").

  throughput      Ktok/s trained and produced per report interval, with both ceilings (b/s on the right axis)
  queue depths    q_hs per drafter and q_pre as steps, capacity lines, full/empty shading
  time split      per role (targets, drafters): compute / optimiser / waits as shares of the ranks' time
  what-if         predicted Ktok/s of every split, this run's and the best marked
  training        loss, acc, streak per step (faint) and smoothed
  per position    accuracy per block position, when the file has it (/steps/acc_by_pos)
  power           per GPU, only when the file has readings (no empty panel)

Times are minutes since the run's first start: a resumed run's segments follow each other.
"""

import matplotlib

matplotlib.use("Agg")  # no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .analysis import _gpu_column_ranks as analysis_columns  # noqa: E402
from .load import ROLE_DRAFTER, ROLE_TARGET  # noqa: E402

FULL_COLOR, EMPTY_COLOR = "#d62728", "#1f77b4"


def continuous_time(t):
    """A series' time_s restarts near 0 in each resumed segment: shift each segment to follow the last."""
    t = np.asarray(t, dtype=float)
    out = t.copy()
    offset = 0.0
    for i in range(1, len(t)):
        if t[i] < t[i - 1]:  # a new segment
            offset = out[i - 1]
        out[i] = t[i] + offset
    return out


def interval_table(run):
    """One row per report interval: its end (continuous s), length, whether it opens a segment, and each
    role's batches and time components summed over the role's ranks."""
    r = run.ranks
    t = continuous_time(r["time_s"])
    iv = np.asarray(r["interval"])
    ends = []
    for i in range(len(t)):  # rows of one interval are consecutive (every rank, same time)
        if not ends or iv[i] != ends[-1][1] or t[i] != ends[-1][0]:
            ends.append((t[i], iv[i], []))
        ends[-1][2].append(i)
    rows = []
    prev = 0.0
    for end, interval, idx in ends:
        idx = np.asarray(idx)
        row = {"t": end, "dt": end - prev, "first": interval == 0 or not rows}
        for role, name in ((ROLE_TARGET, "target"), (ROLE_DRAFTER, "drafter")):
            m = idx[r["role"][idx] == role]
            row[name] = {k: float(np.nansum(r[k][m].astype(float))) for k in ("batches", "busy_s", "wait_s", "compute_s",
                                                             "credit_wait_s", "data_wait_s", "allreduce_s",
                                                             "optimizer_s", "eval_s") if k in r}
        rows.append(row)
        prev = end
    return rows


def _smooth(y, n):
    """Centred moving average over n points (shorter at the ends, so it spans the whole series)."""
    y = np.asarray(y, dtype=float)
    if n <= 1 or len(y) < 3:
        return y
    k = np.ones(n)
    num = np.convolve(y, k, mode="same")
    den = np.convolve(np.ones_like(y), k, mode="same")
    return num / den


def _throughput(a, run, rep, rows):
    tpb = rep["run"]["tokens_per_batch"] / 1000.0  # Ktok per batch
    # Interval 0 of each segment starts with the models loading: its rate reads low, so it is left out
    # when later intervals exist.
    keep = [r for r in rows if not r["first"] and r["dt"] > 0] or [r for r in rows if r["dt"] > 0]
    t = np.array([r["t"] for r in keep]) / 60
    for name, label, c, lw in (("target", "produced (targets)", "C0", 1.0), ("drafter", "trained (drafters)", "C1", 1.8)):
        k = np.array([r[name].get("batches", 0) / r["dt"] * tpb for r in keep])
        if len(t):
            a.step(t, k, where="pre", c=c, lw=lw, label=label)
    obs = rep["observed"]
    ceil_t, ceil_d = obs["target_ceiling_bps"] * tpb, obs["drafter_ceiling_bps"] * tpb
    top = 1.6 * max([obs["ktok_per_s"], min(ceil_t, ceil_d)] + [0.0])
    for v, c, name in ((ceil_t, "C0", "target-side ceiling"), (ceil_d, "C1", "drafter-side ceiling")):
        if v <= top:
            a.axhline(v, ls="--", c=c, lw=0.9, label=f"{name} {v:.2f}")
        else:  # far above: say where it is instead of squashing the curves
            a.plot([], [], ls="--", c=c, lw=0.9, label=f"{name} {v:.1f} (off scale)")
    a.set_ylim(0, top if top > 0 else 1)
    a.set_title(f"throughput: {obs['ktok_per_s']:.2f} Ktok/s observed, bottleneck: {obs['bottleneck']} side")
    a.set_xlabel("minutes")
    a.set_ylabel("Ktok/s")
    if tpb > 0:
        sec = a.secondary_yaxis("right", functions=(lambda x: x / tpb, lambda x: x * tpb))
        sec.set_ylabel("batches/s")
    a.legend(fontsize=7, loc="lower right")


def _shade(a, t, mask, color, label):
    """A band over every sample where mask holds, from that sample to the next (the depth holds until then)."""
    last_dt = t[-1] - t[-2] if len(t) > 1 else 0.0
    for i in np.flatnonzero(mask):
        end = t[i + 1] if i + 1 < len(t) else t[i] + last_dt
        a.axvspan(t[i], end, color=color, alpha=0.18, lw=0, label=label)
        label = None


def _queues(a, run, rep):
    q = run.queues
    qp = rep["observed"]["queues"]
    if not len(q.get("time_s", [])):
        a.text(0.5, 0.5, "no queue samples", ha="center", va="center", transform=a.transAxes)
        return
    t = continuous_time(q["time_s"]) / 60
    hs, pre = q["q_hs"], q["q_pre"]
    hs_depth, pre_depth = qp.get("hs_depth"), qp.get("prefetch_depth")
    if hs.shape[1] and hs_depth:
        _shade(a, t, (hs >= hs_depth).all(axis=1), FULL_COLOR, "q_hs full (drafters behind)")
        _shade(a, t, (hs == 0).all(axis=1), EMPTY_COLOR, "q_hs empty (drafters starve)")
    for j in range(hs.shape[1]):
        a.step(t, hs[:, j], where="post", lw=1.3, c="C3", alpha=1.0 if j == 0 else 0.6,
               label="q_hs per drafter" if j == 0 else None)
    if pre.shape[1]:
        a.step(t, pre.min(axis=1), where="post", lw=1.0, c="C2", label="q_pre, emptiest target")
    if hs_depth:
        both = " (both queues)" if pre_depth == hs_depth else ""
        a.axhline(hs_depth, c="C3", ls="--", lw=0.8, label=f"q_hs capacity {hs_depth}{both}")
    if pre_depth and pre_depth != hs_depth:
        a.axhline(pre_depth, c="C2", ls="--", lw=0.8, label=f"q_pre capacity {pre_depth}")
    a.set_ylim(-0.2, 1.35 * max([hs_depth or 0, pre_depth or 0, int(hs.max()) if hs.size else 0, 1]))
    a.set_title("queue depths (batches waiting)")
    a.set_xlabel("minutes")
    a.set_ylabel("batches")
    a.legend(fontsize=7, loc="upper left", ncol=3)


SPLITS = {
    "target": [("compute_s", "forward", "C2"), ("credit_wait_s", "wait: credit", FULL_COLOR),
               ("data_wait_s", "wait: data", EMPTY_COLOR), (None, "wait: send", "0.6")],
    "drafter": [("compute_s", "fwd+bwd", "C1"), ("optimizer_s", "optimiser", "C4"),
                ("data_wait_s", "wait: data", EMPTY_COLOR), ("allreduce_s", "allreduce", "C5"),
                ("eval_s", "eval", "C6")],
}


def _time_split(a, run, rows, role):
    """Each component's share of the role's rank-seconds per interval (stacked: the parts sum to 1)."""
    keep = [r for r in rows if r[role].get("busy_s", 0) + r[role].get("wait_s", 0) + r[role].get("eval_s", 0) > 0]
    if not keep:
        a.text(0.5, 0.5, f"no {role} timings", ha="center", va="center", transform=a.transAxes)
        return
    t = np.array([r["t"] for r in keep]) / 60
    total = np.array([r[role]["busy_s"] + r[role]["wait_s"] + r[role].get("eval_s", 0.0) for r in keep])
    ys, labels, colors = [], [], []
    for key, label, c in SPLITS[role]:
        if key is None:  # what wait_s holds beyond the named waits (a target's sends in flight)
            named = sum(np.array([r[role].get(k, 0.0) for r in keep]) for k, _, _ in SPLITS[role] if k and "wait" in k)
            v = np.maximum(np.array([r[role]["wait_s"] for r in keep]) - named, 0.0)
        else:
            v = np.array([r[role].get(key, 0.0) for r in keep])
        if v.sum() > 0:
            ys.append(v / total)
            labels.append(label)
            colors.append(c)
    # Each value covers the interval that ends at t: draw it from the previous end to t.
    edges = np.concatenate([[t[0] - (t[1] - t[0]) if len(t) > 1 else 0.0], t])
    bottom = np.zeros(len(t))
    for y, label, c in zip(ys, labels, colors):
        a.stairs(bottom + y, edges, baseline=bottom, fill=True, color=c, alpha=0.85, label=label)
        bottom = bottom + y
    n = len(set(int(x) for x, role_ in zip(run.ranks["rank"], run.ranks["role"])
                if role_ == (ROLE_TARGET if role == "target" else ROLE_DRAFTER)))
    a.set_ylim(0, 1.18)  # the strip above 1 holds the legend
    a.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    a.set_title(f"{role}s ({n} rank{'s' if n != 1 else ''}): where the time goes")
    a.set_xlabel("minutes")
    a.set_ylabel("share of time")
    if labels:  # none when no component was recorded (or all were left out as not finite): no empty legend
        a.legend(fontsize=7, loc="upper center", ncol=len(labels))


def whatif_rows(rep):
    """The bars worth drawing: this run's split, the best one, the fastest split for every number of GPUs used
    (the others are in the text report) and the colocated row; fastest first."""
    rows = rep["whatif"]
    best_per_used = {}
    for w in rows:
        if w.get("layout") == "colocated":
            continue
        used = w["targets"] + w["drafters"]
        if used not in best_per_used or w["ktok_per_s"] > best_per_used[used]["ktok_per_s"]:
            best_per_used[used] = w
    keep = {w["split"] for w in best_per_used.values()} | {rep["run"]["topology"], rep["best"], "colocated"}
    return sorted((w for w in rows if w["split"] in keep), key=lambda w: -w["ktok_per_s"])


def _whatif(a, rep):
    rows = whatif_rows(rep)
    if not rows:
        a.text(0.5, 0.5, "no what-if rows", ha="center", va="center", transform=a.transAxes)
        return
    own = rep["run"]["topology"]
    over = rep.get("oversubscription")
    shared = rep.get("gpu_sharing")
    distorted = bool(over and over["run_distorted"]) or bool(shared)
    y = np.arange(len(rows))
    for i, w in enumerate(rows):
        c = "C1" if w["split"] == own else ("C2" if w["split"] == rep["best"] and not distorted else "0.65")
        a.barh(i, w["ktok_per_s"], color=c, hatch="//" if w.get("oversubscribed") else None,
               edgecolor="white" if w.get("oversubscribed") else None)
        label = f" {w['ktok_per_s']:.2f} ({100 * w['vs_run_frac']:+.0f}%)" if w["vs_run_frac"] is not None else ""
        if w.get("power_w"):
            label += f", {w['power_w'] / 1000:.2f} kW"
        a.text(w["ktok_per_s"], i, label, va="center", fontsize=7)
    a.axvline(rep["observed"]["ktok_per_s"], c="k", lw=0.8, ls=":", label="observed")
    a.set_yticks(y, [w["split"] + (f" +{w['idle']} idle" if w["idle"] else "") + (" (run)" if w["split"] == own else "")
                     for w in rows], fontsize=8)
    a.invert_yaxis()
    a.set_xlim(0, 1.3 * max(w["ktok_per_s"] for w in rows))
    a.set_xlabel("predicted Ktok/s")
    unit = rep["run"].get("unit", "GPU")
    title = f"what-if: the fastest split for each number of the {rep['run']['gpus_per_node']} {unit}s used"
    if shared:
        title += "\nDISTORTED: ranks shared GPUs, taking turns"
    elif distorted:
        title += "\nDISTORTED: ranks shared cores (oversubscribed)"
    elif over:
        title += f"\nhatched: more busy ranks than {over['cores_per_node']} cores"
    a.set_title(title, fontsize=10, color="C3" if distorted else "k")
    a.legend(fontsize=7, loc="lower right")


def _training(a, run):
    st = run.steps
    if not len(st.get("step", [])):
        a.text(0.5, 0.5, "no steps yet", ha="center", va="center", transform=a.transAxes)
        return
    x = st["step"]
    n = max(1, len(x) // 25)  # ~25 windows over the run
    a.plot(x, st["loss"], lw=0.5, c="C0", alpha=0.3)
    a.plot(x, _smooth(st["loss"], n), lw=1.6, c="C0", label=f"loss ({n}-step mean)")
    ev = getattr(run, "eval", {}) or {}
    if len(ev.get("step", [])):  # --eval-data: the held-out loss curve
        a.plot(ev["step"], ev["loss"], marker="o", ms=3, lw=1.2, c="C3", label="held-out loss")
    a.set_ylabel("loss")
    b = a.twinx()
    for key, c in (("acc", "C1"), ("streak", "C2")):
        if key in st:
            b.plot(x, st[key], lw=0.5, c=c, alpha=0.25)
            b.plot(x, _smooth(st[key], n), lw=1.4, c=c, label=f"{key} ({n}-step mean)")
    b.set_ylabel("acc / streak")
    h1, l1 = a.get_legend_handles_labels()
    h2, l2 = b.get_legend_handles_labels()
    a.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", ncol=3)
    lo, hi = a.get_ylim()
    a.set_ylim(lo, hi + 0.15 * (hi - lo))  # room for the legend
    lo, hi = b.get_ylim()
    b.set_ylim(lo, hi + 0.15 * (hi - lo))
    a.set_title("training (faint: every step)")
    a.set_xlabel("step")


def _acc_by_pos_rows(run):
    """/steps/acc_by_pos's rows that hold numbers (a resumed format-1 file has NaN rows before the resume)."""
    acc = run.steps.get("acc_by_pos")
    if acc is None or np.ndim(acc) != 2:
        return np.zeros((0, 0))
    acc = np.asarray(acc, dtype=float)
    return acc[np.isfinite(acc).any(axis=1)]


def _per_position(a, run):
    acc = _acc_by_pos_rows(run)  # [steps, block positions 1 .. block_size-1]
    n = max(1, acc.shape[0] // 10)
    k = np.arange(1, acc.shape[1] + 1)
    a.plot(k, np.nanmean(acc[:n], axis=0), marker="o", ms=3, c="0.6", label=f"first {n} steps")
    a.plot(k, np.nanmean(acc[-n:], axis=0), marker="o", ms=3, c="C1", label=f"last {n} steps")
    a.set_xlabel("position in the block (1 = right after the anchor)")
    a.set_ylabel("acc")
    a.set_title("accuracy per block position")
    a.legend(fontsize=7)


def _power(a, run):
    p = run.gpus["power_w"]
    owners = analysis_columns(run, p.shape[1])
    t = continuous_time(run.gpus["time_s"]) / 60
    for j in range(p.shape[1]):
        role = {ROLE_TARGET: "target", ROLE_DRAFTER: "drafter"}.get(run.role_of_rank.get(owners[j], -1), "idle")
        a.step(t, p[:, j], where="pre", lw=0.9, label=f"GPU {j} ({role})")
    a.legend(fontsize=7, ncol=2)
    a.set_ylabel("W")
    a.set_title("power per GPU")
    a.set_xlabel("minutes")


def _tau(a, rep):
    """tau per evaluation (--eval-tau-every), the best marked, the stopped-rising call in the title."""
    tau = rep["tau"]
    a.plot(tau["steps"], tau["tau"], marker="o", ms=4, lw=1.4, c="C4", label="tau (eval prompts)")
    a.plot([tau["best"]["step"]], [tau["best"]["tau"]], marker="*", ms=14, c="C3", ls="none",
           label=f"best {tau['best']['tau']:.3f} (step {tau['best']['step']}: OUT/drafter-best)")
    a.set_xlabel("step")
    a.set_ylabel("tau (accepted tokens per target step)")
    verdict = {None: "too early to tell", True: "STOPPED RISING", False: "still rising"}[tau["stopped_rising"]]
    a.set_title(f"acceptance length tau ({tau['prompts']} prompts): {verdict}", fontsize=10,
                color="C3" if tau["stopped_rising"] else "k")
    a.legend(fontsize=7, loc="best", title=tau["rule"].replace(" = ", ":\n"), title_fontsize=6)


def panel_names(run, rep=None):
    """The panels this file has data for, in drawing order (no panel is drawn empty)."""
    names = ["throughput", "queues", "target time split", "drafter time split", "what-if", "training"]
    if rep is not None and rep.get("tau"):
        names.append("tau")
    if len(_acc_by_pos_rows(run)):
        names.append("accuracy per position")
    if run.gpu_available:
        names.append("power")
    return names


def write_png(run, rep, path):
    rows = interval_table(run)
    draw_panel = {
        "throughput": lambda a: _throughput(a, run, rep, rows), "queues": lambda a: _queues(a, run, rep),
        "target time split": lambda a: _time_split(a, run, rows, "target"),
        "drafter time split": lambda a: _time_split(a, run, rows, "drafter"),
        "what-if": lambda a: _whatif(a, rep), "training": lambda a: _training(a, run),
        "accuracy per position": lambda a: _per_position(a, run), "power": lambda a: _power(a, run),
        "tau": lambda a: _tau(a, rep),
    }
    panels = [draw_panel[name] for name in panel_names(run, rep)]
    nrows = (len(panels) + 1) // 2
    fig, ax = plt.subplots(nrows, 2, figsize=(15, 4.3 * nrows), squeeze=False)
    r = rep["run"]
    note = "" if run.gpu_available else f"  |  no power data: {run.gpu_reason}"
    fig.suptitle(f"{run.path}: {r['topology']} on {r['nodes']} node(s) x {r['gpus_per_node']} {r.get('unit', 'GPU')}s, "
                 f"backend {r['backend']}  |  {rep['observed']['batches_per_s']:.2f} b/s, "
                 f"{rep['observed']['ktok_per_s']:.2f} Ktok/s{note}", fontsize=11)
    for i, draw in enumerate(panels):
        draw(ax[i // 2][i % 2])
    if len(panels) % 2:
        ax[-1][-1].set_visible(False)  # no empty panel
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
