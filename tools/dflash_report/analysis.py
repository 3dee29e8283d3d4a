"""From a Run (load.py) to the report's numbers: observed pipeline, service rates, power, what-if, verdict."""

import json
import math
import os
import shlex
from datetime import datetime, timezone

import numpy as np

from . import anchors, forecast, model
from .load import ROLE_DRAFTER, ROLE_IDLE, ROLE_TARGET, ReportError

NOISE_FRACTION = 0.03  # a predicted gain smaller than this is not worth a restart
# The drafters' eval share of the window from which the verdict explains it (observed vs predicted).
EVAL_SHARE_WORTH_SAYING = 0.02

# --json's layout version: bumped when a key changes meaning or goes away (adding keys does not bump it).
# 1: the layout before the version was written; 2: schema_version, oversubscription, whatif[].oversubscribed,
# run.unit.
SCHEMA_VERSION = 2


def _ratio(a, b):
    return a / b if b else None


def _pct(values, q):
    return float(np.percentile(values, q)) if len(values) else None


def steady_window(run):
    """Rows of /ranks in the steady window of the segment the report measures (the last, load.Run.report_rows)
    and its time span."""
    if len(run.ranks.get("interval", [])) == 0:
        raise ReportError(f"{run.path}: /ranks is empty: the run wrote no report interval yet "
                          "(it needs --log-every steps; look again later)")
    return segment_window(run, run.report_rows)


def segment_window(run, rows):
    """The steady window of one segment's /ranks rows: (rows in it, start s, end s, a note).

    Interval 0 holds the start-up (model loading, first batches), so it is left out when later ones exist.
    Times are on the segment's own clock (seconds since its job started)."""
    iv = run.ranks["interval"]
    t = run.ranks["time_s"]
    rows = np.asarray(rows, dtype=np.int64)
    ivs = sorted(set(int(x) for x in iv[rows]))
    end_of = {k: float(t[rows][iv[rows] == k].max()) for k in ivs}
    if len(ivs) >= 2:
        first = ivs[1]
        start_s = end_of[ivs[0]]
        note = f"intervals {ivs[1]}..{ivs[-1]} (interval {ivs[0]}, with the start-up, left out)"
    else:
        first = ivs[0]
        start_s = 0.0
        note = "the only interval, start-up included (observed rates read low)"
    sel = rows[iv[rows] >= first]
    return sel, start_s, end_of[ivs[-1]], note


def clock_segments(t):
    """Segment index of each sample of a time_s series: its clock restarts at each job start."""
    t = np.asarray(t, dtype=float)
    if len(t) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(t[1:] < t[:-1])]).astype(np.int64)


def _last_segment_samples(times, start_s, end_s):
    """Samples of /queues or /gpus (which say nothing of their segment) in the measured window: those after
    the series' clock last restarted (its latest segment) and within start_s..end_s; all of the latest
    segment's when none is in the window."""
    times = np.asarray(times, dtype=float)
    seg = clock_segments(times)
    last = seg == seg.max() if len(seg) else np.zeros(0, dtype=bool)
    m = last & (times > start_s) & (times <= end_s)
    return m if m.any() else last


def segment_steps(run, k):
    """Which /steps rows segment k trained (a bool mask). With /segments: the steps after its first_step up
    to the first_step of any later segment (a resume drops the rows after its checkpoint and writes them
    again); without: the steps after /steps/time_s last restarted (the last segment)."""
    st = run.steps
    step = np.asarray(st.get("step", np.zeros(0)), dtype=np.int64)
    table = run.segments or []
    t = st.get("time_s")
    if table and k < 0:  # the rows before the table (load.Run.pre_segments): the last of them
        m = step <= table[0]["first_step"]
        if t is not None and len(t) == len(step) and m.any():
            idx = np.flatnonzero(m)
            clock = clock_segments(np.asarray(t)[idx])
            m = np.zeros(len(step), dtype=bool)
            m[idx[clock == clock.max()]] = True
        return m
    if table and k < len(table):
        later = [row["first_step"] for row in table[k + 1:]]
        m = step > table[k]["first_step"]
        if later:
            m &= step <= min(later)
        return m
    if t is not None and len(t) == len(step):
        seg = clock_segments(t)
        return seg == seg.max() if len(seg) else np.zeros(0, dtype=bool)
    return np.ones(len(step), dtype=bool)


def _role_rows(run, sel, role):
    return sel[run.ranks["role"][sel] == role]


def service_stats(run, sel, role):
    """Batches per busy second per GPU over (interval, rank) samples, and the aggregate busy time per batch."""
    rows = _role_rows(run, sel, role)
    r = run.ranks
    batches = r["batches"][rows].astype(float)
    busy = r["busy_s"][rows].astype(float)
    wait = r["wait_s"][rows].astype(float)
    # Evaluating --eval-data: neither busy nor waiting (NaN or absent in files written before it was recorded).
    evaluating = float(np.nansum(r["eval_s"][rows].astype(float))) if "eval_s" in r else 0.0
    ok = (batches > 0) & (busy > 0)
    rates = batches[ok] / busy[ok]
    out = {
        "ranks": int(len(set(int(x) for x in r["rank"][rows]))),
        "batches": int(batches.sum()),
        "busy_frac": _ratio(float(busy.sum()), float(busy.sum() + wait.sum())),
        "s_per_batch": _ratio(float(busy.sum()), float(batches.sum())),
        "p10": _pct(rates, 10), "p50": _pct(rates, 50), "p90": _pct(rates, 90),
        "samples": int(ok.sum()),
    }
    out["rate_bps_per_gpu"] = _ratio(1.0, out["s_per_batch"]) if out["s_per_batch"] else None
    total = float(busy.sum() + wait.sum()) + evaluating
    for k in ("compute_s", "credit_wait_s", "data_wait_s", "allreduce_s", "optimizer_s", "eval_s"):
        if k in r:
            out[k.replace("_s", "_frac")] = _ratio(float(np.nansum(r[k][rows].astype(float))), total)
    if "allreduce_s" in r:
        out["allreduce_s_per_batch"] = _ratio(float(r["allreduce_s"][rows].sum()), float(batches.sum()))
    return out


