#!/usr/bin/env python3
"""The quality benchmark's bookkeeping (run.sh calls it; numpy + h5py only).

  collect.py rate METRICS.h5                 steady steps per second of a dflash-train run (its later 80%)
  collect.py plan --rate R --budgets 60,120,240 [--warmup-ratio 0.04]
                                             the run's --max-steps and --checkpoint-every for those budgets
  collect.py ours RUN_DIR --budgets ... --label NAME --out run.json
                                             dflash-train's exported checkpoints as snapshots (training seconds,
                                             steps, tokens, anchors up to each) in ref_train_dflash.py's run.json form
  collect.py list RUN.json                   "EVAL_NAME DRAFTER_DIR" per distinct snapshot (what to dflash-eval)
  collect.py layer-ids L N                   build_target_layer_ids(L, N) as "a,b,..."
  collect.py summarise --runs a.json b.json ref.json --eval-dir DIR --budgets ... --out-json R.json --out-md R.md
                                             the tau table (tau +- its standard error over the prompts, steps tau)
  collect.py paired A.json B.json            B's tau minus A's over the same prompts (dflash-eval jsons), with the
                                             difference's standard error, and B's steps tau against A's
  collect.py seeds A B EVAL_DIR... [--by-prompt [--split 4]]
                                             drafter B's steps tau against A's in each run (an eval dir per seed
                                             or target: WORK/eval), snapshot by snapshot, and their mean over the
                                             runs with its standard error across them (what another run would move);
                                             --by-prompt: the same for the mean over prompts of each prompt's tau,
                                             its difference split into prompts below / at or above a pair mean tau

Training seconds of dflash-train at step s: the sum of the intervals between consecutive /steps rows
(metrics.h5 time_s, seconds since the job started) up to s, the first step counted at the median interval, and
an interval that follows a checkpoint or evaluation step also at the median (saving and evaluating are not
training; the reference excludes its saving too). Startup (loading, the first batch's wait) is excluded like
the reference's loading and calibration.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys


def build_target_layer_ids(num_target_layers, num_draft_layers):
    """The official rule (z-lab dflash, SpecForge build_target_layer_ids); layer l = HF hidden_states[l + 1]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + (i * span) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def read_steps(metrics):
    import h5py
    import numpy as np
    with h5py.File(metrics, "r") as f:
        st = {k: np.asarray(f["steps/" + k][:]) for k in ("step", "time_s", "tokens", "anchors", "loss")}
        ev = np.asarray(f["eval/step"][:]) if "eval" in f and "step" in f["eval"] else np.zeros(0)
        tau = None
        if "eval" in f and "tau" in f["eval"]:
            tau = {"step": ev.tolist(), "tau": np.asarray(f["eval/tau"][:]).tolist()}
    return st, ev, tau


def training_seconds(st, pause_after):
    """Cumulative training seconds at each /steps row (see the module doc)."""
    t = st["time_s"]
    d = [t[i] - t[i - 1] for i in range(1, len(t))]
    med = statistics.median(d) if d else 0.0
    out, acc = [], 0.0
    for i in range(len(t)):
        if i == 0 or int(st["step"][i - 1]) in pause_after:
            acc += med
        else:
            acc += d[i - 1]
        out.append(acc)
    return out, med


def cmd_rate(a):
    st, _, _ = read_steps(a.metrics)
    n = len(st["step"])
    if n < 3:
        sys.exit(f"{a.metrics}: only {n} steps, too few to time")
    i0 = n // 2  # the second half: the first steps build cuDNN plans and warm the data plane
    dt = float(st["time_s"][-1] - st["time_s"][i0])
    ds = int(st["step"][-1] - st["step"][i0])
    if not a.all:
        print(f"{ds / dt:.4f}")
        return
    # the same window's tokens and anchors (rows after i0 hold the steps ds counts)
    tok = float(st["tokens"][i0 + 1:].sum()) / dt
    anc = float(st["anchors"][i0 + 1:].sum()) / dt
    print(f"{ds / dt:.4f} steps/s, {tok / 1e3:.2f} K tokens/s, {anc / 1e3:.3f} K anchors/s "
          f"(steps {int(st['step'][i0])}..{int(st['step'][-1])}, {dt:.1f} s)")


