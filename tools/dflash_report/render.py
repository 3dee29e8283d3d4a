"""Fixed-width text tables of the report (every number with its unit)."""

import textwrap


def _f(v, fmt, width, none="-"):
    return (none if v is None else format(v, fmt)).rjust(width)


def _pct(v, width=7):
    return _f(None if v is None else 100 * v, ".1f", width - 1) + "%" if v is not None else "-".rjust(width)


def _dur(s):
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{s / 86400:.1f}d"


def text(rep):
    run, obs, svc, pw = rep["run"], rep["observed"], rep["service"], rep["power"]
    q = obs["queues"]
    L = []
    L.append(f"dflash-report {rep['file']}")
    unit = run.get("unit", "GPU")
    L.append(f"run: topology {run['topology']} on {run['nodes']} node(s) x {run['gpus_per_node']} {unit}(s), "
             f"backend {run['backend']}, {run['steps']} steps, {_dur(run['elapsed_s'])}; "
             f"{run['tokens_per_batch'] / 1000:.1f} Ktok/batch")
    if run.get("start_utc") or run.get("git_commit"):
        commit = run.get("git_commit") or "?"
        L.append(f"started {run.get('start_utc') or '?'}, built from commit {commit[:12]}"
                 f"{' (uncommitted changes)' if commit.endswith('-dirty') else ''}")
    if rep.get("auto_topology"):
        L.append(f"split chosen by --topology auto ({rep['auto_topology']['chosen']}, predicted at start-up: "
                 f"{rep['auto_topology']['predicted_bps'] or 0:.3f} b/s)")
    seg = ""
    if run.get("segment") is not None and len(rep.get("segments") or []) > 1:
        seg = " of the last segment before the segment table" if run["segment"] < 0 else f" of segment {run['segment']}"
    L.append(f"steady window{seg}: {run['window_s'][0]:.1f} s .. {run['window_s'][1]:.1f} s, {run['window']}")
    for name, why in (rep.get("unusable") or {}).items():  # load.py left these out: nothing below uses them
        L.append(f"left out: {name}: {why}")
    ev = rep.get("eval")
    if ev:
        last, first = ev["last"], ev["first"]
        L.append(f"held-out eval ({ev['seqs']} seqs, {ev['evaluations']} evaluations): step {last['step']} loss "
                 f"{last['loss']:.4f} acc {last['acc']:.3f} streak {last['streak']:.2f}"
                 + (f" (step {first['step']}: loss {first['loss']:.4f})" if ev["evaluations"] > 1 else ""))
    tau = rep.get("tau")
    if tau:
        L.append(f"tau ({tau['prompts']} prompts, {tau['evaluations']} evaluations): step {tau['last']['step']} "
                 f"tau {tau['last']['tau']:.3f}, best {tau['best']['tau']:.3f} at step {tau['best']['step']} "
                 f"(OUT/drafter-best): {tau_words(tau)}")
    segs = rep.get("segments") or []
    if len(segs) > 1:
        L.append("")
        L.extend(segments_text(rep))
    L.append("")
    L.append("OBSERVED PIPELINE")
    L.append(f"  trained (drafters)   {obs['batches_per_s']:8.3f} b/s   {obs['ktok_per_s']:8.2f} Ktok/s")
    L.append(f"  targets produced     {obs['target_batches_per_s']:8.3f} b/s   "
             f"({svc['target']['ranks']} rank(s), {obs['target_batches_per_s'] / max(svc['target']['ranks'], 1):.3f} b/s each)")
    L.append(f"  drafters trained     {obs['drafter_batches_per_s']:8.3f} b/s   "
             f"({svc['drafter']['ranks']} rank(s), {obs['drafter_batches_per_s'] / max(svc['drafter']['ranks'], 1):.3f} b/s each)")
    if q.get("samples"):
        L.append(f"  q_hs (depth {q.get('hs_depth')})        full {_pct(q.get('q_hs_full_frac'))}  "
                 f"empty {_pct(q.get('q_hs_empty_frac'))}  of {q['samples']} samples (mean {q.get('q_hs_mean', 0):.1f})")
        L.append(f"  q_pre (depth {q.get('prefetch_depth')})       empty {_pct(q.get('q_pre_empty_frac'))}  "
                 f"(mean {q.get('q_pre_mean', 0):.1f}); targets waited for data "
                 f"{_pct(svc['target'].get('data_wait_frac'))} and for credits {_pct(svc['target'].get('credit_wait_frac'))} "
                 f"of their time; drafters for data {_pct(svc['drafter'].get('data_wait_frac'))}")
    else:
        L.append("  queues: no samples")
    side = "drafter side" if obs["bottleneck"] == "drafter" else "target side"
    L.append(f"  ceilings             targets {obs['target_ceiling_bps']:.3f} b/s, drafters {obs['drafter_ceiling_bps']:.3f} b/s"
             f" -> bottleneck: {side}, the other side has {100 * obs['headroom_frac']:.1f}% headroom")
    L.append(f"  observed / ceiling   {100 * obs['fraction_of_target_ceiling']:.1f}% of the target side, "
             f"{100 * obs['fraction_of_drafter_ceiling']:.1f}% of the drafter side; the model predicts "
             f"{rep['run_prediction']['batches_per_s']:.3f} b/s for {run['topology']} "
             f"({100 * rep['prediction_vs_observed_frac']:+.1f}% vs observed)" +
             ("; the ranks shared GPUs, taking turns: these ceilings count each role's time as if it had its own"
              if rep.get("gpu_sharing") else ""))
    if obs.get("eval_frac") is not None:
        L.append(f"  evaluation           the drafters spent {100 * obs['eval_frac']:.1f}% of the window evaluating "
                 "--eval-data" + (f": training alone {obs['batches_per_s_without_eval']:.3f} b/s, the model's "
                                  f"{100 * rep['prediction_vs_training_frac']:+.1f}% vs that"
                                  if obs.get("batches_per_s_without_eval") else ""))
    L.append("")
    L.append(f"SERVICE RATES (batches per busy second per {unit}; busy = target forward | drafter fwd+bwd+optimizer)")
    L.append("  role      ranks  busy     p10       p50       p90       mean      s/batch   allreduce s/batch")
    for name in ("target", "drafter"):
        s = svc[name]
        L.append(f"  {name:<8}{s['ranks']:6d}  {_pct(s['busy_frac'])}"
                 f"{_f(s['p10'], '.4f', 10)}{_f(s['p50'], '.4f', 10)}{_f(s['p90'], '.4f', 10)}"
                 f"{_f(s['rate_bps_per_gpu'], '.4f', 10)}{_f(s['s_per_batch'], '.3f', 10)}"
                 f"{_f(s.get('allreduce_s_per_batch') if name == 'drafter' else None, '.4f', 12)}")
    L.append(f"  allreduce model: {svc['allreduce_model']}")
    L.append("")
    L.append("POWER")
    if pw["available"]:
        L.append(f"  measured: target {_f(pw['target_w'], '.0f', 5)} W/GPU, drafter {_f(pw['drafter_w'], '.0f', 5)} W/GPU, "
                 f"idle {_f(pw['idle_w'], '.0f', 5)} W/GPU ({pw['idle_source'] or 'unknown: no idle GPU, no gpu_idle_power_w'}); "
                 f"total {pw['total_w']:.0f} W")
    else:
        L.append(f"  no power data: {pw['reason']} (power columns below are blank, not invented)")
    L.append("")
    L.append(f"WHAT-IF (every split of the {run['gpus_per_node']} {unit}s per node and colocated; predicted from "
             "service rates)")
    over = rep.get("oversubscription")
    if over and over["run_distorted"]:
        L.append(f"  !! DISTORTED: {over['busy_ranks_per_node']} busy ranks per node shared {over['cores_per_node']} "
                 "cores (oversubscribed): the service rates above and every row below include waiting for a core.")
        L.append("  !! Do not choose a split from them; measure with a core per rank, or on the GPUs.")
    share = rep.get("gpu_sharing")
    if share:
        L.append(f"  !! DISTORTED: {share['busy_ranks']} busy ranks shared {share['gpus']} GPU(s), taking turns: each "
                 "role's service rate above includes the other's turns, and every row below assumes a GPU per rank.")
        L.append("  !! Do not choose a split from them; LAYOUT PLAN VS OBSERVED prices the sharing.")
    L.append("  layout     idle  tgt cap b/s  dft cap b/s  pred b/s   Ktok/s  vs run  limit     power W  Ktok/s/kW  ETA")
    for w in rep["whatif"]:
        mark = "*" if w["split"] == run["topology"] else ("!" if w.get("oversubscribed") else " ")
        L.append(f" {mark}{w['split']:<10}{w['idle']:4d}  {w['target_cap_bps']:11.3f}  {w['drafter_cap_bps']:11.3f}"
                 f"  {w['batches_per_s']:8.3f} {w['ktok_per_s']:8.2f} {100 * w['vs_run_frac']:+6.1f}%  {w['limit']:<8}"
                 f"{_f(w['power_w'], '.0f', 8)}  {_f(w['ktok_per_kw'], '.2f', 9)}  {_dur(w['eta_s'])}")
    co = rep.get("colocated")
    if co:
        o = "not measured (taken as 0; not a candidate)" if co["overlap"] is None else f"{co['overlap']:+.2f}"
        L.append(f"  (colocated: overlap {o} of the shorter role, from {co['overlap_source']}; memory {co['fit']}"
                 f" ({co['fit_why']}){'; not a candidate' if co['fit'] == 'does not fit' else ''})")
    if any(w.get("oversubscribed") for w in rep["whatif"]):
        L.append(f"  (! = more busy ranks than the {over['cores_per_node']} cores per node: the prediction assumes "
                 "a core per rank and cannot hold; left out of the choice)")
    if (obs.get("eval_frac") or 0) > 0:
        L.append(f"  (predictions and ETAs are of training alone: evaluation took {100 * obs['eval_frac']:.1f}% of "
                 "this run's drafter time, on top of them)")
    L.append(f"  (* = this run; remaining tokens: "
             f"{'?' if rep['remaining_tokens'] is None else format(rep['remaining_tokens'] / 1e6, '.1f') + ' M'}"
             f" from {rep['remaining_source']})")
    best = rep["best"]
    if (over and over["run_distorted"]) or share:
        best = f"none recommended (from these distorted timings the model would pick {rep['best']})"
    L.append(f"  best layout: {best}" +
             (f"; best within {rep['power_budget_w']:.0f} W: {rep['best_within_budget'] or 'none fits'}"
              if rep["power_budget_w"] else ""))
    an = rep.get("anchors")
    if an:
        rule = (f"up to {an['anchors_per_record']} per record, at most {an['max_anchors']} per batch"
                if an["anchors_per_record"] else f"up to {an['max_anchors']} per batch" if an["max_anchors"]
                else "the anchor options not recorded")
        L.append("")
        L.append(f"ANCHORS WHAT-IF (this split; drafter s/batch = {an['cost_a_s']:.4f} + "
                 f"{1000 * an['cost_b_s_per_anchor']:.4f} ms x anchors: {an['cost_model']})")
        L.append(f"  this run: {an['anchors_per_batch']:.0f} anchors per batch ({rule}"
                 + (f"; the cap bound {100 * an['cap_bound_frac']:.0f}% of the steps" if an["cap_bound_frac"] is not None else "")
                 + ")" + (f"; drafters wait {100 * an['drafter_wait_frac']:.0f}% of the time"
                          if an["drafter_wait_frac"] is not None else ""))
        L.append("  anchors/batch  dft s/batch  dft cap b/s  pred b/s   Ktok/s  Kblocks/s  vs run  limit")
        for w in an["rows"]:
            mark = "*" if w["this_run"] else ("=" if w["free"] else " ")
            L.append(f" {mark}{w['anchors_per_batch']:12d}  {w['drafter_s_per_batch']:11.4f}  {w['drafter_cap_bps']:11.3f}"
                     f"  {w['batches_per_s']:8.3f} {w['ktok_per_s']:8.2f}  {w['kblocks_per_s']:9.3f} "
                     f"{100 * w['vs_run_frac']:+6.1f}%  {w['limit']}")
        L.append("  (* = this run; = = the most anchors per batch at which the drafters still keep up with the targets)")
    if rep.get("layout_plan"):
        from . import forecast
        L.extend(forecast.text(rep["layout_plan"], rep.get("calibration_written")))
    L.append("")
    L.append("VERDICT")
    L.extend(textwrap.wrap(rep["verdict"], width=110, initial_indent="  ", subsequent_indent="  "))
    sw = rep.get("switch")
    if sw:  # the exact commands: not wrapped, so that they can be copied
        L.append("")
        L.append("  " + sw["heading"])
        L.extend("    " + line for line in sw["steps"])
    return "\n".join(L) + "\n"