def queue_pressure(run, start_s, end_s):
    q = run.queues
    out = {"samples": 0}
    if "time_s" not in q or len(q["time_s"]) == 0:
        return out
    m = _last_segment_samples(q["time_s"], start_s, end_s)
    qhs, qpre = q["q_hs"][m], q["q_pre"][m]
    depth = run.option("hs-queue-depth", None, int) or (int(qhs.max()) if qhs.size else None)
    out.update(samples=int(m.sum()), hs_depth=depth,
               prefetch_depth=run.option("prefetch-depth", None, int),
               q_hs_full_frac=float((qhs >= depth).mean()) if qhs.size and depth else None,
               q_hs_empty_frac=float((qhs == 0).mean()) if qhs.size else None,
               q_hs_mean=float(qhs.mean()) if qhs.size else None,
               q_pre_empty_frac=float((qpre == 0).mean()) if qpre.size else None,
               q_pre_mean=float(qpre.mean()) if qpre.size else None)
    return out


def _gpu_column_ranks(run, cols):
    gr = run.attrs.get("gpu_ranks")
    if gr:
        try:
            v = json.loads(gr)
            if len(v) == cols:
                return [int(x) for x in v]
        except (TypeError, ValueError):
            pass
    if cols == run.world_size:
        return list(range(cols))  # column g = world rank g (each rank samples its own GPU)
    return [-1] * cols


def power_stats(run, start_s, end_s, idle_power_w=None):
    out = {"available": run.gpu_available, "reason": None if run.gpu_available else run.gpu_reason}
    idle_attr = run.attrs.get("gpu_idle_power_w")
    if not run.gpu_available:
        out.update(target_w=None, drafter_w=None, idle_w=None, total_w=None, idle_source=None)
        return out
    p = run.gpus["power_w"]
    m = _last_segment_samples(run.gpus["time_s"], start_s, end_s)
    col_mean = p[m].mean(axis=0)
    owners = _gpu_column_ranks(run, p.shape[1])
    by_role = {ROLE_TARGET: [], ROLE_DRAFTER: [], ROLE_IDLE: []}
    for c, r in enumerate(owners):
        by_role[run.role_of_rank.get(r, ROLE_IDLE) if r >= 0 else ROLE_IDLE].append(float(col_mean[c]))
    mean = lambda v: float(np.mean(v)) if v else None  # noqa: E731
    # Columns of ranks that share a GPU sample one board at different moments: the total counts each board
    # once, at the mean of its columns (a one-GPU 1-1 read 1048 W of a 700 W card).
    where = gpu_of_rank(run)
    boards = {}
    for c, r in enumerate(owners):
        boards.setdefault(where.get(r, ("column", c)), []).append(float(col_mean[c]))
    out.update(target_w=mean(by_role[ROLE_TARGET]), drafter_w=mean(by_role[ROLE_DRAFTER]),
               total_w=float(sum(np.mean(v) for v in boards.values())), per_gpu_w=[float(x) for x in col_mean],
               boards=len(boards))
    if by_role[ROLE_IDLE]:
        out.update(idle_w=mean(by_role[ROLE_IDLE]), idle_source="idle GPUs of this run")
    elif idle_power_w is not None:
        out.update(idle_w=float(idle_power_w), idle_source="--idle-power-w")
    elif idle_attr is not None:
        out.update(idle_w=float(idle_attr), idle_source="gpu_idle_power_w (measured before the models loaded)")
    else:
        out.update(idle_w=None, idle_source=None)
    return out


def oversubscription(run):
    """On the CPU backend, a node with more busy ranks (targets + drafters) than cores makes them take turns:
    every busy time then includes waiting for a core, and a split with more busy ranks is predicted from
    cores that do not exist. None when it does not apply (GPUs, enough cores, or cores not recorded)."""
    cores = run.host_cpu_cores
    if run.backend != "cpu" or not cores or run.gpus_per_node <= cores:
        return None
    busy = run.targets_per_node + run.drafters_per_node
    return {"cores_per_node": cores, "ranks_per_node": run.gpus_per_node, "busy_ranks_per_node": busy,
            "run_distorted": busy > cores}


def gpu_of_rank(run):
    """world rank -> (host, PCI bus id) of the GPU it ran on: the rank cards' `gpu_bus`, which the job writes for
    every busy rank on CUDA (src/runtime/job_metrics.cpp; the key Topology::same_gpu compares). The CUDA ordinal
    (`gpu`) does not identify a GPU: each rank bound by --gpus-per-task 1 sees its own as 0. Ranks without it
    (idle ones, the CPU backend, files written before it) are left out: each its own GPU, none shared."""
    return {int(c.get("rank", -1)): (c.get("host"), c["gpu_bus"]) for c in getattr(run, "rank_cards", []) or []
            if c.get("gpu_bus")}


def gpu_sharing(run):
    """On the GPUs, busy ranks (targets, drafters) that share one GPU (gpu_of_rank: a one-GPU 1-1) take turns on
    it: each role's busy time then includes the other's turns, and every split the what-if predicts from them
    assumes a GPU per rank that the run did not have. None when no two busy ranks share a GPU (or the cards do
    not say)."""
    where = gpu_of_rank(run)
    by_gpu = {}
    for c in getattr(run, "rank_cards", []) or []:
        r = int(c.get("rank", -1))
        if c.get("role") in ("target", "drafter") and r in where:
            by_gpu.setdefault(where[r], []).append((r, c.get("gpu")))
    shared = {k: sorted(v) for k, v in by_gpu.items() if len(v) > 1}
    if not shared:
        return None
    return {"busy_ranks": sum(len(v) for v in by_gpu.values()), "gpus": len(by_gpu),
            "shared": [{"host": h, "gpu_bus": b, "gpu": v[0][1], "ranks": [r for r, _ in v]}
                       for (h, b), v in sorted(shared.items(), key=str)],
            "run_distorted": True}