def budgets_of(s):
    return sorted(float(b) for b in s.split(",") if b.strip())


def cmd_plan(a):
    b = budgets_of(a.budgets)
    g = b[0]
    for x in b[1:]:  # the budgets' common interval (whole seconds)
        g = math.gcd(int(round(g)), int(round(x)))
    every = max(1, int(round(a.rate * g)))
    max_steps = every * int(round(b[-1] / g))  # the last budget is a checkpoint too: no extra final one
    print(f"{max_steps} {every}")


def ours_snapshots(a):
    st, ev, tau = read_steps(os.path.join(a.run_dir, "metrics.h5"))
    ck = []
    for d in sorted(glob.glob(os.path.join(a.run_dir, "checkpoints", "step-*"))):
        m = re.search(r"step-(\d+)$", d)
        if m and os.path.exists(os.path.join(d, "drafter", "config.json")) and os.path.exists(os.path.join(d, "manifest.json")):
            ck.append((int(m.group(1)), os.path.join(d, "drafter")))
    pause = set(s for s, _ in ck) | set(int(x) for x in ev)
    secs, med = training_seconds(st, pause)
    row = {int(s): i for i, s in enumerate(st["step"])}
    snaps = []
    for s, d in ck:
        if s not in row:
            continue
        i = row[s]
        snaps.append({"trainer": a.label, "step_dir": d, "dir": d, "steps": s, "seconds": secs[i],
                      "tokens": int(st["tokens"][:i + 1].sum()), "anchors": int(st["anchors"][:i + 1].sum()),
                      "loss_recent": float(st["loss"][max(0, i - 49):i + 1].mean()),
                      "job_time_s": float(st["time_s"][i])})
    budgets = budgets_of(a.budgets)
    for s in snaps:  # the budget each snapshot stands for: the nearest
        s["budget_s"] = min(budgets, key=lambda b: abs(b - s["seconds"]))
    target_sha = None
    p = os.path.join(a.target, "train_info.json") if a.target else ""
    if p and os.path.exists(p):
        with open(p) as f:
            target_sha = json.load(f).get("weights_sha256")
    run = {"trainer": a.label, "run_dir": a.run_dir, "median_step_s": med, "steps": int(st["step"][-1]),
           "snapshots": snaps, "eval_tau": tau, "target_sha256": target_sha, "command": a.command}
    with open(a.out, "w") as f:
        json.dump(run, f, indent=2)
    for s in snaps:
        print(f"[collect] {a.label}: step {s['steps']} at {s['seconds']:.1f} s (budget {s['budget_s']:.0f}), "
              f"{s['tokens']} tokens, {s['anchors']} anchors")


def eval_name(label, snap):
    return f"{label}-step{int(snap['steps']):07d}.json"


def eval_stats(d):
    """One dflash-eval --json's tau (the mean over prompts of each prompt's mean acceptance length), its standard
    error over the prompts, and steps_tau (the mean acceptance length over every decoding step, dflash-eval's
    "over all N steps"). Greedy per-prompt means are heavy-tailed -- a prompt on which the target repeats itself
    can reach 10+ -- so two drafters' taus a standard error or two apart are not told apart by the benchmark;
    steps_tau weighs every step the same and moves less with one such prompt."""
    taus = [p["tau"] for p in d.get("prompts", []) if p.get("tau") is not None]
    acc = [x for p in d.get("prompts", []) for x in p.get("acceptance", [])]
    return {"tau": d.get("tau"), "prompts": len(taus),
            "tau_se": statistics.stdev(taus) / math.sqrt(len(taus)) if len(taus) > 1 else None,
            "steps_tau": sum(acc) / len(acc) if acc else None}