def _steps_range(e):
    if e["steps"] is None:
        return "?"
    if not e["steps"]:
        return "none" if e["first_step"] is None else f"none (from {e['first_step']})"
    return f"{e['from_step']}..{e['to_step']}"


def segments_text(rep):
    """The SEGMENTS section: one row per job start recorded in /segments (docs/report.md)."""
    segs = rep["segments"]
    unit = rep["run"].get("unit", "GPU")
    L = [f"SEGMENTS ({len(segs)} job starts in this file; per segment over its steady window: trained b/s and each "
         f"role's busy s per batch)"]
    L.append("  seg  kind       split  nodes  steps                   wall  trained b/s  target s/batch  "
             "drafter s/batch")
    for e in segs:
        mark = "*" if e["measured"] else " "
        index = "-" if e["index"] is None else str(e["index"])
        nodes = "?" if e["nodes"] is None else str(e["nodes"])
        L.append(f"  {mark}{index:>2}  {e['kind_name']:<9}  {e['topology']:<5}  {nodes:>5}  "
                 f"{_steps_range(e):<18}  {_dur(e['wall_s']) if e['wall_s'] is not None else '-':>7}"
                 f"  {_f(e['batches_per_s'], '.3f', 11)}  {_f(e['target_s_per_batch'], '.3f', 14)}  "
                 f"{_f(e['drafter_s_per_batch'], '.3f', 15)}")
    if any(e.get("pre_table") for e in segs):
        L.append("  - = written before the segment table (an earlier build, which kept the split on a resume): the "
                 "split from its ranks' roles")
    m = next(e for e in segs if e["measured"])
    last = segs[-1]
    which = "the last segment before the table" if m["index"] is None else f"segment {m['index']}"
    L.append(f"  * = measured: the verdict uses the last segment only ({which}, {m['topology']} on "
             f"{m['nodes']} node(s) x {rep['run']['gpus_per_node']} {unit}s"
             f"{'' if m is last else '; ' + (rep['run'].get('segment_note') or '')}); service times are never mixed "
             "across segments")
    return L


def tau_words(tau):
    """Whether tau is still rising, in words, with the rule (analysis.tau_progress)."""
    if tau["stopped_rising"] is None:
        return f"too few evaluations to tell whether it still rises ({tau['rule']})"
    if tau["stopped_rising"]:
        return f"tau has stopped rising ({tau['rule']}): more training of this recipe is unlikely to raise it"
    return f"tau is still rising ({tau['rule']}: not the case)"