def _dataset_tokens(run):
    if run.attrs.get("dataset_tokens") is not None:
        return float(run.attrs["dataset_tokens"])
    data = run.options.get("data")
    if data and os.path.exists(data):
        try:
            import h5py
            with h5py.File(data, "r") as f:
                return float(f["offsets"][-1])
        except Exception:  # noqa: BLE001  (a dataset we cannot read just leaves the ETA unknown)
            return None
    return None


def remaining_tokens(run, tokens_per_step):
    trained = float(run.steps["tokens"].sum()) if "tokens" in run.steps else 0.0
    last_step = int(run.steps["step"].max()) if len(run.steps.get("step", [])) else 0
    totals = []
    epochs = run.option("epochs", 1, int)
    ds = _dataset_tokens(run)
    tokens_unknown = "/steps/tokens" in getattr(run, "unusable", {})
    if tokens_unknown:
        ds = None  # the tokens trained so far are not known: neither is what the epochs leave
    if ds is not None and epochs and epochs > 0:
        totals.append(("epochs", ds * epochs - trained))
    max_steps = run.option("max-steps", 0, int)
    if max_steps and tokens_per_step:
        totals.append(("max-steps", (max_steps - last_step) * tokens_per_step))
    if not totals:
        return None, ("unknown (/steps/tokens left out as not finite)" if tokens_unknown else
                      "unknown (no dataset_tokens attribute, dataset file or --max-steps)")
    src, rem = min(totals, key=lambda x: x[1])
    return max(0.0, rem), src


def eval_share(run, dft_rows, span):
    """The drafters' share of the window spent evaluating --eval-data (/ranks/eval_s summed over the drafter
    ranks, over ranks x window), or None where the file does not record it (written before /ranks/eval_s)."""
    r = run.ranks
    if "eval_s" not in r or not len(dft_rows):
        return None
    v = np.asarray(r["eval_s"][dft_rows], dtype=float)
    if not np.isfinite(v).any():
        return None
    ranks = len(set(int(x) for x in r["rank"][dft_rows]))
    return float(min(max(np.nansum(v) / (ranks * span), 0.0), 1.0))


def colocated_basis(run, tgt, dft, coeff, observed_bps):
    """Where the colocated row's overlap and memory fit come from (model.py): {overlap, overlap_source, fit,
    fit_why}. The overlap: a colocated run's own (each rank's wall time per batch against its roles' busy
    times and its allreduce), else what --topology auto measured at the run's start (attribute auto_topology),
    else None (not measured). The fit: the job's check (attribute colocated_fit), else unknown."""
    N, G = run.nodes, run.gpus_per_node
    overlap, source = None, "not measured (--topology auto, or a colocated run, measures it)"
    if run.topology == "colocated":
        a_own = (coeff or 0.0) * model.ring_allreduce_factor(N * G)
        if observed_bps > 0:
            wall = N * G / observed_bps
            overlap = model.colocated_overlap(tgt["s_per_batch"], dft["s_per_batch"], wall - a_own)
            source = "this run's wall time per batch against its roles' busy times"
    else:
        auto_meas = (run.auto_topology or {}).get("measurements") or {}
        o = auto_meas.get("colocated_overlap")
        if isinstance(o, (int, float)) and math.isfinite(o):
            overlap, source = float(o), "--topology auto's colocated phase at the run's start"
    fit, why = "unknown", "not recorded (a metrics file from before the job checked it)"
    raw = run.attrs.get("colocated_fit")
    if raw:
        try:
            rec = json.loads(raw if isinstance(raw, str) else raw.decode())
            if rec.get("fit") in model.COLOCATED_FITS:
                fit, why = rec["fit"], str(rec.get("why", ""))
        except (ValueError, AttributeError, UnicodeDecodeError):
            why = "unreadable (attribute colocated_fit is not JSON)"
    return {"overlap": overlap, "overlap_source": source, "fit": fit, "fit_why": why}