def load_eval(eval_dir, label, snap):
    """eval_stats of the snapshot's dflash-eval json, or None when it was not evaluated."""
    p = os.path.join(eval_dir, eval_name(label, snap))
    if not os.path.exists(p):
        return None
    with open(p) as f:
        return eval_stats(json.load(f))


def load_tau(eval_dir, label, snap):
    st = load_eval(eval_dir, label, snap)
    return None if st is None else st["tau"]


def paired(a, b):
    """b's tau minus a's over the prompts both decoded (the same held-out records, matched by record): the mean
    difference, its standard error, the number of prompts; and b's steps_tau over a's. a, b: dflash-eval jsons."""
    ta = {p["record"]: p["tau"] for p in a.get("prompts", []) if p.get("tau") is not None}
    tb = {p["record"]: p["tau"] for p in b.get("prompts", []) if p.get("tau") is not None}
    keys = sorted(set(ta) & set(tb))
    d = [tb[k] - ta[k] for k in keys]
    sa, sb = eval_stats(a)["steps_tau"], eval_stats(b)["steps_tau"]
    return {"diff": statistics.fmean(d) if d else None,
            "se": statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else None, "prompts": len(d),
            "steps_tau_ratio": sb / sa if sa and sb else None,
            "steps_tau_ratio_se": steps_ratio_se(a, b, keys)}


def steps_ratio_se(a, b, keys):
    """The standard error of b's steps_tau over a's, prompt by prompt (the delta method on the paired prompts
    `keys`): steps_tau is a ratio of sums over prompts (accepted tokens / steps), so the log of b's over a's
    moves with each prompt by z_i = acc_b,i / ACC_b - steps_b,i / STEPS_b - acc_a,i / ACC_a + steps_a,i / STEPS_a,
    and var(log ratio) ~ n / (n - 1) * sum z_i^2 (the z_i sum to 0). Both drafters decode the same prompts, so
    a prompt that is easy for both (the target repeating itself) moves both sums and cancels here. None below
    two prompts."""
    if len(keys) < 2:
        return None
    def sums(d):
        by = {p["record"]: p.get("acceptance", []) for p in d.get("prompts", [])}
        return [(sum(by[k]), len(by[k])) for k in keys]
    pa, pb = sums(a), sums(b)
    acc_a, n_a = sum(x for x, _ in pa), sum(n for _, n in pa)
    acc_b, n_b = sum(x for x, _ in pb), sum(n for _, n in pb)
    if not (acc_a and n_a and acc_b and n_b):
        return None
    z = [xb / acc_b - nb / n_b - xa / acc_a + na / n_a for (xa, na), (xb, nb) in zip(pa, pb)]
    ratio = (acc_b / n_b) / (acc_a / n_a)
    return ratio * math.sqrt(len(z) / (len(z) - 1) * sum(v * v for v in z))


def prompt_split(a, b, at):
    """The mean over prompts of each prompt's tau, B's against A's over the prompts both decoded: their ratio,
    and the difference (as a fraction of A's mean) split into the part from prompts whose pair mean tau
    (tau_a + tau_b) / 2 is below `at` and the part from those at or above it (high: where the target repeats
    itself and acceptance runs long). The split is on the pair's mean, not on A's tau alone: selecting prompts
    where A did well would make B look worse there by regression to the mean. a, b: dflash-eval jsons."""
    ta = {p["record"]: p["tau"] for p in a.get("prompts", []) if p.get("tau") is not None}
    tb = {p["record"]: p["tau"] for p in b.get("prompts", []) if p.get("tau") is not None}
    keys = sorted(set(ta) & set(tb))
    if not keys:
        return None
    mean_a = statistics.fmean(ta[k] for k in keys)
    high = [k for k in keys if ta[k] + tb[k] >= 2 * at]
    share = lambda ks: sum(tb[k] - ta[k] for k in ks) / len(keys) / mean_a
    return {"ratio": statistics.fmean(tb[k] for k in keys) / mean_a, "low": share(set(keys) - set(high)),
            "high": share(high), "prompts": len(keys), "high_prompts": len(high)}


