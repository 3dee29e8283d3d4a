#!/usr/bin/env python3
"""Unit tests of dflash-report (tools/dflash_report) on small metrics files written here with h5py in the
layout of docs/metrics.md: the CPU wording, oversubscription, --json's schema_version, several runs side by
side, --version, the dashboard. Run: python3 -m unittest discover -s tests/report (tests/e2e/test_report_py.sh).
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


def write_run(path, topology="2-1", backend="cpu", ranks=4, cores=None, t_s=0.5, d_s=0.25, intervals=6,
              power=False, seed=0, anchors=0, options=None):
    """A run of `intervals` report intervals of 10 s: targets busy t_s s per batch, drafters d_s, with the
    pipeline running at the slower side's rate (a step = one batch per drafter, 500 tokens per batch); loss
    falling, acc rising; idle ranks past T + D."""
    rng = np.random.default_rng(seed)
    T, D = (int(x) for x in topology.split("-"))
    rate = min(T / t_s, D / d_s)  # batches per second of the pipeline
    dt = 10.0
    steps = int(round(rate * dt * intervals / D))
    with h5py.File(path, "w") as f:
        f.attrs["topology"] = topology
        f.attrs["backend"] = backend
        f.attrs["num_nodes"] = 1
        f.attrs["gpus_per_node"] = ranks
        f.attrs["format_version"] = 1
        f.attrs["options"] = json.dumps({"hs-queue-depth": "4", "prefetch-depth": "4", "token-budget": "512",
                                         "epochs": "1", "max-steps": str(steps * 2), **(options or {})})
        roles = ["target"] * T + ["drafter"] * D + ["idle"] * (ranks - T - D)
        f.attrs["ranks"] = json.dumps([{"rank": r, "role": roles[r], "host": "h", "gpu": -1, "pid": 1}
                                       for r in range(ranks)])
        if cores:
            f.attrs["host_cpu_cores"] = cores
        s = f.create_group("steps")
        step = np.arange(1, steps + 1)
        s["step"] = step
        s["time_s"] = step * (dt * intervals / steps)
        s["loss"] = 6.0 - 2.0 * step / steps + 0.3 * rng.standard_normal(steps)
        s["acc"] = 0.02 + 0.1 * step / steps
        s["streak"] = 0.1 + 0.5 * step / steps
        s["tokens"] = np.full(steps, 500 * D)
        for k in ("agree", "lr", "noise", "grad_norm"):
            s[k] = np.zeros(steps)
        s["anchors"] = np.full(steps, anchors * D)  # the step's anchors over all drafters
        cols = {k: [] for k in ("interval", "time_s", "rank", "role", "batches", "busy_s", "wait_s", "compute_s",
                                "credit_wait_s", "data_wait_s", "allreduce_s", "optimizer_s")}
        for i in range(intervals):
            for r in range(ranks):
                role = {"target": 0, "drafter": 1, "idle": 2}[roles[r]]
                n = rate * dt / (T if role == 0 else D) if role < 2 else 0
                busy = n * (t_s if role == 0 else d_s) if role < 2 else 0.0
                row = dict(interval=i, time_s=(i + 1) * dt, rank=r, role=role, batches=int(round(n)), busy_s=busy,
                           wait_s=dt - busy, compute_s=busy if role == 0 else 0.8 * busy,
                           credit_wait_s=(dt - busy) if role == 0 else 0.0,
                           data_wait_s=(dt - busy) if role == 1 else 0.0, allreduce_s=0.0,
                           optimizer_s=0.2 * busy if role == 1 else 0.0)
                for k, v in row.items():
                    cols[k].append(v)
        g = f.create_group("ranks")
        for k, v in cols.items():
            g[k] = np.asarray(v)
        q = f.create_group("queues")
        q["time_s"] = np.arange(1, intervals + 1) * dt
        q["q_pre"] = np.full((intervals, T), 4)
        q["q_hs"] = np.tile(np.array([[4], [3], [0], [4], [2], [4]])[:intervals], (1, D))
        gp = f.create_group("gpus")
        gp.attrs["available"] = 1 if power else 0
        if power:
            gp["time_s"] = np.arange(1, intervals + 1) * dt
            gp["power_w"] = np.tile(np.array([[600.0] * T + [500.0] * D]), (intervals, 1))
            gp["util_pct"] = np.full((intervals, T + D), 90.0)
            gp["mem_used_mib"] = np.full((intervals, T + D), 1000.0)
            f.attrs["gpu_ranks"] = json.dumps(list(range(T + D)))
            f.attrs["gpu_idle_power_w"] = 80.0
        else:
            gp.attrs["reason"] = "CPU backend: no NVML"
    return path


def to_format2(path, block_size=4):
    """What format 2 adds to a write_run file, as the writer lays it out: the committed role enum, netCDF-4
    dimension scales (coordinates and value-less dimensions), /steps/epoch and acc_by_pos (NaN rows first,
    as in a resumed format-1 file), /options."""
    with h5py.File(path, "a") as f:
        f.attrs["format_version"] = 2
        r = f["ranks"]
        r["role_t"] = h5py.enum_dtype({"target": 0, "drafter": 1, "idle": 2}, basetype="i1")
        roles = r["role"][()]
        del r["role"]
        r.create_dataset("role", data=roles.astype("i1"), dtype=r["role_t"], maxshape=(None,))
        not_a_variable = "This is a netCDF dimension but not a netCDF variable."
        r.create_dataset("row", shape=(0,), maxshape=(None,), dtype=">f4").make_scale(not_a_variable)
        for k in r:
            if isinstance(r[k], h5py.Dataset) and k != "row":
                r[k].dims[0].attach_scale(r["row"])
        s = f["steps"]
        n = len(s["step"])
        s["epoch"] = np.linspace(0.0, 1.0, n)
        acc = np.tile(np.linspace(0.5, 0.1, block_size - 1), (n, 1))
        acc[: n // 2] = np.nan
        s["acc_by_pos"] = acc
        s["block_position"] = np.arange(1, block_size, dtype=np.int32)
        s["step"].make_scale("step")
        s["block_position"].make_scale("block_position")
        s["acc_by_pos"].dims[1].attach_scale(s["block_position"])
        for k in s:
            if k not in ("step", "block_position"):
                s[k].dims[0].attach_scale(s["step"])
        q = f["queues"]
        q.create_dataset("sample", shape=(0,), maxshape=(None,), dtype=">f4").make_scale(not_a_variable)
        q.create_dataset("drafter", shape=(q["q_hs"].shape[1],), dtype=">f4").make_scale(not_a_variable)
        q["q_hs"].dims[0].attach_scale(q["sample"])
        q["q_hs"].dims[1].attach_scale(q["drafter"])
        o = f.create_group("options")
        o.attrs["hs-queue-depth"] = np.int64(4)
        o.attrs["lr"] = 6e-4
    return path


def report(*args, timeout=120):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=timeout)


def no_nan_json(text):
    """json.loads that refuses NaN and Infinity (json.dump writes them for float('nan'), and no reader should)."""
    def refuse(name):
        raise ValueError(f"{name} in the JSON")
    return json.loads(text, parse_constant=refuse)


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_damaged_files_give_a_message_not_a_traceback(self):
        def datasets(f):
            out = []
            f.visititems(lambda n, o: out.append(n) if isinstance(o, h5py.Dataset) else None)
            return out

        def damage(name, how):
            p = write_run(self.path(name + ".h5"))
            if how == "truncate-file":
                size = os.path.getsize(p)
                with open(p, "r+b") as fh:
                    fh.truncate(size // 2)
                return p
            with h5py.File(p, "r+") as f:
                for n in datasets(f):
                    if how == "drop":
                        del f[n]
                    elif how == "shorten" and f[n].ndim == 1 and f[n].shape[0] > 1:
                        data = f[n][:1]
                        del f[n]
                        f[n] = data
                    elif how == "strings":
                        del f[n]
                        f[n] = np.array([b"x"] * 3)
                for k in list(f.attrs):
                    if how == "attrs":
                        f.attrs[k] = "not a number"
            return p

        for how in ("drop", "shorten", "strings", "attrs", "truncate-file"):
            r = report(damage(how, how))
            self.assertNotIn("Traceback", r.stderr, how)
            self.assertIn(r.returncode, (0, 3), f"{how}: {r.stderr}")
            if r.returncode == 3:
                self.assertIn("dflash-report: error:", r.stderr, how)

    def test_non_finite_timings_give_no_verdict(self):
        # A file whose measurements are NaN gave a confident verdict ("Switch to 1-1: predicted nan b/s"):
        # every service rate is built on /ranks' timings, so without finite ones there is no verdict (exit 3).
        def nan_file(name, fill):
            p = write_run(self.path(name + ".h5"))
            with h5py.File(p, "r+") as f:
                fill(f)
            return p

        def every_float(f):
            f.visititems(lambda n, o: o.__setitem__(Ellipsis, np.nan)
                         if isinstance(o, h5py.Dataset) and o.dtype.kind == "f" else None)

        def some_busy(f):
            busy = f["ranks/busy_s"][()]
            busy[[3, 7, 11]] = np.nan
            f["ranks/busy_s"][...] = busy

        def one_inf_wait(f):
            wait = f["ranks/wait_s"][()]
            wait[5] = np.inf
            f["ranks/wait_s"][...] = wait

        for name, fill, names in (("all", every_float, ["/ranks/time_s (all 24 values)", "/ranks/busy_s (all 24 "
                                                        "values)", "/ranks/wait_s (all 24 values)"]),
                                  ("some", some_busy, ["/ranks/busy_s (3 of 24 values)"]),
                                  ("inf", one_inf_wait, ["/ranks/wait_s (1 of 24 values)"])):
            p = nan_file(name, fill)
            for args in ((p,), (p, "--json")):
                r = report(*args)
                self.assertEqual(r.returncode, 3, f"{name}: {r.stdout}{r.stderr}")
                self.assertEqual(r.stdout, "", name)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn(f"dflash-report: error: {p}: no finite measurements to build a verdict on: ", r.stderr)
                for n in names:
                    self.assertIn(n, r.stderr)
            self.assertIn("no finite measurements", report(p, p).stderr)  # side by side too

    def test_non_finite_series_the_verdict_can_do_without_are_left_out_and_said(self):
        # Power, the allreduce time, the time split, the steps' and queues' times, a numeric attribute: NaN
        # there is left out (as if not recorded) and named; no number of the report is NaN or built on one.
        import re
        p = write_run(self.path("leftout.h5"), topology="6-2", backend="cuda", ranks=8, power=True, t_s=7.0,
                      d_s=0.9)
        with h5py.File(p, "r+") as f:
            f["gpus/power_w"][0, 0] = np.nan
            ar = f["ranks/allreduce_s"][()]
            ar[-1] = np.inf
            f["ranks/allreduce_s"][...] = ar
            for k in ("ranks/compute_s", "steps/time_s", "queues/time_s"):
                f[k][...] = np.nan
            f.attrs["gpu_idle_power_w"] = np.nan
        r = report(p, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = no_nan_json(r.stdout)
        self.assertEqual(set(rep["unusable"]), {"/gpus/power_w", "/ranks/allreduce_s", "/ranks/compute_s",
                                                "/steps/time_s", "/queues/time_s", "attribute gpu_idle_power_w"})
        self.assertEqual(rep["unusable"]["/gpus/power_w"], "1 of 48 values NaN or infinite: no power data")
        self.assertFalse(rep["power"]["available"])
        self.assertIn("not finite", rep["power"]["reason"])
        self.assertIsNone(rep["measurements"]["allreduce_coeff_s"])  # not 0 from a NaN: unknown
        self.assertIn("/ranks/allreduce_s left out", rep["service"]["allreduce_model"])
        self.assertEqual(rep["observed"]["queues"]["samples"], 0)
        self.assertIn("Left out as not finite (NaN or infinite), and nothing here is built on them: ", rep["verdict"])
        self.assertIn("/gpus/power_w (1 of 48 values NaN or infinite: no power data)", rep["verdict"])
        r = report(p, "--png", self.path("leftout.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(re.search(r"\bnan\b|\binf\b", r.stdout), r.stdout)  # how Python prints them
        self.assertIn("left out: /ranks/compute_s: all 48 values NaN or infinite: no compute share", r.stdout)
        # A diverged run's loss is NaN: a finding of the run, not a measurement the verdict uses.
        p = write_run(self.path("diverged.h5"))
        with h5py.File(p, "r+") as f:
            f["steps/loss"][...] = np.nan
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["unusable"], {})
        self.assertIn("Keep 2-1", rep["verdict"])

    def test_implausible_sizes_are_damage_not_a_hang(self):
        # gpus_per_node 1e9 made the what-if loop over ~5e17 splits; sizes are bounded and must agree with the
        # ranks the file holds, before anything iterates over them.
        def damaged(name, edit):
            p = write_run(self.path(name + ".h5"))  # 2-1 + 1 idle: 4 ranks on 1 node
            with h5py.File(p, "r+") as f:
                edit(f)
            return p

        def set_attr(k, v):
            return lambda f: f.attrs.__setitem__(k, v)

        def ranks_beyond(f):
            del f.attrs["gpus_per_node"], f.attrs["ranks"]
            rank = f["ranks/rank"][()]
            rank[-1] = 10 ** 9
            f["ranks/rank"][...] = rank

        cases = {
            "gpus-1e9": (set_attr("gpus_per_node", 10 ** 9), "attribute gpus_per_node = 1000000000 is not a plausible "
                         "number of GPUs (ranks) per node (1..1024)"),
            "gpus-1e9-float": (set_attr("gpus_per_node", 1e9), "attribute gpus_per_node = 1000000000.0"),
            "gpus-fraction": (set_attr("gpus_per_node", 2.5), "attribute gpus_per_node = 2.5"),
            "nodes-1e9": (set_attr("num_nodes", 10 ** 9), "attribute num_nodes = 1000000000 is not a plausible number "
                          "of nodes (1..65536)"),
            "nodes-0": (set_attr("num_nodes", 0), "attribute num_nodes = 0"),
            "gpus-vs-ranks": (set_attr("gpus_per_node", 8), "attributes num_nodes 1 x gpus_per_node 8 = 8 ranks, but "
                              "the ranks attribute lists 4"),
            "nodes-vs-ranks": (set_attr("num_nodes", 2), "num_nodes 2 x gpus_per_node 4 = 8 ranks"),
            "topology-too-big": (set_attr("topology", "9-1"), "topology attribute 9-1 needs 10 ranks per node, but "
                                 "attribute gpus_per_node = 4"),
            "topology-zero": (set_attr("topology", "0-1"), "a split has at least one target and one drafter"),
            "cores-negative": (set_attr("host_cpu_cores", -4), "attribute host_cpu_cores = -4"),
            "ranks-beyond": (ranks_beyond, "gpus_per_node (not recorded: from the ranks the file holds) = 1000000001"),
        }
        for name, (edit, message) in cases.items():
            r = report(damaged(name, edit), timeout=60)  # before: no end
            self.assertEqual(r.returncode, 3, f"{name}: {r.stderr}")
            self.assertNotIn("Traceback", r.stderr, name)
            self.assertIn("dflash-report: error: ", r.stderr, name)
            self.assertIn(message, r.stderr, name)
        # The model itself refuses such a size (it is called by other tools' tests too).
        from dflash_report import model
        with self.assertRaises(ValueError):
            model.all_splits(model.Measurements(gpus_per_node=10 ** 9, nodes=1, target_s_per_batch=1.0,
                                                drafter_s_per_batch=1.0, allreduce_coeff_s=None, tokens_per_batch=1.0))

    def test_model_colocated_row(self):
        # The Python twin of tests/unit/test_auto_topology.cpp's AutoTopology.ColocatedRate and
        # ColocatedIsChosenOnlyMeasuredAndFitting: the same numbers (dflash-synth-metrics --predict compares the
        # two row by row in tests/e2e/test_report_scenarios.sh).
        from dflash_report import model
        t, d = 7 / 0.92, 1 / 0.86
        m = model.Measurements(gpus_per_node=8, nodes=2, target_s_per_batch=t, drafter_s_per_batch=d,
                               allreduce_coeff_s=0.05, tokens_per_batch=32768, colocated_overlap=0.4)
        a = 0.05 * model.ring_allreduce_factor(16)
        p = model.predict_colocated(m)
        self.assertEqual((p.split, p.layout, p.gpus, p.idle), ("colocated", "colocated", 8, 0))
        self.assertAlmostEqual(p.batches_per_s, 16 / (t + d + a - 0.4 * d), places=12)
        self.assertAlmostEqual(p.target_cap_bps, 16 / t, places=12)
        self.assertAlmostEqual(p.drafter_cap_bps, 16 / (d + a), places=12)
        self.assertEqual(p.limit, "target")
        m.colocated_overlap = 1.7  # more than 1: the longer role alone
        self.assertAlmostEqual(model.predict_colocated(m).batches_per_s, 16 / (t + a), places=12)
        m.colocated_overlap = -0.5  # contention, as measured
        self.assertAlmostEqual(model.predict_colocated(m).batches_per_s, 16 / (t + d + a + 0.5 * d), places=12)
        self.assertAlmostEqual(model.colocated_overlap(1.0, 0.5, 1.25), 0.5)
        self.assertAlmostEqual(model.colocated_overlap(1.0, 0.5, 2.0), -1.0)
        self.assertEqual(model.colocated_overlap(0.0, 0.5, 0.5), 0.0)
        # The choice: only measured and not known not to fit.
        m = model.Measurements(gpus_per_node=8, nodes=1, target_s_per_batch=t, drafter_s_per_batch=d,
                               allreduce_coeff_s=None, tokens_per_batch=32768)
        rows = model.all_layouts(m)
        self.assertEqual((len(rows), rows[-1].split), (29, "colocated"))
        self.assertEqual(model.best_split(rows).split, "7-1")  # faster, but its overlap is a guess
        m.colocated_overlap = 0.0
        self.assertEqual(model.best_split(model.all_layouts(m)).split, "colocated")
        m.colocated_fit = "does not fit"
        self.assertEqual(model.best_split(model.all_layouts(m)).split, "7-1")
        m.colocated_fit, m.colocated_overlap = "unknown", -1.0
        self.assertEqual(model.best_split(model.all_layouts(m)).split, "7-1")

    def test_json_has_schema_version(self):
        p = write_run(self.path("a.h5"))
        r = report(p, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        rep = json.loads(r.stdout)
        self.assertEqual(rep["schema_version"], analysis.SCHEMA_VERSION)
        self.assertGreaterEqual(rep["schema_version"], 2)

    def test_cpu_backend_says_ranks_not_gpus(self):
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), cores=8)))
        txt = render.text(rep)
        self.assertIn("4 rank(s)", txt)
        self.assertIn("split of the 4 ranks per node", txt)
        self.assertIn("per busy second per rank", txt)
        self.assertNotIn("GPU(s)", txt)
        self.assertNotIn("GPUs per node", txt)
        self.assertIsNone(rep["oversubscription"])  # 4 ranks on 8 cores

    def test_gpu_backend_says_gpus(self):
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), topology="7-1", backend="cuda", ranks=8, power=True,
                                             t_s=7.0, d_s=0.9)))
        txt = render.text(rep)
        self.assertIn("8 GPU(s)", txt)
        self.assertIsNone(rep["gpu_sharing"])  # cards without bus ids (gpu -1): no GPU is known to be shared
        self.assertEqual(rep["power"]["boards"], 8)  # each power column its own board
        self.assertIn("split of the 8 GPUs per node", txt)

    def test_oversubscribed_cpu_run_is_flagged_and_not_recommended(self):
        # 2-1 + 1 idle on 2 cores (the default job on a 2-core machine): the drafter looks slow, and the model
        # would switch to 1-2 or 1-3; the report must say the timings are distorted instead of recommending it.
        p = write_run(self.path("a.h5"), cores=2, t_s=0.2, d_s=1.0)
        rep = analysis.analyse(Run(p))
        over = rep["oversubscription"]
        self.assertEqual(over, {"cores_per_node": 2, "ranks_per_node": 4, "busy_ranks_per_node": 3,
                                "run_distorted": True})
        self.assertIn("These timings are distorted: 3 busy ranks shared 2 cores", rep["verdict"])
        self.assertNotIn("Switch to", rep["verdict"])
        self.assertIn("1-2 would give", rep["verdict"])
        self.assertIn("needs 3 busy ranks on 2 cores", rep["verdict"])
        txt = render.text(rep)
        self.assertIn("DISTORTED: 3 busy ranks per node shared 2 cores", txt)
        self.assertIn("best layout: none recommended", txt)
        self.assertTrue(all(w["oversubscribed"] == (w["targets"] + w["drafters"] > 2) for w in rep["whatif"]))
        # With every split within the cores as slow as the run, the model's pick is still reported as not one.
        p = write_run(self.path("b.h5"), ranks=3, cores=2, t_s=0.2, d_s=1.0)
        rep = analysis.analyse(Run(p), allreduce_gbps=1e9)
        self.assertNotIn("Switch to", rep["verdict"])

    def test_ranks_sharing_a_gpu_are_flagged_and_not_recommended(self):
        # A one-GPU 1-1 (bench/results/h100-issue44-20261207/layouts): both ranks' cards name one GPU (its PCI bus
        # id, host vm); each role's busy time includes the other's turns, so the what-if's splits (a GPU per rank)
        # are no basis.
        bus = "00000000:19:00.0"
        p = write_run(self.path("a.h5"), topology="1-1", backend="cuda", ranks=2, power=True, t_s=0.2, d_s=1.0)
        with h5py.File(p, "a") as f:
            f.attrs["ranks"] = json.dumps([{"rank": r, "role": role, "host": "vm", "gpu": 0, "gpu_bus": bus, "pid": 1}
                                           for r, role in enumerate(["target", "drafter"])])
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["gpu_sharing"], {"busy_ranks": 2, "gpus": 1, "run_distorted": True,
                                              "shared": [{"host": "vm", "gpu_bus": bus, "gpu": 0, "ranks": [0, 1]}]})
        self.assertIn(f"These timings are distorted: 2 busy ranks shared 1 GPU(s) (ranks 0, 1 on the GPU at {bus} "
                      "of vm)", rep["verdict"])
        self.assertNotIn("Switch to", rep["verdict"])
        txt = render.text(rep)
        self.assertIn("DISTORTED: 2 busy ranks shared 1 GPU(s), taking turns", txt)
        self.assertIn("the ranks shared GPUs, taking turns: these ceilings count", txt)
        # Both power columns sample the one board: the total counts it once (600 W and 500 W samples: 550 W).
        self.assertEqual(rep["power"]["boards"], 1)
        self.assertAlmostEqual(rep["power"]["total_w"], 550.0)
        self.assertIn("best layout: none recommended", txt)
        # The same run on two GPUs is not flagged, and the model's switch stands: each rank bound by --gpus-per-task
        # 1 sees its GPU as ordinal 0, so the bus id, not the ordinal, tells the GPUs apart.
        q = write_run(self.path("b.h5"), topology="1-1", backend="cuda", ranks=3, power=True, t_s=0.2, d_s=1.0)
        with h5py.File(q, "a") as f:
            f.attrs["ranks"] = json.dumps([{"rank": r, "role": role, "host": "vm", "gpu": 0,
                                            "gpu_bus": f"00000000:{0x19 + r:02X}:00.0", "pid": 1}
                                           for r, role in enumerate(["target", "drafter", "idle"])])
        rep = analysis.analyse(Run(q))
        self.assertIsNone(rep["gpu_sharing"])
        self.assertEqual(rep["power"]["boards"], 2)
        self.assertAlmostEqual(rep["power"]["total_w"], 1100.0)
        self.assertIn("Switch to", rep["verdict"])

    def test_splits_beyond_the_cores_are_not_chosen(self):
        # 1-1 + 2 idle on 2 cores: the run itself is fine, but 1-2, 2-1, 1-3, ... would share cores.
        p = write_run(self.path("a.h5"), topology="1-1", cores=2, t_s=0.2, d_s=1.0)
        rep = analysis.analyse(Run(p))
        self.assertFalse(rep["oversubscription"]["run_distorted"])
        self.assertEqual(rep["best"], "1-1")  # 1-2 would be faster on cores the node does not have
        self.assertIn("left out of the choice", rep["verdict"])
        self.assertIn("! = more busy ranks than the 2 cores", render.text(rep))

    def test_unknown_cores_change_nothing(self):
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), t_s=0.2, d_s=1.0)))  # an older file
        self.assertIsNone(rep["oversubscription"])
        self.assertIn("Switch to", rep["verdict"])

    def test_two_runs_side_by_side(self):
        a = write_run(self.path("a.h5"), topology="7-1", backend="cuda", ranks=8, t_s=7.0, d_s=0.9, power=True)
        b = write_run(self.path("b.h5"), topology="6-2", backend="cuda", ranks=8, t_s=7.0, d_s=0.9, power=True)
        r = report(a, b)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 runs side by side", r.stdout)
        for word in ("[1]", "[2]", "7-1", "6-2", "Ktok/s", "bottleneck", "loss (last tenth)", "VERDICT"):
            self.assertIn(word, r.stdout)
        r = report(a, b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        cmp_ = json.loads(r.stdout)
        self.assertEqual(cmp_["schema_version"], analysis.SCHEMA_VERSION)
        self.assertEqual([c["topology"] for c in cmp_["runs"]], ["7-1", "6-2"])
        # 7 targets at 7 s/batch = 1 b/s vs 6 targets = 0.857 b/s: 7-1 is faster by ~17%
        self.assertEqual(cmp_["fastest"], 0)
        self.assertRegex(cmp_["verdict"], r"7-1 .* trained fastest: .*\+1[0-9]% over 6-2")
        self.assertAlmostEqual(cmp_["runs"][1]["vs_first_frac"], 6 / 7 - 1, delta=0.07)  # whole batches per interval

    def test_comparison_summary_directly(self):
        a = Run(write_run(self.path("a.h5"), cores=2))
        b = Run(write_run(self.path("b.h5"), topology="1-1", cores=2))
        cmp_ = compare.compare([(a, analysis.analyse(a)), (b, analysis.analyse(b))])
        self.assertIn("ran oversubscribed", cmp_["verdict"])
        self.assertTrue(cmp_["runs"][0]["distorted"])
        self.assertIn("yes (oversubscribed)", compare.text(cmp_))

    def test_png_with_several_runs_draws_them_on_the_same_axes(self):
        # (once a usage error; tests/report/test_export.py checks the overlay itself)
        a = write_run(self.path("a.h5"))
        r = report(a, a, "--png", self.path("x.png"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("overlay: " + self.path("x.png"), r.stdout)

    def test_dashboard_panels_follow_the_data(self):
        from dflash_report import dashboard
        cpu = Run(write_run(self.path("cpu.h5"), cores=2))
        self.assertEqual(dashboard.panel_names(cpu), ["throughput", "queues", "target time split",
                                                      "drafter time split", "what-if", "training"])  # no power panel
        gpu = Run(write_run(self.path("gpu.h5"), topology="7-1", backend="cuda", ranks=8, power=True, t_s=7.0, d_s=0.9))
        self.assertIn("power", dashboard.panel_names(gpu))
        with h5py.File(self.path("cpu.h5"), "a") as f:
            f["steps"]["acc_by_pos"] = np.tile(np.linspace(0.5, 0.1, 15), (len(f["steps"]["step"]), 1))
        self.assertIn("accuracy per position", dashboard.panel_names(Run(self.path("cpu.h5"))))
        for name, run in (("cpu", Run(self.path("cpu.h5"))), ("gpu", gpu)):
            png = self.path(name + ".png")
            dashboard.write_png(run, analysis.analyse(run), png)
            with open(png, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_format2_file(self):
        # The role enum's committed type and the value-less dimensions are not series; roles read as ints;
        # acc_by_pos's NaN rows (before a resume of a format-1 file) are left out of the per-position panel.
        from dflash_report import dashboard
        run = Run(to_format2(write_run(self.path("a.h5"), cores=8)))
        self.assertEqual(run.format_version, 2)
        self.assertNotIn("role_t", run.ranks)
        self.assertNotIn("row", run.ranks)
        self.assertNotIn("sample", run.queues)
        self.assertEqual(sorted(set(int(x) for x in run.ranks["role"])), [0, 1, 2])
        self.assertIn("accuracy per position", dashboard.panel_names(run))
        rep = analysis.analyse(run)
        self.assertEqual(rep["run"]["metrics_format_version"], 2)
        self.assertEqual(rep["run"]["topology"], "2-1")
        png = self.path("a.png")
        dashboard.write_png(run, rep, png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        # Only NaN rows: no panel drawn empty.
        with h5py.File(self.path("a.h5"), "a") as f:
            f["steps"]["acc_by_pos"][...] = np.nan
        self.assertNotIn("accuracy per position", dashboard.panel_names(Run(self.path("a.h5"))))

    def test_older_and_newer_formats(self):
        p = write_run(self.path("a.h5"))
        self.assertEqual(Run(p).format_version, 1)
        with h5py.File(p, "a") as f:
            del f.attrs["format_version"]  # the first files had none
        self.assertEqual(Run(p).format_version, 1)
        with h5py.File(p, "a") as f:
            f.attrs["format_version"] = 3
        r = report(p)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("format_version 3, this dflash-report reads 1, 2", r.stderr)

    def test_dashboard_time_continues_across_a_resume(self):
        from dflash_report import dashboard
        t = dashboard.continuous_time([10, 20, 30, 5, 15])  # the second segment's clock restarts
        self.assertEqual(list(t), [10, 20, 30, 35, 45])

    def test_dashboard_whatif_bars_fastest_per_gpu_count(self):
        from dflash_report import dashboard
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), topology="7-1", backend="cuda", ranks=8, power=True,
                                             t_s=7.0, d_s=0.9)))
        rows = dashboard.whatif_rows(rep)
        self.assertEqual(len({w["targets"] + w["drafters"] for w in rows if w["layout"] == "split"}), 7)  # 2..8 used
        self.assertEqual([w["split"] for w in rows if w["layout"] == "colocated"], ["colocated"])
        self.assertIn("7-1", [w["split"] for w in rows])
        self.assertEqual([w["ktok_per_s"] for w in rows], sorted((w["ktok_per_s"] for w in rows), reverse=True))

    def test_run_metadata_is_shown_when_recorded(self):
        p = write_run(self.path("a.h5"))
        self.assertNotIn("built from commit", render.text(analysis.analyse(Run(p))))  # an older file: nothing
        with h5py.File(p, "a") as f:
            f.attrs["start_utc"] = "2026-12-01T10:05:00Z"
            f.attrs["git_commit"] = "0123456789abcdef0123-dirty"
            f.attrs["command_line"] = "dflash-train --topology 2-1"
        rep = analysis.analyse(Run(p))
        self.assertEqual(rep["run"]["command_line"], "dflash-train --topology 2-1")
        self.assertIn("started 2026-12-01T10:05:00Z, built from commit 0123456789ab (uncommitted changes)",
                      render.text(rep))

    def add_eval_tau(self, path, taus):
        """/eval rows as --eval-tau-every writes them: one per evaluation, tau NaN where not measured."""
        with h5py.File(path, "a") as f:
            e = f.create_group("eval")
            n = len(taus)
            e["step"] = np.arange(1, n + 1) * 10
            e["loss"] = np.linspace(5.0, 3.0, n)
            for k in ("acc", "streak", "seconds", "time_s"):
                e[k] = np.zeros(n)
            e["seqs"] = np.full(n, 40)
            e["tokens"] = np.full(n, 4000)
            e["tau"] = np.asarray(taus, dtype=float)
            e["tau_prompts"] = np.where(np.isfinite(e["tau"][()]), 32, 0)
        return path

    def test_tau_still_rising_and_stopped(self):
        from dflash_report import dashboard
        # rising to the end: a new best in the last three evaluations by more than the noise margin
        p = self.add_eval_tau(write_run(self.path("up.h5")), [1.0, 1.2, np.nan, 1.3, 1.4, 1.5])
        rep = analysis.analyse(Run(p))
        tau = rep["tau"]
        self.assertEqual(tau["steps"], [10, 20, 40, 50, 60])  # the row without tau is left out
        self.assertEqual(tau["best"], {"step": 60, "tau": 1.5})
        self.assertIs(tau["stopped_rising"], False)
        self.assertEqual(tau["prompts"], 32)
        self.assertIn("tau is still rising", render.text(rep))
        self.assertNotIn("tau has stopped rising", rep["verdict"])
        self.assertIn("tau", dashboard.panel_names(Run(p), rep))
        # a plateau: the last three (1.605, 1.60, 1.59) do not beat 1.60 by more than 0.01
        p = self.add_eval_tau(write_run(self.path("flat.h5")), [1.0, 1.4, 1.6, 1.605, 1.60, 1.59])
        rep = analysis.analyse(Run(p))
        self.assertIs(rep["tau"]["stopped_rising"], True)
        self.assertEqual(rep["tau"]["best"], {"step": 40, "tau": 1.605})
        self.assertIn("tau has stopped rising", rep["verdict"])
        self.assertIn("best 1.605 at step 40", render.text(rep))
        png = self.path("flat.png")
        dashboard.write_png(Run(p), rep, png)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
        # side by side: the best tau of each run ("-" for a run without it)
        cmp_ = compare.compare([(Run(p), rep), (Run(self.path("up.h5")), analysis.analyse(Run(self.path("up.h5")))),
                                (Run(write_run(self.path("plain.h5"))), analysis.analyse(Run(self.path("plain.h5"))))])
        self.assertEqual([c["tau_best"] for c in cmp_["runs"]], [1.605, 1.5, None])
        self.assertRegex(compare.text(cmp_), r"tau \(best\) +1\.605 +1\.500 +-")
        # too few evaluations to tell; the JSON says so (null), the text too
        p = self.add_eval_tau(write_run(self.path("few.h5")), [1.0, 1.1, 1.1])
        r = report(p, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(json.loads(r.stdout)["tau"]["stopped_rising"])
        self.assertIn("too few evaluations", render.text(analysis.analyse(Run(p))))
        # no tau measured (plain --eval-data): no tau key value, no panel
        p = self.add_eval_tau(write_run(self.path("none.h5")), [np.nan, np.nan])
        rep = analysis.analyse(Run(p))
        self.assertIsNone(rep["tau"])
        self.assertNotIn("tau", dashboard.panel_names(Run(p), rep))

    # ---- the what-if over the anchors (tools/dflash_report/anchors.py) ----------------------------------
    def test_anchors_spare_drafter_capacity_is_priced(self):
        # 2-1 target-bound: targets 0.5 s/batch (4 b/s), the drafter 0.1 s/batch (0.02 of it the optimizer) at
        # 100 anchors: it waits 60% of the time; the rest of its step proportional to the anchors, it keeps up
        # with the targets up to (1/4 - 0.02) / (0.08 / 100) = 287 anchors per batch.
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), t_s=0.5, d_s=0.1, anchors=100,
                                             options={"max-anchors": "512", "anchors-per-record": "0"})))
        an = rep["anchors"]
        self.assertAlmostEqual(an["anchors_per_batch"], 100.0)
        self.assertAlmostEqual(an["cost_a_s"], 0.02, places=4)
        self.assertAlmostEqual(an["cost_b_s_per_anchor"], 0.0008, places=6)
        self.assertIn("conservative", an["cost_model"])
        self.assertEqual(an["free_anchors_per_batch"], 287)
        self.assertAlmostEqual(an["drafter_wait_frac"], 0.6, places=2)
        free = next(w for w in an["rows"] if w["free"])
        self.assertAlmostEqual(free["vs_run_frac"], 0.0, places=2)
        self.assertEqual(free["limit"], "target")
        four = next(w for w in an["rows"] if w["anchors_per_batch"] == 400)  # past the free count: slower
        self.assertLess(four["vs_run_frac"], -0.1)
        self.assertEqual(four["limit"], "drafter")
        self.assertAlmostEqual(four["kblocks_per_s"], four["batches_per_s"] * 0.4)
        self.assertIn("the drafters wait 60% of the time: up to 287 anchors per batch (2.9x this run's 100) would "
                      "cost no throughput (--max-anchors 287", rep["verdict"])
        txt = render.text(rep)
        self.assertIn("ANCHORS WHAT-IF", txt)
        self.assertIn("up to 512 per batch", txt)

    def test_anchors_cost_is_fitted_when_the_anchors_vary(self):
        # Per-record anchors vary with the records per batch: intervals at 100..350 anchors per batch whose
        # drafter busy time follows 0.01 + 0.0002 A: the fit recovers it.
        p = write_run(self.path("a.h5"), t_s=0.5, d_s=0.05, anchors=1, options={"anchors-per-record": "64"})
        with h5py.File(p, "a") as f:
            r, s = f["ranks"], f["steps"]
            iv, role, t = r["interval"][()], r["role"][()], r["time_s"][()]
            busy, batches, wait = r["busy_s"][()], r["batches"][()], r["wait_s"][()]
            anchors = s["anchors"][()].astype(float)
            for i in range(6):
                a = 100 + 50 * i
                m = (iv == i) & (role == 1)
                busy[m] = batches[m] * (0.01 + 0.0002 * a)
                wait[m] = 10.0 - busy[m]
                anchors[(s["time_s"][()] > 10.0 * i) & (s["time_s"][()] <= 10.0 * (i + 1))] = a
            r["busy_s"][...] = busy
            r["wait_s"][...] = wait
            del s["anchors"]
            s["anchors"] = anchors
        an = analysis.analyse(Run(p))["anchors"]
        self.assertTrue(an["cost_model"].startswith("fitted over 5 report intervals"), an["cost_model"])
        self.assertAlmostEqual(an["cost_a_s"], 0.01, delta=0.002)
        self.assertAlmostEqual(an["cost_b_s_per_anchor"], 0.0002, delta=0.00002)
        self.assertEqual(an["anchors_per_record"], 64)
        # budget 1/4 s per batch: (0.25 - 0.01) / 0.0002 = 1200 anchors; capped at the 500 tokens of a batch
        self.assertEqual(an["free_anchors_per_batch"], 500)

    def test_anchors_when_the_drafter_is_the_bottleneck(self):
        rep = analysis.analyse(Run(write_run(self.path("a.h5"), t_s=0.2, d_s=1.0, anchors=64)))
        self.assertIsNone(rep["anchors"]["free_anchors_per_batch"])
        self.assertIn("the drafter side is the bottleneck, so more anchors per batch would cost throughput",
                      rep["verdict"])
        half = next(w for w in rep["anchors"]["rows"] if w["anchors_per_batch"] == 32)
        self.assertGreater(half["vs_run_frac"], 0.3)  # fewer anchors: faster steps

    def test_side_by_side_shows_the_blocks_trained(self):
        a = write_run(self.path("a.h5"), t_s=0.5, d_s=0.1, anchors=100)
        b = write_run(self.path("b.h5"), t_s=0.5, d_s=0.2, anchors=400)
        r = report(a, b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        cols = json.loads(r.stdout)["runs"]
        self.assertEqual([c["anchors_per_batch"] for c in cols], [100, 400])
        self.assertAlmostEqual(cols[1]["kblocks_per_s"], cols[1]["batches_per_s"] * 0.4)
        self.assertIn("Kblocks/s", report(a, b).stdout)

    def test_no_anchors_recorded_no_anchor_section(self):
        rep = analysis.analyse(Run(write_run(self.path("a.h5"))))
        self.assertIsNone(rep["anchors"])
        self.assertNotIn("ANCHORS", render.text(rep))
        self.assertNotIn("Anchors:", rep["verdict"])

    def test_version(self):
        r = report("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"^dflash-report \d+\.\d+\.\d+")

    def test_a_venv_without_the_packages_runs_the_system_python(self):
        # A venv made from the system python is the same binary (its realpath) without the system's packages:
        # dflash-report first on such a PATH re-runs under /usr/bin/python3, as it does for a pyenv python.
        sys_py = "/usr/bin/python3"
        if not os.path.exists(sys_py) or subprocess.run(
                [sys_py, "-c", "import h5py, numpy, matplotlib"], capture_output=True).returncode != 0:
            self.skipTest("no /usr/bin/python3 with h5py, numpy and matplotlib to fall back to")
        venv = self.path("venv")
        if subprocess.run([sys_py, "-m", "venv", "--without-pip", venv], capture_output=True).returncode != 0:
            self.skipTest("python3 -m venv unavailable (python3-venv)")
        py = os.path.join(venv, "bin", "python3")
        self.assertNotEqual(subprocess.run([py, "-c", "import h5py"], capture_output=True).returncode, 0)
        p = write_run(self.path("a.h5"), cores=8)
        env = dict(os.environ, PATH=os.path.join(venv, "bin") + os.pathsep + os.environ.get("PATH", ""))
        for cmd in ([py, REPORT, "--json", p], [REPORT, "--json", p]):  # named, and by the #! line on PATH
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(json.loads(r.stdout)["run"]["topology"], "2-1")


if __name__ == "__main__":
    unittest.main()