def analyse(run, power_budget_w=None, idle_power_w=None, allreduce_gbps=None):
    sel, start_s, end_s, window_note = steady_window(run)
    span = max(end_s - start_s, 1e-9)
    T, D, N, G = run.targets_per_node, run.drafters_per_node, run.nodes, run.gpus_per_node
    r = run.ranks
    tgt_rows, dft_rows = _role_rows(run, sel, ROLE_TARGET), _role_rows(run, sel, ROLE_DRAFTER)
    tgt_batches = float(r["batches"][tgt_rows].sum())
    dft_batches = float(r["batches"][dft_rows].sum())

    all_dft = r["role"] == ROLE_DRAFTER
    st = run.steps
    steps_tokens = float(st["tokens"].sum()) if "tokens" in st and len(st["tokens"]) else 0.0
    all_dft_batches = float(r["batches"][all_dft].sum())
    if steps_tokens > 0 and all_dft_batches > 0:
        tokens_per_batch = steps_tokens / all_dft_batches
    else:
        tokens_per_batch = float(run.option("token-budget", 0.0) or 0.0)
    tokens_per_step = steps_tokens / len(st["tokens"]) if steps_tokens > 0 else None
    # The steps of the measured segment (all of them in a file without segments and no resume).
    seg_steps = segment_steps(run, run.report_segment)
    seg_row = run.segment_row(run.report_segment)
    if seg_row is not None and seg_row["grad_accum"] and "tokens" in st and seg_steps.any():
        # With the segment table, tokens per batch and per step are the measured segment's own: a step of
        # another split trains another number of batches (K micro-batches on each of the N x D drafters, whose
        # tokens /steps/tokens sums).
        tokens_per_step = float(st["tokens"][seg_steps].sum()) / int(seg_steps.sum())
        if tokens_per_step > 0:
            tokens_per_batch = tokens_per_step / (N * D * seg_row["grad_accum"])
        else:
            tokens_per_step = None

    tgt = service_stats(run, sel, ROLE_TARGET)
    dft = service_stats(run, sel, ROLE_DRAFTER)
    if not tgt["s_per_batch"] or not dft["s_per_batch"]:
        raise ReportError(f"{run.path}: no finished batches with busy time in the steady window "
                          "(the run is too short to measure service rates)")

    # The allreduce model (see model.py).
    d_total = N * D
    a_meas = dft.get("allreduce_s_per_batch") or 0.0
    grad_bytes = run.attrs.get("drafter_grad_bytes")
    bw = allreduce_gbps * 1e9 if allreduce_gbps else run.attrs.get("allreduce_bytes_per_s")
    auto = run.auto_topology or {}
    auto_coeff = (auto.get("measurements") or {}).get("allreduce_coeff_s")
    # Not measured: one drafter has nothing to allreduce with; or /ranks/allreduce_s was left out (not finite).
    unmeasured = "not measured (1 drafter)" if d_total <= 1 else "not measured (/ranks/allreduce_s left out)"
    if d_total > 1 and "allreduce_s" in r:
        coeff = a_meas / model.ring_allreduce_factor(d_total)
        allreduce_note = f"measured at {d_total} drafters ({a_meas:.3g} s/batch), scaled by 2(D-1)/D"
    elif auto_coeff is not None:
        coeff = float(auto_coeff)
        allreduce_note = f"from --topology auto's allreduce test ({coeff:.3g} s), scaled by 2(D-1)/D"
    elif grad_bytes and bw:
        coeff = float(grad_bytes) / float(bw)
        allreduce_note = (f"{unmeasured}: {float(grad_bytes) / 1e6:.1f} MB of gradients at "
                          f"{float(bw) / 1e9:.1f} GB/s, scaled by 2(D-1)/D")
    else:
        coeff = None
        allreduce_note = (f"{unmeasured} and no gradient size/bandwidth known: "
                          "splits with more drafters are predicted WITHOUT allreduce cost (optimistic)")

    observed_bps = dft_batches / span
    # The observed rate includes the drafters' evaluations; every prediction is of training alone.
    eval_frac = eval_share(run, dft_rows, span)
    training_bps = observed_bps / (1.0 - eval_frac) if eval_frac is not None and eval_frac < 1.0 else None
    # the measured segment's steps in its window (time_s restarts in every segment)
    win_steps = (seg_steps & (st["time_s"] > start_s) & (st["time_s"] <= end_s)
                 if len(st.get("time_s", [])) == len(seg_steps) and len(seg_steps) else None)
    if win_steps is not None and win_steps.any() and steps_tokens > 0:
        observed_ktok = float(st["tokens"][win_steps].sum()) / span / 1000.0
    else:
        observed_ktok = observed_bps * tokens_per_batch / 1000.0

    pw = power_stats(run, start_s, end_s, idle_power_w)
    rem, rem_src = remaining_tokens(run, tokens_per_step)
    coloc = colocated_basis(run, tgt, dft, coeff, observed_bps)
    meas = model.Measurements(
        gpus_per_node=G, nodes=N, target_s_per_batch=tgt["s_per_batch"], drafter_s_per_batch=dft["s_per_batch"],
        allreduce_coeff_s=coeff, tokens_per_batch=tokens_per_batch, power_target_w=pw.get("target_w"),
        power_drafter_w=pw.get("drafter_w"), power_idle_w=pw.get("idle_w"), remaining_tokens=rem,
        colocated_overlap=coloc["overlap"], colocated_fit=coloc["fit"])
    preds = model.all_layouts(meas)
    own = preds[-1] if run.topology == "colocated" else model.predict(meas, T, D)
    base = own.batches_per_s
    over = oversubscription(run)
    too_many = (lambda p: p.gpus > over["cores_per_node"]) if over else (lambda p: False)  # noqa: E731
    rows = []
    for p in preds:
        j = p.to_json()
        j["vs_run_frac"] = p.batches_per_s / base - 1.0 if base else None
        j["power_saving_w"] = (own.power_w - p.power_w) if (own.power_w is not None and p.power_w is not None) else None
        j["oversubscribed"] = too_many(p)  # more busy ranks than the node has cores: the prediction cannot hold
        rows.append(j)
    # A split that would need more cores than the node has is not a candidate (its rate assumes a core per rank).
    candidates = [p for p in preds if not too_many(p)] or preds
    best = model.best_split(candidates)
    best_budget = model.best_split(candidates, power_budget_w) if power_budget_w else None

    ceiling_t, ceiling_d = own.target_cap_bps, own.drafter_cap_bps
    qp = queue_pressure(run, start_s, end_s)
    out = {
        "schema_version": SCHEMA_VERSION,
        "file": run.path,
        "run": {"topology": run.topology, "targets_per_node": T, "drafters_per_node": D, "gpus_per_node": G,
                "unit": run.unit, "host_cpu_cores": run.host_cpu_cores, "metrics_format_version": run.format_version,
                # run metadata (None in files written before the job recorded it)
                "start_utc": run.attrs.get("start_utc"), "git_commit": run.attrs.get("git_commit"),
                "command_line": run.attrs.get("command_line"),
                "nodes": N, "backend": run.backend, "steps": int(len(st.get("step", []))),
                "elapsed_s": float(max(end_s, float(st["time_s"].max()) if len(st.get("time_s", [])) else 0.0)),
                "window_s": [start_s, end_s], "window": window_note,
                # the segment measured (the /segments row; None in files without the table) and why, when it
                # is not the last
                "segment": run.report_segment if run.segments else None, "segment_note": run.segment_note,
                "tokens_per_batch": tokens_per_batch},
        "observed": {
            "batches_per_s": observed_bps, "ktok_per_s": observed_ktok,
            "target_batches_per_s": tgt_batches / span, "drafter_batches_per_s": dft_batches / span,
            "target_ceiling_bps": ceiling_t, "drafter_ceiling_bps": ceiling_d,
            "bottleneck": own.limit,
            "fraction_of_target_ceiling": observed_bps / ceiling_t,
            "fraction_of_drafter_ceiling": observed_bps / ceiling_d,
            # the drafters' share of the window spent evaluating (None: not recorded), and the rate without it
            "eval_frac": eval_frac, "batches_per_s_without_eval": training_bps,
            "headroom_frac": max(ceiling_t, ceiling_d) / min(ceiling_t, ceiling_d) - 1.0,
            "queues": qp,
        },
        "service": {"target": tgt, "drafter": dft, "allreduce_model": allreduce_note},
        "power": pw,
        "remaining_tokens": rem, "remaining_source": rem_src,
        "measurements": meas.to_json(),
        "run_prediction": own.to_json(),
        "prediction_vs_observed_frac": base / observed_bps - 1.0 if observed_bps else None,
        "prediction_vs_training_frac": base / training_bps - 1.0 if training_bps else None,
        "whatif": rows,
        "best": best.split if best else None,
        "auto_topology": ({"chosen": auto.get("chosen"), "predicted_bps": next(
            (w["batches_per_s"] for w in auto.get("whatif", []) if w.get("split") == auto.get("chosen")), None)}
            if auto else None),
        "power_budget_w": power_budget_w,
        "best_within_budget": best_budget.split if best_budget else None,
        "colocated": coloc,
        "oversubscription": over,
        "gpu_sharing": gpu_sharing(run),
        # series and attributes left out as not finite (load.py): nothing above is built on them
        "unusable": dict(getattr(run, "unusable", {})),
        "eval": held_out(run),
        "tau": tau_progress(run),
    }
    out["layout_plan"] = forecast.compare(run, tgt, dft, observed_bps)
    out["anchors"] = anchors.whatif(run, sel, start_s, meas, dft, own, seg_steps)
    out["verdict"] = verdict(out, preds, own, best, best_budget)
    out["segments"] = segments_table(run)
    if out["segments"] and len(out["segments"]) > 1:  # elapsed: every segment's own clock, one after the other
        t = st.get("time_s")
        ends = []
        for e in out["segments"]:
            m = segment_steps(run, e["index"]) if t is not None and e["index"] is not None else None
            ends.append(max(e["wall_s"] or 0.0, float(t[m].max()) if m is not None and m.any() else 0.0))
        out["run"]["elapsed_s"] = float(sum(ends))
    out["switch"] = switch(out, own, best, best_budget)
    return out