def ratio_pct(r):
    """'+3.3 ± 1.2 %': steps_tau_ratio and its standard error as percent."""
    if r.get("steps_tau_ratio") is None:
        return "n/a %"
    se = r.get("steps_tau_ratio_se")
    return f"{100 * (r['steps_tau_ratio'] - 1):+.1f}" + ("" if se is None else f" ± {100 * se:.1f}") + " %"


def cmd_paired(a):
    with open(a.a) as f:
        ja = json.load(f)
    with open(a.b) as f:
        jb = json.load(f)
    r = paired(ja, jb)
    print(f"{os.path.basename(a.b)} - {os.path.basename(a.a)}: tau {fmt(r['diff'], '+.3f')} "
          f"(se {fmt(r['se'], '.3f')}, {r['prompts']} prompts paired); steps tau "
          f"{fmt(eval_stats(jb)['steps_tau'], '.3f')} vs {fmt(eval_stats(ja)['steps_tau'], '.3f')} "
          f"({ratio_pct(r)})")


def seeds(a_label, b_label, eval_dirs, split_at=4.0):
    """B's steps tau over A's in each eval dir (one training run of both per dir), matched by snapshot order (the
    k-th evaluated checkpoint of A with the k-th of B: within a run both take the same steps), and pooled over the
    dirs: rows [{"snapshot": k, "runs": [{"dir", "steps", "ratio", "se", "prompts"}], "mean", "se_runs"}], where
    mean is the mean of the runs' ratios and se_runs its standard error across the runs (None below two). The
    runs' own standard errors only say how the prompts move a ratio; se_runs also holds the training runs'
    spread, which dominates at short budgets (bench/quality/README.md "Reading the table"). Each run also
    carries by_prompt (prompt_split at split_at) and each row by_prompt_ratio / _low / _high: (mean, se_runs)
    of the per-prompt-mean measure, which weighs a prompt of 14-token acceptances as much as any other."""
    def snaps(d, label):
        out = []
        for path in glob.glob(os.path.join(d, f"{label}-step*.json")):
            m = re.fullmatch(re.escape(label) + r"-step(\d+)\.json", os.path.basename(path))
            if m:
                out.append((int(m.group(1)), path))
        return sorted(out)
    rows = {}
    for d in eval_dirs:
        sa, sb = snaps(d, a_label), snaps(d, b_label)
        for k, ((step_a, pa), (step_b, pb)) in enumerate(zip(sa, sb)):
            with open(pa) as f:
                ja = json.load(f)
            with open(pb) as f:
                jb = json.load(f)
            r = paired(ja, jb)
            split = prompt_split(ja, jb, split_at)
            if r["steps_tau_ratio"] is None or split is None:  # no prompt decoded by both
                continue
            rows.setdefault(k, []).append({"dir": d, "steps": [step_a, step_b], "ratio": r["steps_tau_ratio"],
                                           "se": r["steps_tau_ratio_se"], "prompts": r["prompts"],
                                           "by_prompt": split})
    def pooled(xs):
        return statistics.fmean(xs), statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else None
    out = []
    for k in sorted(rows):
        mean, se = pooled([x["ratio"] for x in rows[k]])
        row = {"snapshot": k, "runs": rows[k], "mean": mean, "se_runs": se}
        for key in ("ratio", "low", "high"):
            row["by_prompt_" + key] = pooled([x["by_prompt"][key] for x in rows[k]])
        out.append(row)
    return out


