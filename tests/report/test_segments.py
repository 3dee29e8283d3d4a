#!/usr/bin/env python3
"""dflash-report on runs whose split changed (issue 30): metrics.h5's segment table (/segments, /ranks/segment,
the previous split's /queues and /gpus under /segments/K), written here with h5py in the layout of
docs/metrics.md "Segments". The what-if, service rates and verdict come from the last segment only; the
SEGMENTS section lists every job start; the verdict's switch steps (text and --json). Run: python3 -m unittest
discover -s tests/report (tests/e2e/test_report_py.sh).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

SRC = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
REPORT = os.path.join(SRC, "tools", "dflash-report")
sys.path.insert(0, os.path.join(SRC, "tools"))

from dflash_report import analysis, compare, render  # noqa: E402
from dflash_report.load import Run  # noqa: E402

DT = 10.0  # s per report interval
START_UNIX = 1796119200.0  # 2026-12-01T10:00:00Z


def write_segments_run(path, segs, ranks=8, backend="cuda", power=True, table=True, rank_segment=True, pre=0):
    """A run of several job starts. segs: [{topology, t_s, d_s (busy s per batch of a target / drafter), kind
    (0 start, 1 resume, 2 resplit), first_step (default: where the segment before ended), intervals (report
    intervals of 10 s; 0: the segment reported none yet)}]. Each segment's clocks restart at 0 and its /ranks
    intervals count from 0; a resume drops the /steps rows after its first_step. table=False: a file written
    before the segment table (no /segments, no /ranks/segment); rank_segment=False: no /ranks/segment only;
    pre=n: the first n segments were written by a build before the table (a file it resumes): no /segments row,
    /ranks/segment -1."""
    steps, times, tokens = [], [], []
    cols = {k: [] for k in ("interval", "time_s", "rank", "role", "batches", "busy_s", "wait_s", "compute_s",
                            "credit_wait_s", "data_wait_s", "allreduce_s", "optimizer_s", "segment")}
    rows_table, done, unix = [], 0, START_UNIX
    for k, sg in enumerate(segs):
        T, D = (int(x) for x in sg["topology"].split("-"))
        rate = min(T / sg["t_s"], D / sg["d_s"])  # the pipeline's batches per second
        n_iv = sg.get("intervals", 6)
        n_steps = int(round(rate * DT * n_iv / D))
        first = sg["first_step"] if sg.get("first_step") is not None else done
        keep = [i for i, s in enumerate(steps) if s <= first]
        steps, times, tokens = [steps[i] for i in keep], [times[i] for i in keep], [tokens[i] for i in keep]
        for j in range(n_steps):
            steps.append(first + j + 1)
            times.append((j + 1) * DT * n_iv / n_steps)
            tokens.append(500 * D)  # a step: one batch of 500 tokens per drafter
        done = first + n_steps
        roles = [0] * T + [1] * D + [2] * (ranks - T - D)
        for i in range(n_iv):
            for r in range(ranks):
                role = roles[r]
                n = int(round(rate * DT / (T if role == 0 else D))) if role < 2 else 0
                busy = n * (sg["t_s"] if role == 0 else sg["d_s"]) if role < 2 else 0.0
                wait = max(0.0, DT - busy)
                row = dict(interval=i, time_s=(i + 1) * DT, rank=r, role=role, batches=n, busy_s=busy, wait_s=wait,
                           compute_s=busy if role == 0 else 0.8 * busy, credit_wait_s=wait if role == 0 else 0.0,
                           data_wait_s=wait if role == 1 else 0.0, allreduce_s=0.0,
                           optimizer_s=0.2 * busy if role == 1 else 0.0, segment=k - pre if k >= pre else -1)
                for key, v in row.items():
                    cols[key].append(v)
        if k >= pre:
            rows_table.append(dict(first_step=first, kind=sg["kind"], nodes=1, targets_per_node=T,
                                   drafters_per_node=D, world_size=ranks, grad_accum=1, unix_time_s=unix))
        unix += DT * n_iv + 60.0
    last = segs[-1]
    T, D = (int(x) for x in last["topology"].split("-"))
    with h5py.File(path, "w") as f:
        f.attrs["topology"] = last["topology"]  # always the latest segment's split
        f.attrs["backend"] = backend
        f.attrs["num_nodes"] = 1
        f.attrs["gpus_per_node"] = ranks
        f.attrs["format_version"] = 2
        f.attrs["options"] = json.dumps({"hs-queue-depth": "4", "prefetch-depth": "4", "token-budget": "512",
                                         "epochs": "1", "max-steps": str(done * 2)})
        names = ["target"] * T + ["drafter"] * D + ["idle"] * (ranks - T - D)
        f.attrs["ranks"] = json.dumps([{"rank": r, "role": names[r], "host": "h", "gpu": r, "pid": 1}
                                       for r in range(ranks)])
        s = f.create_group("steps")
        n = len(steps)
        s["step"] = np.asarray(steps, dtype=np.int64)
        s["time_s"] = np.asarray(times, dtype=float)
        s["loss"] = np.linspace(6.0, 4.0, n)
        s["acc"] = np.linspace(0.02, 0.12, n)
        s["streak"] = np.linspace(0.1, 0.6, n)
        s["tokens"] = np.asarray(tokens, dtype=np.int64)
        for key in ("agree", "lr", "noise", "grad_norm"):
            s[key] = np.zeros(n)
        g = f.create_group("ranks")
        for key, v in cols.items():
            if key == "segment" and not (table and rank_segment):
                continue
            g[key] = np.asarray(v, dtype=np.float64 if key.endswith("_s") else np.int64)
        if table:
            sg = f.create_group("segments")
            for key in rows_table[0]:
                sg[key] = np.asarray([row[key] for row in rows_table],
                                     dtype=np.float64 if key == "unix_time_s" else np.int64)

        def samples(parent, T, D, n_iv, watts):
            q = parent.create_group("queues")
            q["time_s"] = np.arange(1, n_iv + 1) * DT
            q["q_pre"] = np.full((n_iv, T), 4, dtype=np.int32)
            q["q_hs"] = np.full((n_iv, D), 4 if D == 1 else 0, dtype=np.int32)
            gp = parent.create_group("gpus")
            gp.attrs["available"] = 1 if power else 0
            if power:
                gp["time_s"] = np.arange(1, n_iv + 1) * DT
                gp["power_w"] = np.tile(np.array([[watts[0]] * T + [watts[1]] * D]), (n_iv, 1))
            else:
                gp.attrs["reason"] = "CPU backend: no NVML"

        # /queues and /gpus hold the current split's samples; the previous split's moved to /segments/K
        first_of_split = 0
        for k in range(1, len(segs)):
            if segs[k]["topology"] != segs[k - 1]["topology"]:
                if table:
                    Tp, Dp = (int(x) for x in segs[k - 1]["topology"].split("-"))
                    samples(f["segments"].create_group(str(max(0, first_of_split - pre))), Tp, Dp,
                            max(1, segs[k - 1].get("intervals", 6)), (700.0, 650.0))
                first_of_split = k
        samples(f, T, D, max(1, last.get("intervals", 6)), (600.0, 500.0))
        if power:
            f.attrs["gpu_ranks"] = json.dumps(list(range(T + D)))
            f.attrs["gpu_idle_power_w"] = 80.0
    return path


# 7-1 (targets 7 s per batch, drafter 0.9 s): target-bound at 1 b/s, then resumed on 7-1, then resplit to 6-2 on
# other service times (targets 4 s, drafters 2 s): drafter-bound at 1 b/s. From the 6-2 times the best is 5-3
# (min(5/4, 3/2) = 1.25 b/s, +25%); from the 7-1 times it would be 7-1: a report that mixed them would say so.
SEG_7_1 = dict(topology="7-1", t_s=7.0, d_s=0.9, kind=0)
SEG_7_1_RESUME = dict(topology="7-1", t_s=7.0, d_s=0.9, kind=1, first_step=50)
SEG_6_2 = dict(topology="6-2", t_s=4.0, d_s=2.0, kind=2)


def report(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=120)


class SegmentsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        run = os.path.join(self.dir, name)
        os.makedirs(run, exist_ok=True)
        return os.path.join(run, "metrics.h5")

    def resplit(self, name="resplit", **kw):
        return write_segments_run(self.path(name), [SEG_7_1, SEG_7_1_RESUME, SEG_6_2], **kw)

    def test_the_whatif_uses_the_last_segment_only(self):
        run = Run(self.resplit())
        self.assertEqual(run.topology, "6-2")
        self.assertEqual(run.report_segment, 2)
        rep = analysis.analyse(run)
        self.assertEqual(rep["run"]["topology"], "6-2")
        self.assertEqual(rep["run"]["segment"], 2)
        # the 6-2 segment's service times, not a mean with the 7-1 ones (7 s, 0.9 s)
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 4.0)
        self.assertAlmostEqual(rep["service"]["drafter"]["s_per_batch"], 2.0)
        self.assertEqual(rep["service"]["target"]["ranks"], 6)
        self.assertEqual(rep["service"]["drafter"]["ranks"], 2)
        self.assertAlmostEqual(rep["measurements"]["target_s_per_batch"], 4.0)
        self.assertAlmostEqual(rep["measurements"]["drafter_s_per_batch"], 2.0)
        w = {x["split"]: x for x in rep["whatif"]}
        self.assertAlmostEqual(w["6-2"]["batches_per_s"], 1.0)
        self.assertAlmostEqual(w["5-3"]["batches_per_s"], 1.25)
        self.assertAlmostEqual(w["5-3"]["vs_run_frac"], 0.25)
        self.assertAlmostEqual(w["7-1"]["batches_per_s"], 0.5)  # one drafter at 2 s per batch
        self.assertEqual(rep["best"], "5-3")
        self.assertAlmostEqual(rep["observed"]["batches_per_s"], 1.0)
        self.assertAlmostEqual(rep["observed"]["ktok_per_s"], 0.5)  # 1 b/s x 500 tokens: no 7-1 steps mixed in
        self.assertAlmostEqual(rep["run"]["tokens_per_batch"], 500.0)
        # the power of the 6-2 GPUs (/gpus), not the 7-1 split's (moved to /segments/0/gpus)
        self.assertAlmostEqual(rep["power"]["target_w"], 600.0)
        self.assertAlmostEqual(rep["power"]["drafter_w"], 500.0)
        self.assertIn("Switch to 5-3", rep["verdict"])
        self.assertTrue(rep["verdict"].startswith("6-2 runs at 1.00 b/s"))

    def test_segments_rows(self):
        rep = analysis.analyse(Run(self.resplit()))
        segs = rep["segments"]
        self.assertEqual([e["kind_name"] for e in segs], ["start", "resume", "resplit"])
        self.assertEqual([e["topology"] for e in segs], ["7-1", "7-1", "6-2"])
        self.assertEqual([e["measured"] for e in segs], [False, False, True])
        # steps: segment 0 ran 1..60 but was resumed from step 50; segment 1: 51..110; segment 2: 111..140
        self.assertEqual([(e["from_step"], e["to_step"], e["steps"]) for e in segs],
                         [(1, 50, 50), (51, 110, 60), (111, 140, 30)])
        self.assertEqual([e["wall_s"] for e in segs], [60.0, 60.0, 60.0])
        self.assertEqual(rep["run"]["elapsed_s"], 180.0)  # each segment's clock, one after the other
        self.assertEqual([e["report_intervals"] for e in segs], [6, 6, 6])
        for e, (t, d) in zip(segs, ((7.0, 0.9), (7.0, 0.9), (4.0, 2.0))):
            self.assertAlmostEqual(e["target_s_per_batch"], t)
            self.assertAlmostEqual(e["drafter_s_per_batch"], d)
            self.assertAlmostEqual(e["batches_per_s"], 1.0)
        self.assertEqual(segs[0]["start_utc"], "2026-12-01T10:00:00Z")
        self.assertEqual(segs[2]["grad_accum"], 1)
        txt = render.text(rep)
        self.assertIn("SEGMENTS (3 job starts in this file", txt)
        lines = txt.splitlines()
        head = lines.index(next(x for x in lines if x.startswith("SEGMENTS")))
        self.assertEqual(lines[head + 1].split(), ["seg", "kind", "split", "nodes", "steps", "wall", "trained", "b/s",
                                                   "target", "s/batch", "drafter", "s/batch"])
        self.assertEqual(lines[head + 2].split(), ["0", "start", "7-1", "1", "1..50", "1m", "1.000", "7.000", "0.900"])
        self.assertEqual(lines[head + 3].split(), ["1", "resume", "7-1", "1", "51..110", "1m", "1.000", "7.000",
                                                   "0.900"])
        self.assertEqual(lines[head + 4].split(), ["*", "2", "resplit", "6-2", "1", "111..140", "1m", "1.000", "4.000",
                                                   "2.000"])
        # fixed width: the columns line up
        self.assertEqual(len({len(lines[head + i].rstrip()) for i in (2, 3, 4)}), 1)
        self.assertIn("the verdict uses the last segment only (segment 2, 6-2 on 1 node(s) x 8 GPUs)",
                      lines[head + 5])
        self.assertLess(head, lines.index("OBSERVED PIPELINE"))

    def test_json_segments_and_switch(self):
        p = self.resplit()
        r = report(p, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)

        def refuse(name):
            raise ValueError(f"{name} in the JSON")
        rep = json.loads(r.stdout, parse_constant=refuse)
        self.assertEqual(len(rep["segments"]), 3)
        self.assertEqual(rep["segments"][2]["kind"], 2)
        sw = rep["switch"]
        run_dir = os.path.dirname(os.path.abspath(p))
        self.assertEqual(sw["to"], "5-3")
        self.assertEqual(sw["from"], "6-2")
        self.assertAlmostEqual(sw["gain"], 0.25)
        self.assertEqual(sw["heading"], 'To switch to 5-3 without losing the run (docs/checkpoint.md "Changing the '
                                        'split"):')
        self.assertEqual(sw["steps"], [
            f"jobs/mpirun/train.sh:  echo 5-3 > {run_dir}/next-topology; kill -USR1 <train.sh pid>   -> checkpoint, "
            "exit 75; then run the same train.sh command again",
            "plain mpirun:          kill -USR1 <mpirun pid>   -> checkpoint, exit 75; then the same command with "
            "--topology 5-3 --resume auto",
            f"Slurm (jobs/slurm):    echo 5-3 > {run_dir}/next-topology; scancel --signal=USR1 --batch JOBID   -> "
            "checkpoint, requeue, restart on 5-3",
        ])
        txt = report(p).stdout
        tail = txt[txt.index("VERDICT"):].splitlines()
        at = tail.index("  " + sw["heading"])
        self.assertEqual(tail[at + 1:at + 4], ["    " + x for x in sw["steps"]])

    def test_no_switch_when_keeping_the_split(self):
        # 6-2 on times where 6-2 is the best: no steps, "switch": null
        p = write_segments_run(self.path("keep"), [SEG_7_1, dict(topology="6-2", t_s=5.0, d_s=1.5, kind=2)])
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["best"], "6-2")
        self.assertIsNone(rep["switch"])
        self.assertNotIn("To switch", render.text(rep))
        self.assertIsNone(json.loads(report(p, "--json").stdout)["switch"])

    def test_switch_to_colocated_with_autos_overlap(self):
        # 6-2 (targets 4 s, drafters 2 s per batch): 1 b/s. --topology auto measured a colocated overlap of 1 (the
        # step hides under the forward) and a colocated rank fits: 8 / (4 + 2 - 1 x 2) = 2 b/s, the best of all.
        p = write_segments_run(self.path("coloc"), [dict(topology="6-2", t_s=4.0, d_s=2.0, kind=0)])
        with h5py.File(p, "a") as f:
            f.attrs["auto_topology"] = json.dumps({"chosen": "6-2", "measurements": {"colocated_overlap": 1.0},
                                                   "whatif": [{"split": "6-2", "batches_per_s": 1.0}]})
            f.attrs["colocated_fit"] = json.dumps({"fit": "fits", "why": "20.0 GiB fixed within the GPU's 80.0 GiB"})
        rep = analysis.analyse(Run(p))
        w = {x["split"]: x for x in rep["whatif"]}
        self.assertAlmostEqual(w["colocated"]["batches_per_s"], 2.0)
        self.assertEqual(w["colocated"]["layout"], "colocated")
        self.assertEqual(rep["best"], "colocated")
        self.assertEqual(rep["colocated"]["overlap_source"], "--topology auto's colocated phase at the run's start")
        self.assertIn("Switch to colocated: predicted 2.00 b/s (+100%)", rep["verdict"])
        sw = rep["switch"]
        self.assertEqual((sw["to"], sw["from"]), ("colocated", "6-2"))
        self.assertIn("echo colocated > ", sw["steps"][0])
        self.assertIn("--topology colocated --resume auto", sw["steps"][1])
        self.assertIn("colocated: overlap +1.00 of the shorter role", render.text(rep))
        # Known not to fit: shown, never recommended, and the verdict says why.
        with h5py.File(p, "a") as f:
            f.attrs["colocated_fit"] = json.dumps({"fit": "does not fit", "why": "90.0 GiB fixed over the GPU's 80.0 GiB"})
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["best"], "5-3")
        self.assertIn("a colocated rank does not fit (90.0 GiB fixed over the GPU's 80.0 GiB): not a candidate",
                      rep["verdict"])
        # No overlap measured (no --topology auto): predicted with o = 0, 8 / 6 b/s, shown, not recommended.
        with h5py.File(p, "a") as f:
            del f.attrs["auto_topology"]
            del f.attrs["colocated_fit"]
        rep = analysis.analyse(Run(p))
        self.assertAlmostEqual({x["split"]: x for x in rep["whatif"]}["colocated"]["batches_per_s"], 8 / 6)
        self.assertEqual(rep["best"], "5-3")
        self.assertEqual(rep["colocated"]["fit"], "unknown")
        self.assertIn("their overlap was not measured: not a recommendation", rep["verdict"])

    def test_switch_within_a_power_budget(self):
        # 5-3 draws 5 x 600 + 3 x 500 = 4.5 kW, the run's 6-2 4.6 kW: within 4.5 kW the best is 5-3, within 4.2 kW
        # it is 5-2 at 4.08 kW (1.0 b/s: +0%, no gain worth a restart: no steps)
        p = self.resplit()
        rep = analysis.analyse(Run(p), power_budget_w=4500)
        self.assertEqual(rep["best_within_budget"], "5-3")
        self.assertEqual(rep["switch"]["to"], "5-3")
        self.assertEqual(rep["switch"]["within_power_budget"], 4500)
        rep = analysis.analyse(Run(p), power_budget_w=4200)
        self.assertNotEqual(rep["best_within_budget"], "5-3")
        self.assertIsNone(rep["switch"])

    def test_switch_steps_with_another_node_count(self):
        heading, steps = analysis.switch_steps("/runs/a/metrics.h5", "6-2", nodes=2, nodes_to=4, gpus_per_node=8)
        self.assertIn("6-2", heading)
        self.assertIn("sbatch --nodes=4", steps[2])
        self.assertIn("the node count comes from Slurm", steps[2])
        self.assertIn("file overrides --topology: put 6-2 in it or delete it", steps[2])
        self.assertIn("on 4 node(s) (-np 32) with --topology 6-2 --resume auto", steps[1])
        # a run directory with a space is quoted for the shell
        _, steps = analysis.switch_steps("/runs/my run/metrics.h5", "6-2", nodes=1)
        self.assertIn("echo 6-2 > '/runs/my run/next-topology';", steps[0])

    def test_distorted_timings_give_no_switch(self):
        p = write_segments_run(self.path("cpu"), [dict(topology="1-1", t_s=0.2, d_s=1.0, kind=0),
                                                  dict(topology="2-1", t_s=0.2, d_s=1.0, kind=2)],
                               ranks=4, backend="cpu", power=False)
        with h5py.File(p, "a") as f:
            f.attrs["host_cpu_cores"] = 2
        rep = analysis.analyse(Run(p))
        self.assertTrue(rep["oversubscription"]["run_distorted"])
        self.assertIsNone(rep["switch"])

    def test_a_new_split_without_a_report_interval_gives_no_verdict(self):
        # right after the resplit: the 6-2 segment has written no /ranks row yet; the 7-1 times say nothing of it
        p = write_segments_run(self.path("young"), [SEG_7_1, dict(SEG_6_2, intervals=0)])
        r = report(p)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("the last segment, 1 (resplit to 6-2 on 1 node(s) from step 60), has written no report "
                      "interval yet", r.stderr)
        # a resume on the same split is measured on the segment before it (as older files always were)
        p = write_segments_run(self.path("young2"), [SEG_7_1, dict(SEG_7_1_RESUME, intervals=0)])
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["run"]["segment"], 0)
        self.assertIn("segment 1 has no report interval yet: measured on segment 0", rep["run"]["segment_note"])
        self.assertIn("segment 1 has no report interval yet", render.text(rep))
        self.assertEqual(rep["segments"][1]["report_intervals"], 0)
        self.assertEqual(rep["segments"][1]["first_step"], 50)

    def test_older_files_use_the_interval_rule(self):
        # no /segments: the last segment by /ranks' interval restarting at 0, the split from the root attribute,
        # no SEGMENTS section, "segments": null
        p = write_segments_run(self.path("old"), [SEG_7_1, SEG_7_1_RESUME], table=False)
        run = Run(p)
        self.assertIsNone(run.segments)
        self.assertEqual(run.segment_source, "interval restarts")
        self.assertEqual(run.report_segment, 1)
        self.assertEqual(len(run.report_rows), 6 * 8)
        rep = analysis.analyse(run)
        self.assertIsNone(rep["segments"])
        self.assertIsNone(rep["run"]["segment"])
        self.assertNotIn("SEGMENTS", render.text(rep))
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 7.0)
        # only the last segment's steps count for the observed tokens (their clock restarts)
        self.assertAlmostEqual(rep["observed"]["ktok_per_s"], 0.5)
        # a table without /ranks/segment: the interval rule maps the rows when it finds as many segments
        p = self.resplit("norankseg", rank_segment=False)
        run = Run(p)
        self.assertEqual(run.segment_source, "interval restarts")
        rep = analysis.analyse(run)
        self.assertEqual(rep["run"]["topology"], "6-2")
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 4.0)
        self.assertEqual([e["target_s_per_batch"] for e in rep["segments"]], [7.0, 7.0, 4.0])

    def test_a_file_of_an_earlier_build_resumed_on_another_split(self):
        # 7-1 started and resumed by a build without the table, then resumed on 6-2 by one with it: /segments
        # has one row (the resplit), /ranks/segment is -1 over the earlier rows
        p = write_segments_run(self.path("pre"), [SEG_7_1, SEG_7_1_RESUME, SEG_6_2], pre=2)
        run = Run(p)
        self.assertEqual(len(run.segments), 1)
        self.assertEqual([len(x) for x in run.pre_segments], [48, 48])
        self.assertEqual(run.report_segment, 0)
        rep = analysis.analyse(run)
        self.assertEqual(rep["run"]["topology"], "6-2")
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 4.0)
        self.assertEqual(rep["best"], "5-3")
        segs = rep["segments"]
        self.assertEqual([(e["index"], e["kind_name"], e["topology"], e["pre_table"], e["measured"]) for e in segs],
                         [(None, "start", "7-1", True, False), (None, "resume", "7-1", True, False),
                          (0, "resplit", "6-2", False, True)])
        self.assertEqual([(e["from_step"], e["to_step"]) for e in segs], [(1, 50), (51, 110), (111, 140)])
        self.assertEqual([e["target_s_per_batch"] for e in segs], [7.0, 7.0, 4.0])
        txt = render.text(rep)
        rows = [x.split() for x in txt.splitlines()]
        self.assertIn(["-", "start", "7-1", "1", "1..50", "1m", "1.000", "7.000", "0.900"], rows)
        self.assertIn(["*", "0", "resplit", "6-2", "1", "111..140", "1m", "1.000", "4.000", "2.000"], rows)
        self.assertIn("- = written before the segment table", txt)
        # the same, resumed on 7-1 and not reported yet: measured on the last segment before the table
        p = write_segments_run(self.path("pre2"), [SEG_7_1, dict(SEG_7_1_RESUME, intervals=0)], pre=1)
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["run"]["topology"], "7-1")
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 7.0)
        self.assertIn("measured on the segment before the segment table", rep["run"]["segment_note"])
        self.assertEqual([e["measured"] for e in rep["segments"]], [True, False])
        self.assertIn("the verdict uses the last segment only (the last segment before the table, 7-1",
                      render.text(rep))
        # ... and resplit, not reported yet: no verdict
        p = write_segments_run(self.path("pre3"), [SEG_7_1, dict(SEG_6_2, intervals=0)], pre=1)
        r = report(p)
        self.assertEqual(r.returncode, 3)
        self.assertIn("has written no report interval yet", r.stderr)

    def test_one_segment_prints_no_section(self):
        p = write_segments_run(self.path("one"), [SEG_7_1])
        rep = analysis.analyse(Run(p))
        self.assertEqual(len(rep["segments"]), 1)
        self.assertNotIn("SEGMENTS", render.text(rep))

    def test_the_split_comes_from_the_table(self):
        # the root attribute is the latest split; were it missing or stale, the last /segments row still says it
        p = self.resplit("stale")
        with h5py.File(p, "a") as f:
            f.attrs["topology"] = "7-1"
        self.assertEqual(Run(p).topology, "6-2")
        with h5py.File(p, "a") as f:
            del f.attrs["topology"]
        self.assertEqual(Run(p).topology, "6-2")
        # a damaged table: exit 3 naming it
        with h5py.File(p, "a") as f:
            f["segments/drafters_per_node"][2] = 0
        r = report(p)
        self.assertEqual(r.returncode, 3)
        self.assertIn("/segments/drafters_per_node[2] = 0 is not in 1..1024", r.stderr)

    def test_a_table_row_not_flushed_yet(self):
        # the series of /segments may differ in length by one row (a flush between them): the rows all have
        p = self.resplit("short")
        with h5py.File(p, "a") as f:
            kind = f["segments/kind"][:2]
            del f["segments/kind"]
            f["segments/kind"] = kind
        run = Run(p)
        self.assertEqual(len(run.segments), 2)
        self.assertEqual(run.report_segment, 2)  # /ranks/segment names it: its split from the root attribute
        rep = analysis.analyse(run)
        self.assertEqual(rep["run"]["topology"], "6-2")
        self.assertEqual(rep["segments"][2]["kind_name"], "?")
        self.assertAlmostEqual(rep["service"]["target"]["s_per_batch"], 4.0)

    def test_side_by_side_uses_the_last_segment(self):
        a = write_segments_run(self.path("a"), [SEG_7_1])
        b = self.resplit("b")
        r = report(a, b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmp_ = json.loads(r.stdout)
        self.assertEqual([c["topology"] for c in cmp_["runs"]], ["7-1", "6-2"])
        self.assertEqual([c["segments"] for c in cmp_["runs"]], [1, 3])
        self.assertEqual([c["targets_per_node"] for c in cmp_["runs"]], [7, 6])
        self.assertAlmostEqual(cmp_["runs"][1]["target_s_per_batch"], 4.0)
        self.assertAlmostEqual(cmp_["runs"][1]["drafter_s_per_batch"], 2.0)
        text = compare.text(compare.compare([(Run(p), analysis.analyse(Run(p))) for p in (a, b)]))
        self.assertRegex(text, r"segments +1 +3")

    def test_png_of_a_resplit_run(self):
        from dflash_report import dashboard
        p = self.resplit()
        run = Run(p)
        png = os.path.join(self.dir, "r.png")
        dashboard.write_png(run, analysis.analyse(run), png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