def _segment_rows(run, k):
    """/ranks rows of /segments row k: by /ranks/segment; in a file without it, by the interval rule when that
    finds as many segments as the table has rows, else only the measured segment's."""
    if run.segment_source == "/ranks/segment":
        return np.flatnonzero(run.rank_segment == k)
    found = int(run.rank_segment.max()) + 1 if len(run.rank_segment) else 0
    if found == len(run.segments or []):
        return np.flatnonzero(run.rank_segment == k)
    return run.report_rows if k == run.report_segment else np.zeros(0, dtype=np.int64)


def _segment_stats(run, rows, steps_mask):
    """A segment's wall time, trained b/s, Ktok/s and each role's busy s per batch over its steady window."""
    r, st = run.ranks, run.steps
    e = {"report_intervals": 0, "wall_s": None, "window_s": None, "batches_per_s": None, "ktok_per_s": None,
         "target_s_per_batch": None, "drafter_s_per_batch": None}
    if not len(rows):
        return e
    sel, start_s, end_s, _ = segment_window(run, rows)
    span = max(end_s - start_s, 1e-9)
    role = r["role"][sel]
    e["report_intervals"] = len(set(int(x) for x in r["interval"][rows]))
    e["wall_s"] = float(r["time_s"][rows].max())
    e["window_s"] = [start_s, end_s]
    e["batches_per_s"] = float(r["batches"][sel[role == ROLE_DRAFTER]].sum()) / span
    for name, code in (("target", ROLE_TARGET), ("drafter", ROLE_DRAFTER)):
        rr = sel[role == code]
        e[f"{name}_s_per_batch"] = _ratio(float(r["busy_s"][rr].sum()), float(r["batches"][rr].sum()))
    if steps_mask is not None and "tokens" in st and len(st.get("time_s", [])) == len(steps_mask):
        m = steps_mask & (st["time_s"] > start_s) & (st["time_s"] <= end_s)
        if m.any():
            e["ktok_per_s"] = float(st["tokens"][m].sum()) / span / 1000.0
    return e


def _pre_table_segments(run, step):
    """Entries for the segments written before the segment table (rows with /ranks/segment -1: a file of an
    earlier build resumed by this one). That build could not change the split on a resume: the first was a
    start, the others resumes on its split, which their ranks' roles give. Their steps: /steps up to the
    table's first first_step, one group per restart of its clock when there are as many as segments."""
    pre = run.pre_segments
    first = run.segment_row(0)
    upto = step <= first["first_step"] if first is not None else np.zeros(len(step), dtype=bool)
    t = run.steps.get("time_s")
    groups = None
    if t is not None and len(t) == len(step) and upto.any():
        idx = np.flatnonzero(upto)
        clock = clock_segments(np.asarray(t)[idx])
        if int(clock.max()) + 1 == len(pre):
            groups = [idx[clock == j] for j in range(len(pre))]
    out = []
    for j, rows in enumerate(pre):
        split = run.pre_segment_split(rows)
        e = {"index": None, "kind": 0 if j == 0 else 1, "kind_name": "start" if j == 0 else "resume",
             "pre_table": True, "first_step": None, "topology": f"{split[0]}-{split[1]}" if split else "?",
             "targets_per_node": split[0] if split else None, "drafters_per_node": split[1] if split else None,
             "nodes": split[2] if split else None, "world_size": int(np.asarray(run.ranks["rank"])[rows].max()) + 1,
             "grad_accum": None, "unix_time_s": None, "start_utc": None, "from_step": None, "to_step": None,
             "steps": None}
        mask = None
        if groups is not None:
            g = groups[j]
            mask = np.zeros(len(step), dtype=bool)
            mask[g] = True
            if len(g):
                e.update(from_step=int(step[g].min()), to_step=int(step[g].max()), steps=int(len(g)))
            else:
                e["steps"] = 0
        e.update(_segment_stats(run, rows, mask))
        e["measured"] = run.report_segment == -1 and j == len(pre) - 1
        out.append(e)
    return out


