"""The layout plan's prediction (metrics.h5 attribute layout_plan, src/runtime/layout_forecast.h) beside what the
run measured, per role, and the calibration file fitted to the run (docs/cost_model.md "Learning from a run").

The job stores the cost model's plan for the GPU kind it ran on (or --gpu named): the target forward's and the
drafter step's predicted seconds per batch, the running layout's batches/s and the constants it used. Here the
observed service times (analysis.service_stats) are set beside them; calibration.json is the run's constants
with target_time_scale / drafter_time_scale = observed / predicted, which `dflash-train --calibration FILE`
reads back (a later dry run or --topology plan then predicts this cluster's times, source "user").
"""

import json
import os

from . import safe_out


def compare(run, tgt, dft, observed_bps):
    """Predicted vs observed per role, or None when the file has no layout plan (CPU runs without --gpu, files
    written before the job stored it)."""
    lp = getattr(run, "layout_plan", None)
    if not lp or "plan" not in lp:
        return None
    plan, running = lp["plan"], lp.get("running") or {}
    # Roles sharing a GPU (a one-GPU 1-1, or colocated): each role's busy time includes the other's turns.
    shared = bool(running.get("gpus_shared")) or running.get("layout") == "colocated"
    allreduce = running.get("allreduce_s") or 0.0
    obs_allreduce = dft.get("allreduce_s_per_batch") or 0.0
    rows = []

    def row(name, predicted, observed, unit):
        err = (predicted / observed - 1.0) if (predicted and observed) else None
        rows.append({"what": name, "predicted": predicted, "observed": observed, "unit": unit, "error_frac": err})

    # Sharing a GPU, each role's busy time includes the other's turns: only the pipeline's rate is comparable.
    if not shared:
        row("target forward", plan.get("target_forward_s"), tgt.get("s_per_batch"), "s/batch")
        row("drafter step", plan.get("drafter_step_s"), (dft.get("s_per_batch") or 0.0) - obs_allreduce or None,
            "s/batch")
        if allreduce or obs_allreduce:
            row("gradient allreduce", allreduce or None, obs_allreduce or None, "s/batch")
    row(f"pipeline ({running.get('layout', '?')}{', roles sharing GPUs' if running.get('gpus_shared') else ''})",
        running.get("batches_per_s"), observed_bps, "batches/s")
    cal = ((lp.get("calibration") or {}).get("gpus") or [{}])[0]
    return {"gpu": plan.get("gpu"), "calibration_source": plan.get("gpu_calibration"), "choice": lp.get("choice"),
            "recommended": plan.get("recommended"), "running": running.get("layout"), "gpus_shared": shared,
            "rows": rows, "calibration": cal}


def fitted_calibration(cmp, run_path, backend, start_utc=None):
    """The run's calibration entry with the observed / predicted scales (the file --calibration reads)."""
    cal = dict(cmp["calibration"])
    by = {r["what"]: r for r in cmp["rows"]}
    t_scale = d_scale = None
    if not cmp["gpus_shared"]:
        t, d = by.get("target forward"), by.get("drafter step")
        if t and t["predicted"] and t["observed"]:
            t_scale = t["observed"] / t["predicted"]
        if d and d["predicted"] and d["observed"]:
            d_scale = d["observed"] / d["predicted"]
    else:
        # Roles taking turns on one GPU: one factor for both (the rate is 1 / (t_target + t_drafter)).
        p = next((r for r in cmp["rows"] if r["what"].startswith("pipeline")), None)
        if p and p["predicted"] and p["observed"]:
            t_scale = d_scale = p["predicted"] / p["observed"]
    if t_scale is None or d_scale is None:
        return None
    cal["target_time_scale"] = cal.get("target_time_scale", 1.0) * t_scale
    cal["drafter_time_scale"] = cal.get("drafter_time_scale", 1.0) * d_scale
    cal["source"] = "user"
    cal["basis"] = (f"fitted to {run_path}{' (' + start_utc + ')' if start_utc else ''}, backend {backend}: "
                    f"target x{t_scale:.3f}, drafter x{d_scale:.3f} of the {cmp['calibration_source']} "
                    f"{cal.get('name', '?')} constants")
    return {"version": 1, "gpus": [cal]}


def write_calibration(path, table):
    """Writes table to path atomically, as every file this tool puts into a run directory is written
    (safe_out.replace_file: a fresh name beside it created O_EXCL|O_NOFOLLOW relative to the directory's
    descriptor, renamed over path there): a link, hard link or FIFO planted at path is replaced, never written
    through; a directory there is refused."""
    if os.path.islink(path):
        raise OSError(f"{path} is a symbolic link: not written (remove it, or give --calibration-out another path)")

    def write(f):
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())

    safe_out.replace_file(path, write)


def text(cmp, written=None):
    L = ["", f"LAYOUT PLAN VS OBSERVED (cost model for {cmp['gpu']}, {cmp['calibration_source']}; "
             f"--topology {cmp['choice']}, ran {cmp['running']}, plan recommended {cmp['recommended'] or '-'})",
         "  what                                   predicted        observed   error"]
    for r in cmp["rows"]:
        err = "-" if r["error_frac"] is None else f"{100 * r['error_frac']:+.1f}%"
        p = "-" if r["predicted"] is None else f"{r['predicted']:.4g}"
        o = "-" if r["observed"] is None else f"{r['observed']:.4g}"
        L.append(f"  {r['what'][:36]:<36} {p:>10} {o:>10} {r['unit']:<9} {err:>7}")
    if written:
        L.append(f"  calibration fitted to this run: {written} (dflash-train --calibration {written})")
    return L