def cmd_seeds(a):
    rows = seeds(a.a, a.b, a.eval_dirs, a.split)
    if not rows:
        sys.exit(f"collect.py seeds: no pair of {a.a}-step*.json and {a.b}-step*.json in {' '.join(a.eval_dirs)}")
    print(f"# {a.b} / {a.a}, steps tau, per run (± over its prompts) and over the runs (± across them)")
    for r in rows:
        per = ", ".join(f"{100 * (x['ratio'] - 1):+.1f}" + ("" if x["se"] is None else f" ± {100 * x['se']:.1f}")
                        for x in r["runs"])
        pooled = f"{100 * (r['mean'] - 1):+.1f} %" + ("" if r["se_runs"] is None else
                                                      f" ± {100 * r['se_runs']:.1f} %")
        print(f"snapshot {r['snapshot'] + 1}: {len(r['runs'])} runs: {per} %; mean {pooled}")
    if a.by_prompt:
        print(f"# {a.b} / {a.a}, the mean over prompts of each prompt's tau, per run and over the runs (± across"
              f" them); its difference split: prompts whose pair mean tau is below {a.split:g} / at or above it")
        def pm(mean_se):
            m, se = mean_se
            return f"{100 * m:+.1f} %" + ("" if se is None else f" ± {100 * se:.1f} %")
        for r in rows:
            per = ", ".join(f"{100 * (x['by_prompt']['ratio'] - 1):+.1f}" for x in r["runs"])
            high = ", ".join(str(x["by_prompt"]["high_prompts"]) for x in r["runs"])
            m, se = r["by_prompt_ratio"]
            print(f"snapshot {r['snapshot'] + 1}: {per} %; mean {pm((m - 1, se))}; below {pm(r['by_prompt_low'])},"
                  f" at or above {pm(r['by_prompt_high'])} (prompts at or above per run: {high})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def at_budget(snaps, b):
    """The snapshot standing for budget b: the latest whose training seconds are within 5 % of b or below it (a calibrated rate lands a snapshot a few % late)."""
    ok = [s for s in snaps if s["seconds"] <= b * 1.05]
    return max(ok, key=lambda s: s["seconds"]) if ok else None


def time_to_reach(points, tau_goal):
    """(first snapshot seconds with tau >= goal, linear interpolation between it and the previous one)."""
    prev = (0.0, 1.0)  # an untrained drafter: tau ~ 1.0 at 0 s
    for sec, tau in points:
        if tau is not None and tau >= tau_goal:
            t0, y0 = prev
            interp = sec if tau == y0 else t0 + (tau_goal - y0) * (sec - t0) / (tau - y0)
            return sec, max(t0, min(sec, interp))
        if tau is not None:
            prev = (sec, tau)
    return None, None


def cmd_list(a):
    with open(a.run_json) as f:
        run = json.load(f)
    seen = set()
    for s in run["snapshots"]:
        n = eval_name(run["trainer"], s)
        if n not in seen:
            seen.add(n)
            print(n, s["dir"])


def cmd_layer_ids(a):
    print(",".join(str(i) for i in build_target_layer_ids(a.layers, a.draft_layers)))


def fmt(x, spec):
    return "—" if x is None else format(x, spec)


def cmd_summarise(a):
    runs = []
    for p in a.runs:
        if os.path.exists(p):
            with open(p) as f:
                runs.append(json.load(f))
        else:
            print(f"[summarise] {p} missing: left out", file=sys.stderr)
    budgets = budgets_of(a.budgets)
    for r in runs:
        for s in r["snapshots"]:
            st = load_eval(a.eval_dir, r["trainer"], s) or {}
            s["tau"], s["tau_se"], s["steps_tau"] = st.get("tau"), st.get("tau_se"), st.get("steps_tau")
    shas = {r["trainer"]: r.get("target_sha256") for r in runs}
    same_target = len(set(v for v in shas.values() if v)) <= 1
    ref = next((r for r in runs if r["trainer"] == "reference"), None)
    ours = [r for r in runs if r["trainer"] != "reference"]
    table = []
    for b in budgets:
        row = {"budget_s": b}
        for r in runs:
            s = at_budget(r["snapshots"], b) if r["trainer"] != "reference" else \
                next((x for x in r["snapshots"] if abs(x["budget_s"] - b) < 1e-6), None)
            keys = ("tau", "tau_se", "steps_tau", "seconds", "steps", "tokens", "anchors")
            row[r["trainer"]] = None if s is None else {k: s.get(k) for k in keys}
        table.append(row)
    goal = {}
    if ref is not None:
        rp = [(s["seconds"], s["tau"]) for s in ref["snapshots"] if s.get("tau") is not None]
        best = max(rp, key=lambda x: x[1]) if rp else None
        goal["reference_best_tau"] = best[1] if best else None
        goal["reference_best_seconds"] = best[0] if best else None
        for r in ours:
            name = r["trainer"]
            eq = []
            for row in table:
                o, f = row.get(name), row.get("reference")
                if o and f and o.get("tau") is not None and f.get("tau") is not None:
                    eq.append(o["tau"] >= f["tau"])
            pts = sorted((s["seconds"], s["tau"]) for s in r["snapshots"])
            first, interp = time_to_reach(pts, best[1]) if best else (None, None)
            goal[name] = {
                "tau_ge_reference_at_every_budget": all(eq) if eq else None,
                "budgets_compared": len(eq),
                "seconds_to_reference_best": first, "seconds_to_reference_best_interpolated": interp,
                "two_thirds_of_reference_seconds": best[0] * 2 / 3 if best else None,
                "reaches_in_two_thirds": (interp is not None and interp <= best[0] * 2 / 3) if best else None,
            }
    target_info = None
    if a.target_info and os.path.exists(a.target_info):
        with open(a.target_info) as f:
            target_info = json.load(f)
        # dflash-eval ran with the target there now: a run trained on an earlier build of it does not compare
        shas["evaluated with"] = target_info.get("weights_sha256")
        same_target = len(set(v for v in shas.values() if v)) <= 1
    res = {"budgets_s": budgets, "table": table, "goal": goal, "same_target": same_target, "target_sha256": shas,
           "target": target_info, "runs": runs}
    with open(a.out_json, "w") as f:
        json.dump(res, f, indent=2)

    names = [r["trainer"] for r in runs]
    md = ["| budget (s) | " + " | ".join(f"τ {n}" for n in names) + " | " +
          " | ".join(f"{n}: s / steps / tokens / anchors" for n in names) + " |",
          "| ---: | " + " | ".join("---:" for _ in names) + " | " + " | ".join("---:" for _ in names) + " |"]
    def tau_cell(c):
        if not c or c.get("tau") is None:
            return "—"
        return f"{c['tau']:.3f}" + ("" if c.get("tau_se") is None else f" ± {c['tau_se']:.3f}")
    for row in table:
        cells = [tau_cell(row.get(n)) for n in names]
        info = []
        for n in names:
            c = row.get(n)
            info.append("—" if not c else f"{c['seconds']:.0f} / {c['steps']} / {c['tokens'] / 1e6:.2f} M / "
                                          f"{c['anchors'] / 1e6:.2f} M")
        md.append(f"| {row['budget_s']:.0f} | " + " | ".join(cells) + " | " + " | ".join(info) + " |")
    md.append("")
    md.append("τ: the mean over prompts of each prompt's mean acceptance length ± its standard error over the prompts. "
              "The mean acceptance length over every decoding step (steps τ):")
    md.append("")
    md.append("| budget (s) | " + " | ".join(f"steps τ {n}" for n in names) + " |")
    md.append("| ---: | " + " | ".join("---:" for _ in names) + " |")
    for row in table:
        md.append(f"| {row['budget_s']:.0f} | " +
                  " | ".join(fmt((row.get(n) or {}).get("steps_tau"), ".3f") for n in names) + " |")
    md.append("")
    if goal.get("reference_best_tau") is not None:
        md.append(f"Reference best τ {goal['reference_best_tau']:.3f} at {goal['reference_best_seconds']:.0f} s "
                  f"(2/3 of it: {goal['reference_best_seconds'] * 2 / 3:.0f} s).")
        for n in names:
            if n == "reference":
                continue
            g = goal[n]
            md.append(f"- {n}: τ ≥ reference at every budget: {g['tau_ge_reference_at_every_budget']} "
                      f"({g['budgets_compared']} budgets); reaches the reference's best τ at "
                      f"{fmt(g['seconds_to_reference_best'], '.0f')} s (first snapshot), "
                      f"{fmt(g['seconds_to_reference_best_interpolated'], '.0f')} s (interpolated): within 2/3 "
                      f"of the reference's time: {g['reaches_in_two_thirds']}")
    if ref is not None:  # the same held-out prompts under each drafter: their differences vary far less than tau
        lines = []
        for row in table:
            rc = row.get("reference")
            for n in names:
                c = row.get(n)
                if n == "reference" or not c or not rc or c.get("tau") is None or rc.get("tau") is None:
                    continue
                jr, jo = (os.path.join(a.eval_dir, eval_name(t, x)) for t, x in (("reference", rc), (n, c)))
                with open(jr) as f:
                    er = json.load(f)
                with open(jo) as f:
                    eo = json.load(f)
                pr = paired(er, eo)
                lines.append(f"- {row['budget_s']:.0f} s, {n}: τ {fmt(pr['diff'], '+.3f')} ± {fmt(pr['se'], '.3f')} "
                             f"({pr['prompts']} prompts), steps τ {ratio_pct(pr)}")
        if lines:
            md += ["", "Against the reference, prompt by prompt (the difference ± its standard error):"] + lines
    md.append(f"\nSame target weights in every run: {same_target}.")
    with open(a.out_md, "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rate")
    p.add_argument("metrics")
    p.add_argument("--all", action="store_true", help="also tokens/s and anchors/s (the speed stage)")
    p = sub.add_parser("plan")
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--budgets", required=True)
    p = sub.add_parser("ours")
    p.add_argument("run_dir")
    p.add_argument("--budgets", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--target", default="")
    p.add_argument("--command", default="")
    p = sub.add_parser("list")
    p.add_argument("run_json")
    p = sub.add_parser("layer-ids")
    p.add_argument("layers", type=int)
    p.add_argument("draft_layers", type=int)
    p = sub.add_parser("paired")
    p.add_argument("a", help="dflash-eval --json of one drafter")
    p.add_argument("b", help="dflash-eval --json of another, on the same prompts")
    p = sub.add_parser("seeds")
    p.add_argument("a", help="the baseline drafter's label (ours-a)")
    p.add_argument("b", help="the other drafter's label (ours-e)")
    p.add_argument("eval_dirs", nargs="+", help="one eval dir per training run (WORK/eval of each seed)")
    p.add_argument("--json", default="")
    p.add_argument("--by-prompt", action="store_true",
                   help="also the mean over prompts of each prompt's tau, its difference split at --split")
    p.add_argument("--split", type=float, default=4.0, help="the pair mean tau that splits the prompts (4)")
    p = sub.add_parser("summarise")
    p.add_argument("--target-info", default="")
    p.add_argument("--runs", nargs="+", required=True)
    p.add_argument("--eval-dir", required=True)
    p.add_argument("--budgets", required=True)
    p.add_argument("--out-json", required=True)
    p.add_argument("--out-md", required=True)
    a = ap.parse_args()
    {"rate": cmd_rate, "plan": cmd_plan, "ours": ours_snapshots, "list": cmd_list, "layer-ids": cmd_layer_ids,
     "paired": cmd_paired, "seeds": cmd_seeds, "summarise": cmd_summarise}[a.cmd](a)


if __name__ == "__main__":
    main()