def segments_table(run):
    """One entry per job start (None in a file without the segment table): the rows written before the
    table (pre_table), then one per /segments row: what the start was, its split, the steps it covers, its
    wall time, trained b/s and each role's busy seconds per batch over its steady window (as the observed
    pipeline and the service rates), and whether the report measures it."""
    table = run.segments
    if not table:
        return None
    step = np.asarray(run.steps.get("step", np.zeros(0)), dtype=np.int64)
    last_step = int(step.max()) if len(step) else None
    out = _pre_table_segments(run, step) if run.pre_segments else []
    for k in range(max(len(table), run.report_segment + 1)):
        row = run.segment_row(k) or {  # a segment /ranks names before its /segments row was flushed
            "index": k, "first_step": None, "kind": None, "kind_name": "?", "nodes": run.nodes,
            "targets_per_node": run.targets_per_node, "drafters_per_node": run.drafters_per_node,
            "topology": run.topology, "world_size": None, "grad_accum": None, "unix_time_s": None}
        e = {key: row[key] for key in ("index", "kind", "kind_name", "first_step", "topology", "targets_per_node",
                                       "drafters_per_node", "nodes", "world_size", "grad_accum", "unix_time_s")}
        e["pre_table"] = False
        e["start_utc"] = (datetime.fromtimestamp(row["unix_time_s"], timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                          if row["unix_time_s"] is not None else None)
        later = [x["first_step"] for x in table[k + 1:] if x["first_step"] is not None]
        first = row["first_step"]
        to = min(later) if later else last_step
        e["from_step"] = first + 1 if first is not None else None
        e["to_step"] = to if first is not None and to is not None and to > first else None
        e["steps"] = max(0, to - first) if first is not None and to is not None else None
        e.update(_segment_stats(run, _segment_rows(run, k), segment_steps(run, k) if first is not None else None))
        e["measured"] = k == run.report_segment
        out.append(e)
    return out


def switch_steps(metrics_path, to, nodes, nodes_to=None, gpus_per_node=None):
    """The operator's steps to continue the run on split `to` (docs/checkpoint.md "Changing the split"):
    (heading, [one line per way the job was started]). RUN is the metrics file's directory, where the launch
    scripts read next-topology."""
    run_dir = os.path.dirname(os.path.abspath(metrics_path))
    nt = shlex.quote(os.path.join(run_dir, "next-topology"))
    heading = f'To switch to {to} without losing the run (docs/checkpoint.md "Changing the split"):'
    stop = "-> checkpoint, exit 75;"
    if nodes_to is None or nodes_to == nodes:
        return heading, [
            f"jobs/mpirun/train.sh:  echo {to} > {nt}; kill -USR1 <train.sh pid>   {stop} then run the same "
            "train.sh command again",
            f"plain mpirun:          kill -USR1 <mpirun pid>   {stop} then the same command with --topology {to} "
            "--resume auto",
            f"Slurm (jobs/slurm):    echo {to} > {nt}; scancel --signal=USR1 --batch JOBID   -> checkpoint, requeue, "
            f"restart on {to}",
        ]
    np_to = f" (-np {nodes_to * gpus_per_node})" if gpus_per_node else ""
    return heading, [
        f"jobs/mpirun/train.sh:  echo {to} > {nt}; kill -USR1 <train.sh pid>   {stop} then the same train.sh "
        f"command on {nodes_to} node(s){np_to}",
        f"plain mpirun:          kill -USR1 <mpirun pid>   {stop} then the same command on {nodes_to} node(s){np_to} "
        f"with --topology {to} --resume auto",
        f"Slurm (jobs/slurm):    scancel --signal=USR1 --batch JOBID   -> checkpoint, requeued; scancel JOBID while "
        f"it waits to restart; then resubmit with sbatch --nodes={nodes_to} and the same arguments plus --topology "
        f"{to} (the node count comes from Slurm; a {nt} file overrides --topology: put {to} in it or delete it)",
    ]


def _shared_text(share):
    return "; ".join(f"ranks {', '.join(map(str, x['ranks']))} on the GPU at {x['gpu_bus']} of {x['host']}"
                     for x in share["shared"])


def switch(out, own, best, best_budget):
    """{to, from, gain, nodes, within_power_budget, heading, steps} when the verdict recommends another split:
    the best (with --power-budget-w: the best within it) is not the run's and is predicted at least
    NOISE_FRACTION faster, from timings that are not distorted; else None."""
    run = out["run"]
    over = out.get("oversubscription")
    if (over and over["run_distorted"]) or out.get("gpu_sharing"):
        return None
    budget = out.get("power_budget_w")
    cand = best_budget if budget else best
    if cand is None or cand.split == run["topology"] or not own.batches_per_s:
        return None
    gain = cand.batches_per_s / own.batches_per_s - 1.0
    if gain < NOISE_FRACTION:
        return None
    heading, steps = switch_steps(out["file"], cand.split, run["nodes"])
    return {"to": cand.split, "from": run["topology"], "gain": gain, "nodes": run["nodes"],
            "predicted_bps": cand.batches_per_s, "within_power_budget": budget if budget else None,
            "heading": heading, "steps": steps}


def held_out(run):
    """The first and last /eval rows (--eval-data), or None when the run has none."""
    ev = getattr(run, "eval", {}) or {}
    if not len(ev.get("step", [])):
        return None

    def row(i):
        return {"step": int(ev["step"][i]), "loss": float(ev["loss"][i]), "acc": float(ev["acc"][i]),
                "streak": float(ev["streak"][i])}
    return {"evaluations": int(len(ev["step"])), "first": row(0), "last": row(-1),
            "seqs": int(ev["seqs"][-1]) if "seqs" in ev else None,
            "tokens": int(ev["tokens"][-1]) if "tokens" in ev else None}


# When tau has stopped rising (--eval-tau-every): none of the last TAU_PATIENCE evaluations beat the best
# tau before them by more than TAU_MIN_GAIN tokens (a gain that small is within the noise of a few dozen
# prompts). Fewer than TAU_PATIENCE + 1 evaluations: too early to say.
TAU_PATIENCE = 3
TAU_MIN_GAIN = 0.01


def tau_progress(run):
    """tau per evaluation that measured it (/eval/tau), the best, and whether it has stopped rising; None
    when the run measured no tau."""
    ev = getattr(run, "eval", {}) or {}
    if "tau" not in ev or not len(ev.get("step", [])):
        return None
    tau = np.asarray(ev["tau"], dtype=float)
    keep = np.isfinite(tau)
    if not keep.any():
        return None
    steps, tau = np.asarray(ev["step"])[keep].astype(int), tau[keep]
    b = int(np.argmax(tau))  # the first of equal maxima: the drafter OUT/drafter-best holds
    n = len(tau)
    rule = (f"stopped rising = none of the last {TAU_PATIENCE} evaluations beat the best tau before them by more "
            f"than {TAU_MIN_GAIN} tokens")
    stopped = None
    if n >= TAU_PATIENCE + 1:
        before = float(tau[:n - TAU_PATIENCE].max())
        stopped = bool(float(tau[n - TAU_PATIENCE:].max()) <= before + TAU_MIN_GAIN)
    prompts = ev.get("tau_prompts")
    return {"evaluations": n, "steps": [int(x) for x in steps], "tau": [float(x) for x in tau],
            "best": {"step": int(steps[b]), "tau": float(tau[b])},
            "last": {"step": int(steps[-1]), "tau": float(tau[-1])},
            "prompts": int(np.asarray(prompts)[keep][-1]) if prompts is not None else None,
            "stopped_rising": stopped, "rule": rule}


# ---- the verdict -----------------------------------------------------------------------------------

_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]


def _n(k, noun):
    w = _WORDS[k] if k < len(_WORDS) else str(k)
    return f"{w} {noun}{'' if k == 1 else 's'}"


def _watts(w):
    return f"{w / 1000:.1f} kW" if abs(w) >= 1000 else f"{w:.0f} W"


def _why(p):
    if p.layout == "colocated":
        o = "not measured, taken as 0" if p.overlap is None else f"{p.overlap:+.2f} of the shorter role"
        return f"every GPU runs both roles one batch at a time (overlap {o})"
    if p.limit == "target":
        return f"{_n(p.targets, 'target')} cannot feed {_n(p.drafters, 'drafter')}"
    return f"{_n(p.drafters, 'drafter')} cannot keep up with {_n(p.targets, 'target')}"


def _colocated_sentences(out, co, own, best, rel, distorted):
    """What the verdict says of the colocated row where it is not simply the run or the recommendation: why it
    is not a candidate, or what its recommendation rests on."""
    basis = out["colocated"]
    if co is None or own.layout == "colocated" or distorted:
        return []
    gain = rel(co)
    if best is not None and best.split == "colocated":
        said = [f"The colocated overlap comes from {basis['overlap_source']}."]
        if co.fit == "unknown":
            said.append(f"Whether a colocated rank fits is unknown ({basis['fit_why']}): `dflash-train --dry-run "
                        "--topology colocated --gpu NAME ...` checks it before you switch.")
        return said
    if gain < NOISE_FRACTION:
        return []
    if co.fit == "does not fit":
        return [f"Colocated would give {co.batches_per_s:.2f} b/s ({100 * gain:+.0f}%) but a colocated rank does not "
                f"fit ({basis['fit_why']}): not a candidate."]
    if co.overlap is None:
        return [f"Colocated would give {co.batches_per_s:.2f} b/s ({100 * gain:+.0f}%) if its two roles took turns on "
                "each GPU, but their overlap was not measured: not a recommendation (`--topology auto` times it beside "
                "the splits)."]
    return []


def verdict(out, preds, own, best, best_budget):
    obs = out["observed"]
    run = out["run"]
    split = run["topology"]
    by = {p.split: p for p in preds}
    rel = lambda p: p.batches_per_s / own.batches_per_s - 1.0  # noqa: E731
    s = [f"{split} runs at {obs['batches_per_s']:.2f} b/s ({obs['ktok_per_s']:.1f} Ktok/s), "
         f"{100 * obs['fraction_of_target_ceiling']:.0f}% of its target-side ceiling "
         f"({obs['target_ceiling_bps']:.2f} b/s)"]
    if own.layout == "colocated":
        s[-1] = (f"{split} runs at {obs['batches_per_s']:.2f} b/s ({obs['ktok_per_s']:.1f} Ktok/s): {_why(own)}; "
                 f"the targets alone would run {obs['target_ceiling_bps']:.2f} b/s, the drafters alone "
                 f"{obs['drafter_ceiling_bps']:.2f} b/s.")
    elif own.limit == "drafter":
        s[-1] += f"; the drafter side ({obs['drafter_ceiling_bps']:.2f} b/s) is the bottleneck."
    else:
        s[-1] += (f"; the targets are the bottleneck (the drafters could take "
                  f"{100 * (obs['drafter_ceiling_bps'] / obs['target_ceiling_bps'] - 1):.0f}% more).")
    ev = obs.get("eval_frac")
    if ev is not None and EVAL_SHARE_WORTH_SAYING <= ev < 1.0:
        s.append(f"The drafters spent {100 * ev:.0f}% of the measured window evaluating --eval-data: the observed "
                 f"rate includes that time, the predictions here do not (training alone ran at "
                 f"{obs['batches_per_s_without_eval']:.2f} b/s; the model predicts "
                 f"{100 * out['prediction_vs_training_frac']:+.0f}% vs that, {100 * out['prediction_vs_observed_frac']:+.0f}% "
                 "vs observed); a larger --eval-every or a smaller --eval-max-tokens gives training that time back.")
    at = out.get("auto_topology")
    if at and at.get("predicted_bps"):
        s.append(f"--topology auto chose {at['chosen']} from a start-up measurement predicting "
                 f"{at['predicted_bps']:.2f} b/s; the run itself measured {obs['batches_per_s']:.2f} b/s.")
    over = out.get("oversubscription")
    distorted = bool(over and over["run_distorted"])
    if distorted:
        s.append(f"These timings are distorted: {over['busy_ranks_per_node']} busy ranks shared "
                 f"{over['cores_per_node']} cores (oversubscribed), so every service time includes waiting for a "
                 "core and no prediction from them is a basis for choosing a split; measure with a core per rank "
                 "(or on the GPUs).")
    share = out.get("gpu_sharing")
    if share:
        distorted = True
        s.append(f"These timings are distorted: {share['busy_ranks']} busy ranks shared {share['gpus']} GPU(s) "
                 f"({_shared_text(share)}), taking turns, so each role's service time includes the other's and the "
                 "splits below are predicted for GPUs the run did not have: not a basis for choosing a split. "
                 "The layout plan's prediction (LAYOUT PLAN VS OBSERVED) prices the sharing; on one GPU "
                 "--topology colocated runs both roles in one process.")
    if out.get("unusable"):
        s.append("Left out as not finite (NaN or infinite), and nothing here is built on them: "
                 + "; ".join(f"{k} ({w})" for k, w in out["unusable"].items()) + ".")
    unit = run.get("unit", "GPU")
    if best is None or best.split == split:
        s.append(f"Keep {split}: no other layout of the {run['gpus_per_node']} {unit}s is predicted faster.")
    elif rel(best) < NOISE_FRACTION:
        s.append(f"Keep {split}: the best alternative, {best.split}, is predicted only {100 * rel(best):+.0f}%, "
                 "within measurement noise.")
    elif distorted:
        s.append(f"{best.split} is predicted {100 * rel(best):+.0f}% from these distorted timings: not a "
                 "recommendation.")
    else:
        s.append(f"Switch to {best.split}: predicted {best.batches_per_s:.2f} b/s ({100 * rel(best):+.0f}%) "
                 f"because {_why(own)}" + (f"; colocated: {_why(best)}." if best.layout == "colocated" else "."))
    s.extend(_colocated_sentences(out, by.get("colocated"), own, best, rel, distorted))
    if over and not distorted:
        s.append(f"Splits with more than {over['cores_per_node']} busy ranks per node would share cores and are "
                 "left out of the choice.")
    T, D = own.targets, own.drafters
    if out["measurements"]["allreduce_coeff_s"] is None and any(
            p.drafters > D and p.batches_per_s > own.batches_per_s for p in preds):
        s.append("Splits with more drafters assume a free gradient allreduce (not measured: "
                 f"{'left out' if D * run['nodes'] > 1 else 'not measurable with one drafter'}): treat their gains "
                 "as an upper bound.")
    for alt in (f"{T - 1}-{D + 1}", f"{T + 1}-{D - 1}"):
        p = by.get(alt)
        if p is not None and (best is None or alt != best.split):
            s.append(f"{alt} would give {p.batches_per_s:.2f} b/s ({100 * rel(p):+.0f}%) because {_why(p)}" +
                     (f", but it needs {p.targets + p.drafters} busy ranks on {over['cores_per_node']} cores."
                      if over and p.targets + p.drafters > over["cores_per_node"] else "."))
    if own.power_w is None:
        s.append(f"No power data ({out['power']['reason'] or 'idle draw unknown'}): power savings are not predicted.")
    else:
        savers = [by[k] for k in (f"{T - 1}-{D}", f"{T - 2}-{D}") if k in by and by[k].power_w is not None]
        if savers:
            parts = [f"{p.split} saves ~{_watts(own.power_w - p.power_w)} for {100 * rel(p):+.0f}% "
                     f"({p.ktok_per_s:.1f} Ktok/s)" for p in savers]
            s.append("; ".join(parts) + ".")
    tau = out.get("tau")
    if tau and tau["stopped_rising"]:
        s.append(f"tau has stopped rising: the best, {tau['best']['tau']:.3f} at step {tau['best']['step']} "
                 f"(OUT/drafter-best), was not beaten by more than {TAU_MIN_GAIN} in the last {TAU_PATIENCE} "
                 "evaluations; more steps of this recipe are unlikely to pay.")
    budget = out["power_budget_w"]
    if budget:
        if best_budget is None:
            s.append(f"No split fits under {_watts(budget)}" +
                     (" (no power data)." if own.power_w is None else "."))
        else:
            s.append(f"Within {_watts(budget)} the best is {best_budget.split}: {best_budget.batches_per_s:.2f} b/s "
                     f"({100 * rel(best_budget):+.0f}%) at {_watts(best_budget.power_w)}.")
    if out.get("anchors") and not distorted:
        s.append(out["anchors"]["sentence"])
    return " ".join(s)
