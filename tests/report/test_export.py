#!/usr/bin/env python3
"""dflash-report's exports (tools/dflash_report/export.py, docs/report.md "Experiment tracking") and the
several-run overlay, read back and compared with metrics.h5:

- TensorBoard: the built-in event writer, always (read back by an independent TFRecord/protobuf parser of
  this file that checks both masked CRC-32Cs with its own bitwise CRC); with the tensorboard package, also by
  its EventAccumulator; tensorboardX's and torch's writers where installed (byte-for-byte the same records
  as the built-in one's);
- CSV: the step table and the directory of tables, value for value;
- W&B offline (where wandb is installed): without network, the offline run's .wandb log (read here) holds
  every step's values and the file's wall times;
- the overlay PNG of several runs and the side-by-side wording when only the rank count differs.

Tests that need an optional package skip, naming it. Run: python3 -m unittest -v tests/report/test_export.py
(tests/e2e/test_report_export.sh runs it with the project venv, tests/e2e/test_report_py.sh with Debian's
python3).
"""
import csv
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
from datetime import datetime, timezone

import h5py
import numpy as np

HERE = os.path.dirname(os.path.realpath(__file__))
SRC = os.path.realpath(os.path.join(HERE, "..", ".."))
REPORT = os.path.join(SRC, "tools", "dflash-report")
sys.path.insert(0, os.path.join(SRC, "tools"))
sys.path.insert(0, HERE)

from dflash_report import export  # noqa: E402
from dflash_report.load import Run  # noqa: E402
from test_report import to_format2, write_run  # noqa: E402


def have(module):
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001 (a broken install is as good as none here)
        return False


START = "2026-12-01T10:00:00Z"
START_S = datetime(2026, 12, 1, 10, 0, 0, tzinfo=timezone.utc).timestamp()
RESUME = "2026-12-01T12:00:00Z"
RESUME_S = START_S + 7200


def rich_run(path, topology="2-1", ranks=3, power=False, backend="cpu", seed=0):
    """write_run's file in format 2 with the job's start attribute and an /eval group (tau in every other row)."""
    write_run(path, topology=topology, ranks=ranks, power=power, backend=backend, seed=seed, anchors=64,
              cores=16)
    to_format2(path)
    with h5py.File(path, "a") as f:
        f.attrs["start_utc"] = START
        f.attrs["segment_start_utc"] = START
        f["steps"]["lr"][...] = np.linspace(1e-4, 6e-4, len(f["steps"]["step"]))
        f["steps"]["grad_norm"][...] = np.linspace(2.0, 0.5, len(f["steps"]["step"]))
        steps = f["steps"]["step"][()]
        e = f.create_group("eval")
        es = steps[9::10]
        e["step"] = es
        e["loss"] = np.linspace(5.0, 4.0, len(es))
        e["acc"] = np.linspace(0.1, 0.2, len(es))
        e["streak"] = np.linspace(0.2, 0.4, len(es))
        tau = np.linspace(1.1, 1.6, len(es))
        tau[::2] = np.nan
        e["tau"] = tau
        e["time_s"] = f["steps"]["time_s"][9::10] + 0.5
    return path


def resumed_run(path):
    """A run resumed once: the second segment's clocks (steps, ranks, queues) restart at 0, its start is
    segment_start_utc, and its /ranks intervals count from 0 again."""
    rich_run(path)
    with h5py.File(path, "a") as f:
        s = f["steps"]
        t = s["time_s"][()]
        half = len(t) // 2
        t2 = t.copy()
        t2[half:] = t[half:] - t[half - 1] + 2.0  # restarts at ~2 s after the resume
        s["time_s"][...] = t2
        r = f["ranks"]
        iv, rt = r["interval"][()], r["time_s"][()]
        second = rt > 30.0  # intervals 3..5 become the second segment's 0..2
        iv[second] -= 3
        rt[second] -= 30.0  # the second segment's intervals end at 10, 20, 30 on its own clock
        r["interval"][...] = iv
        r["time_s"][...] = rt
        q = f["queues"]
        qt = q["time_s"][()]
        qt[qt > 30.0] -= 30.0
        q["time_s"][...] = qt
        f.attrs["segment_start_utc"] = RESUME
    return path


# ---- an independent reader of TensorBoard event files ------------------------------------------------------

def crc32c_bitwise(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def unmask(masked):
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def proto_fields(buf):
    """Protobuf wire format -> [(field number, wire type, value)]: varints as ints, fixed64/fixed32 as bytes,
    length-delimited as bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 1:
            v, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wire == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((num, wire, v))
    return out


def _varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def read_records(path):
    """TFRecord payloads; both CRCs checked with the bitwise CRC above (AssertionError on a mismatch)."""
    with open(path, "rb") as fh:
        data = fh.read()
    out, i = [], 0
    while i < len(data):
        head = data[i:i + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        assert unmask(hcrc) == crc32c_bitwise(head), f"length CRC of the record at byte {i}"
        payload = data[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
        assert unmask(dcrc) == crc32c_bitwise(payload), f"data CRC of the record at byte {i}"
        out.append(payload)
        i += 16 + n
    assert i == len(data), "trailing bytes"
    return out


def read_events(path):
    """{'file_version': str, 'scalars': {tag: [(step, value, wall)]}, 'session_starts': [step]} of one event
    file."""
    version, scalars, starts = None, {}, []
    for rec in read_records(path):
        wall, step, summary = None, 0, None
        for num, wire, v in proto_fields(rec):
            if num == 1 and wire == 1:
                (wall,) = struct.unpack("<d", v)
            elif num == 2 and wire == 0:
                step = v
            elif num == 3 and wire == 2:
                version = v.decode()
            elif num == 5 and wire == 2:
                summary = v
            elif num == 7 and wire == 2 and (1, 0, 1) in proto_fields(v):  # SessionLog{status: START}
                starts.append(step)
        if summary is None:
            continue
        for num, wire, value in proto_fields(summary):
            if num != 1:
                continue
            tag, simple = None, None
            for n2, w2, v2 in proto_fields(value):
                if n2 == 1:
                    tag = v2.decode()
                elif n2 == 2 and w2 == 5:
                    (simple,) = struct.unpack("<f", v2)
            scalars.setdefault(tag, []).append((step, simple, wall))
    return {"file_version": version, "scalars": scalars, "session_starts": starts}


def event_file(d):
    """The newest event file of dflash-report's in d (an export keeps the one before it)."""
    files = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*" + export.EVENT_SUFFIX)))
    assert 1 <= len(files) <= 2, files
    return files[-1]


def report(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(float)


class ExportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *names):
        return os.path.join(self.dir, *names)

    # -- what the file says, computed here without the exporter ---------------------------------------------
    def expected(self, path):
        """{tag: (steps, values, walls)} for a single-segment file, from h5py directly."""
        out = {}
        with h5py.File(path, "r") as f:
            s = {k: f["steps"][k][()] for k in f["steps"] if k not in ("block_position", "acc_by_pos")}
            start = datetime.fromisoformat(f.attrs["start_utc"].replace("Z", "+00:00")).timestamp()
            wall = start + s["time_s"]
            for k in ("loss", "acc", "agree", "streak", "lr", "noise", "grad_norm", "epoch"):
                if k in s:
                    out[f"train/{k}"] = (s["step"], s[k], wall)

            def done(t):  # steps done by time t
                j = np.searchsorted(s["time_s"], t, side="right")
                return np.where(j > 0, s["step"][np.maximum(j - 1, 0)], 0)

            r = {k: f["ranks"][k][()] for k in ("time_s", "role", "batches")}
            ends = np.unique(r["time_s"])
            starts = np.concatenate([[0.0], ends[:-1]])
            dft = np.array([r["batches"][(r["time_s"] == e) & (r["role"] == 1)].sum() for e in ends])
            tgt = np.array([r["batches"][(r["time_s"] == e) & (r["role"] == 0)].sum() for e in ends])
            tok = np.array([s["tokens"][(s["time_s"] > a) & (s["time_s"] <= b)].sum() for a, b in zip(starts, ends)])
            out["throughput/trained_batches_per_s"] = (done(ends), dft / (ends - starts), start + ends)
            out["throughput/produced_batches_per_s"] = (done(ends), tgt / (ends - starts), start + ends)
            out["throughput/trained_ktok_per_s"] = (done(ends), tok / (ends - starts) / 1000, start + ends)
            qt = f["queues"]["time_s"][()]
            for name in ("q_hs", "q_pre"):
                q = f["queues"][name][()].astype(float)
                for agg in ("mean", "min"):
                    v = getattr(q, agg)(axis=1)
                    st = done(qt)
                    u = np.unique(st)
                    out[f"queues/{name}_{agg}"] = (u, np.array([v[st == x].mean() for x in u]),
                                                   np.array([start + qt[st == x].max() for x in u]))
            if "eval" in f:
                e = {k: f["eval"][k][()] for k in f["eval"]}
                ewall = np.interp(e["step"], s["step"], wall)
                for k in ("loss", "acc", "streak", "tau"):
                    ok = np.isfinite(e[k])
                    out[f"eval/{k}"] = (e["step"][ok], e[k][ok], ewall[ok])
            if f["gpus"].attrs.get("available"):
                gt, p = f["gpus"]["time_s"][()], f["gpus"]["power_w"][()]
                st = done(gt)
                u = np.unique(st)
                out["power/total_w"] = (u, np.array([p[st == x].sum(axis=1).mean() for x in u]),
                                        np.array([start + gt[st == x].max() for x in u]))
        return out

    def check_scalars(self, got, want, exact_f32=True):
        """got: {tag: [(step, value, wall)]}; want: expected()'s; every expected tag with every point."""
        for tag, (steps, values, walls) in want.items():
            self.assertIn(tag, got, f"{tag} missing (have {sorted(got)})")
            pts = got[tag]
            self.assertEqual([p[0] for p in pts], [int(x) for x in steps], tag)
            v = np.array([p[1] for p in pts])
            if exact_f32:  # simple_value is a float32: exactly the file's value rounded to float32
                np.testing.assert_array_equal(v, f32(values), err_msg=tag)
            else:
                np.testing.assert_allclose(v, values, rtol=1e-6, err_msg=tag)
            np.testing.assert_allclose([p[2] for p in pts], walls, rtol=0, atol=1e-3, err_msg=tag)

    # -- CRC and the protobuf encoding -----------------------------------------------------------------------
    def test_crc32c_matches_the_reference(self):
        self.assertEqual(export.crc32c(b"123456789"), 0xE3069283)  # the CRC-32C check value
        self.assertEqual(crc32c_bitwise(b"123456789"), 0xE3069283)
        rng = np.random.default_rng(1)
        chunks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 7, 8, 8, 8, 31, 100, 1000)]
        self.assertEqual(export.crc32c_many(chunks), [crc32c_bitwise(c) for c in chunks])
        self.assertEqual(unmask(export.masked_crc32c(0x12345678)), 0x12345678)

    def test_event_encoding_by_hand(self):
        ev = export.encode_event(1.5, step=300, scalar=("a/b", 0.25))
        # wall_time 1.5 (field 1, fixed64), step 300 (field 2, varint ac 02), summary (field 5)
        self.assertEqual(ev, bytes.fromhex("09000000000000f83f10ac022a0c0a0a0a03612f62150000803e"))
        self.assertEqual(export.encode_event(2.0, file_version="brain.Event:2")[9:],
                         b"\x1a\x0dbrain.Event:2")

    # -- TensorBoard -----------------------------------------------------------------------------------------
    def test_builtin_writer_read_back_by_an_independent_parser(self):
        for power in (False, True):
            with self.subTest(power=power):
                p = rich_run(self.path(f"run{power}.h5"), topology="7-1" if power else "2-1",
                             ranks=8 if power else 3, power=power, backend="cuda" if power else "cpu")
                d = self.path(f"tb{power}")
                out = export.write_tensorboard(Run(p), d, "builtin")
                self.assertEqual(out["writer"], "builtin")
                ev = read_events(event_file(d))
                self.assertEqual(ev["file_version"], "brain.Event:2")
                self.assertEqual(ev["session_starts"], [0], "one SessionLog START, at step 0")
                want = self.expected(p)
                self.check_scalars(ev["scalars"], want)
                self.assertEqual(sum(len(v) for v in ev["scalars"].values()), out["points"])
                self.assertEqual(("power/total_w" in ev["scalars"]), power, "power only where the file has it")
                self.assertEqual(len(ev["scalars"]["eval/tau"]), len(ev["scalars"]["eval/loss"]) // 2,
                                 "tau only where it was measured")
                steps = [s for pts in ev["scalars"].values() for s, _, _ in pts]
                order = [s for s, _, _ in sorted((p for pts in ev["scalars"].values() for p in pts),
                                                 key=lambda x: x[0])]
                self.assertEqual(sorted(steps), order)

    def test_reexport_replaces_the_earlier_file(self):
        p = rich_run(self.path("a.h5"))
        d = self.path("tb")
        first = export.write_tensorboard(Run(p), d, "builtin")["file"]
        with open(os.path.join(d, "events.out.tfevents.1.other"), "wb"):
            pass  # someone else's file stays
        second = export.write_tensorboard(Run(p), d, "builtin")["file"]  # within the same second, likely
        third = export.write_tensorboard(Run(p), d, "builtin")["file"]
        self.assertLess(first, second)  # TensorBoard reads them in name order: the newest goes last
        self.assertLess(second, third)
        ours = sorted(glob.glob(os.path.join(d, "events.out.tfevents.*" + export.EVENT_SUFFIX)))
        self.assertEqual(ours, [second, third], "the previous export stays (a TensorBoard may be reading it)")
        self.assertTrue(os.path.exists(os.path.join(d, "events.out.tfevents.1.other")))
        self.assertEqual([x for x in os.listdir(d) if x.startswith(".")], [], "no scratch directory left")

    @unittest.skipUnless(have("tensorboard.backend.event_processing.event_accumulator"),
                         "needs the tensorboard package (requirements-tests.txt; tools/setup.sh --tests)")
    def test_a_watching_tensorboard_follows_each_export(self):
        # a run in progress exported again and again: a TensorBoard that keeps reading the directory shows
        # the newest export (the START event of each new file drops what it had), and so does a new one
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        full = rich_run(self.path("full.h5"))
        short = self.path("short.h5")
        shutil.copy(full, short)
        with h5py.File(short, "a") as f:  # the same run earlier: its first 40 steps
            for k in [k for k in f["steps"] if k != "block_position"]:
                data = f["steps"][k][:40]
                del f["steps"][k]
                f["steps"][k] = data
        d = self.path("tb")
        watching = EventAccumulator(d, size_guidance={"scalars": 0})
        for p, n in ((short, 40), (full, len(Run(full).steps["step"])), (short, 40)):
            export.write_tensorboard(Run(p), d, "builtin")
            watching.Reload()
            fresh = EventAccumulator(d, size_guidance={"scalars": 0})
            fresh.Reload()
            for acc in (watching, fresh):
                self.assertEqual([e.step for e in acc.Scalars("train/loss")], list(range(1, n + 1)))
                self.check_scalars({t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)]
                                    for t in acc.Tags()["scalars"]}, self.expected(p))

    @unittest.skipUnless(have("tensorboard.backend.event_processing.event_accumulator"),
                         "needs the tensorboard package (requirements-tests.txt; tools/setup.sh --tests)")
    def test_tensorboard_reads_the_builtin_writers_file(self):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        p = rich_run(self.path("a.h5"), topology="7-1", ranks=8, power=True, backend="cuda")
        d = self.path("tb")
        export.write_tensorboard(Run(p), d, "builtin")
        acc = EventAccumulator(d, size_guidance={"scalars": 0})
        acc.Reload()
        got = {t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
        self.check_scalars(got, self.expected(p))
        self.assertEqual(set(got), set(read_events(event_file(d))["scalars"]))

    def _library_writer(self, which):
        p = rich_run(self.path("a.h5"), topology="7-1", ranks=8, power=True, backend="cuda")
        d_lib, d_own = self.path("lib"), self.path("own")
        out = export.write_tensorboard(Run(p), d_lib, which)
        self.assertNotEqual(out["writer"], "builtin")
        export.write_tensorboard(Run(p), d_own, "builtin")
        lib, own = read_records(event_file(d_lib)), read_records(event_file(d_own))
        # the same records byte for byte after the first (file_version, with the time the file was made)
        self.assertEqual(len(lib), len(own))
        self.assertEqual(lib[1:], own[1:])
        self.check_scalars(read_events(event_file(d_lib))["scalars"], self.expected(p))
        if have("tensorboard.backend.event_processing.event_accumulator"):
            from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
            acc = EventAccumulator(d_lib, size_guidance={"scalars": 0})
            acc.Reload()
            self.check_scalars({t: [(e.step, e.value, e.wall_time) for e in acc.Scalars(t)]
                                for t in acc.Tags()["scalars"]}, self.expected(p))

    @unittest.skipUnless(have("tensorboardX"), "needs tensorboardX (requirements-tests.txt; tools/setup.sh --tests)")
    def test_tensorboardx_writer_matches_the_builtin_one(self):
        self._library_writer("tensorboardx")

    @unittest.skipUnless(have("torch.utils.tensorboard"), "needs torch and tensorboard (DFLASH_TORCH=1 tools/setup.sh)")
    def test_torch_writer_matches_the_builtin_one(self):
        self._library_writer("torch")

    def test_auto_writer_prefers_a_library(self):
        w = export.tensorboard_writer(self.dir, "auto")
        want = "tensorboardX" if have("tensorboardX") else (
            "torch.utils.tensorboard" if have("torch.utils.tensorboard") else "builtin")
        self.assertEqual(w.name, want)
        w.close()

    def test_resumed_run_steps_and_wall_times(self):
        p = resumed_run(self.path("r.h5"))
        run = Run(p)
        tl = export.Timeline(run)
        self.assertEqual(tl.nseg, 2)
        with h5py.File(p, "r") as f:
            t, step = f["steps"]["time_s"][()], f["steps"]["step"][()]
            qt = f["queues"]["time_s"][()]
        half = len(t) // 2
        np.testing.assert_allclose(tl.wall[:half], START_S + t[:half])
        np.testing.assert_allclose(tl.wall[half:], RESUME_S + t[half:])
        series = {s.tag: s for s in export.scalar_series(run)}
        q = series["queues/q_hs_mean"]
        # a queue sample of the second segment at time x counts the second segment's steps done by x
        x = qt[-1]
        seg2 = slice(half, None)
        want = step[seg2][np.searchsorted(t[seg2], x, side="right") - 1]
        self.assertEqual(int(q.steps[-1]), int(want))
        self.assertAlmostEqual(float(q.wall[-1]), RESUME_S + x, places=3)
        self.assertTrue(np.all(np.diff(q.steps) > 0), "one point per step, in step order")
        th = series["throughput/trained_batches_per_s"]
        self.assertEqual(len(th), 6, "every interval of both segments")
        self.assertTrue(np.all(np.diff(th.steps) >= 0))
        self.assertAlmostEqual(float(th.wall[3]), RESUME_S + 10.0, places=3)

    def test_wall_time_without_the_start_attributes(self):
        # an older file: its last step is placed at the file's modification time
        p = rich_run(self.path("old.h5"))
        with h5py.File(p, "a") as f:
            del f.attrs["start_utc"]
            del f.attrs["segment_start_utc"]
        os.utime(p, (START_S + 1000, START_S + 1000))
        tl = export.Timeline(Run(p))
        self.assertAlmostEqual(float(tl.wall[-1]), START_S + 1000, places=3)
        # a resumed file with only the last segment's start: the first segment ends where the last begins
        p = resumed_run(self.path("r.h5"))
        with h5py.File(p, "a") as f:
            del f.attrs["start_utc"]
            t = f["steps"]["time_s"][()]
        tl = export.Timeline(Run(p))
        self.assertAlmostEqual(float(tl.seg_wall[1]), RESUME_S)
        self.assertAlmostEqual(float(tl.seg_wall[0]), RESUME_S - t[len(t) // 2 - 1])

    # -- CSV -------------------------------------------------------------------------------------------------
    def test_csv_file_holds_every_step_value_for_value(self):
        p = rich_run(self.path("a.h5"))
        out = self.path("steps.csv")
        r = report(p, "--csv", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"csv: {out}", r.stdout)
        with open(out, newline="") as fh:
            rows = list(csv.DictReader(fh))
        with h5py.File(p, "r") as f:
            s = f["steps"]
            self.assertEqual(len(rows), len(s["step"]))
            self.assertEqual([int(x["step"]) for x in rows], list(s["step"][()]))
            for k in ("time_s", "loss", "acc", "agree", "streak", "lr", "noise", "grad_norm", "epoch"):
                self.assertEqual([float(x[k]) for x in rows], list(s[k][()]), k)  # repr: exact round trip
            for k in ("tokens", "anchors"):
                self.assertEqual([int(x[k]) for x in rows], list(s[k][()]), k)
            acc = s["acc_by_pos"][()]
            for j, pos in enumerate(s["block_position"][()]):
                col = [float(x[f"acc_pos_{pos}"]) for x in rows]
                np.testing.assert_array_equal(col, acc[:, j])  # NaN rows too (written as nan)
            np.testing.assert_allclose([float(x["wall_time"]) for x in rows], START_S + s["time_s"][()], atol=1e-6)
            self.assertTrue(rows[0]["utc"].startswith("2026-12-01T10:00:") and rows[0]["utc"].endswith("Z"))
            e = f["eval"]
            by_step = {int(x["step"]): x for x in rows}
            for i, st in enumerate(e["step"][()]):
                self.assertEqual(float(by_step[int(st)]["eval_loss"]), e["loss"][i])
                tau = by_step[int(st)]["eval_tau"]
                self.assertTrue(tau == "nan" if np.isnan(e["tau"][i]) else float(tau) == e["tau"][i])
            self.assertEqual(by_step[1]["eval_loss"], "", "no evaluation at step 1: empty")

    def test_csv_directory_has_every_table(self):
        p = rich_run(self.path("a.h5"), topology="7-1", ranks=8, power=True, backend="cuda")
        d = self.path("csvdir")
        r = report(p, "--csv", d)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(d)), ["eval.csv", "intervals.csv", "power.csv", "queues.csv", "steps.csv"])

        def table(name):
            with open(os.path.join(d, name), newline="") as fh:
                return list(csv.DictReader(fh))
        with h5py.File(p, "r") as f:
            q = table("queues.csv")
            self.assertEqual([float(x["time_s"]) for x in q], list(f["queues"]["time_s"][()]))
            self.assertEqual([int(x["q_pre_target6"]) for x in q], list(f["queues"]["q_pre"][:, 6]))
            self.assertEqual([int(x["q_hs_drafter0"]) for x in q], list(f["queues"]["q_hs"][:, 0]))
            pw = table("power.csv")
            self.assertEqual([float(x["gpu7_power_w"]) for x in pw], list(f["gpus"]["power_w"][:, 7]))
            ev = table("eval.csv")
            self.assertEqual([int(x["step"]) for x in ev], list(f["eval"]["step"][()]))
        want = self.expected(p)
        iv = table("intervals.csv")
        np.testing.assert_allclose([float(x["trained_batches_per_s"]) for x in iv],
                                   want["throughput/trained_batches_per_s"][1])
        self.assertEqual([int(x["steps_done"]) for x in iv], list(want["throughput/trained_batches_per_s"][0]))

    # -- W&B ---------------------------------------------------------------------------------------------------
    @unittest.skipUnless(have("wandb"), "needs wandb (requirements-tests.txt; tools/setup.sh --tests)")
    def test_wandb_offline_run_holds_the_history(self):
        os.makedirs(self.path("myrun"))
        p = rich_run(self.path("myrun", "metrics.h5"))
        wdir = self.path("wb")
        private_tmp = self.path("private-tmp")  # $TMPDIR: where W&B writes before the run is copied into wdir
        os.makedirs(private_tmp)
        env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": "", "TMPDIR": private_tmp,
               "WANDB_BASE_URL": "http://127.0.0.1:9"}  # nothing listens there: any upload would fail
        cmd = [sys.executable, REPORT, p, "--wandb", "--wandb-project", "proj", "--wandb-dir", wdir]
        # without network at all where this machine lets us (a new network namespace: loopback only, down)
        if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
            cmd = ["unshare", "-n"] + cmd
        dirs = []
        for _ in range(2):  # a second export (the next job of a resumed run) keeps the first one's run
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **env})
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            m = re.search(r"wandb: offline run \w+ \(proj/myrun, \d+ steps\) in (.*): upload it with: "
                          r"wandb sync (\S+)", r.stdout)
            self.assertTrue(m, r.stdout)
            self.assertEqual(m.group(1), m.group(2))
            self.assertEqual(os.path.dirname(m.group(1)), os.path.join(wdir, "wandb"))
            dirs.append(m.group(1))
            self.assertEqual(os.listdir(private_tmp), [])  # W&B's private directory removed
        self.assertEqual(sorted(glob.glob(os.path.join(wdir, "wandb", "offline-run-*"))), sorted(set(dirs)))
        self.assertEqual(os.path.realpath(os.path.join(wdir, "wandb", "latest-run")), os.path.realpath(dirs[1]))
        want = self.expected(p)
        loss_steps, _, loss_walls = want["train/loss"]
        for run_dir in dirs:  # each run whole: the first one carried over, the second one copied in
            (log,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
            hist, config = read_wandb(log)
            self.assertEqual(config.get("topology"), "2-1")
            self.assertEqual(config.get("options", {}).get("hs-queue-depth"), "4")
            for tag, (steps, values, walls) in want.items():
                got = [(st, row[tag]) for st, row in sorted(hist.items()) if tag in row]
                self.assertEqual([g[0] for g in got], [int(x) for x in steps], tag)
                np.testing.assert_allclose([g[1] for g in got], values, rtol=1e-12, err_msg=tag)
            np.testing.assert_allclose([hist[int(s)]["_timestamp"] for s in loss_steps], loss_walls, atol=1e-3)

def read_wandb(path):
    """An offline run's .wandb log (W&B's LevelDB-style record log: a 7-byte header, 32 KiB blocks of records
    with a CRC-32, length and type; each record a wandb Record protobuf) -> ({step: history row}, config)."""
    import zlib
    from wandb.proto import wandb_internal_pb2 as pb
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:4] == b":W&B", data[:7]
    pos, block, buf = 7, 32768, b""
    hist, config = {}, {}
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if crc == 0 and n == 0 and kind == 0:
            break
        payload = data[pos + 7:pos + 7 + n]
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"record CRC at {pos}"
        pos += 7 + n
        if kind in (1, 2):
            buf = payload
        else:
            buf += payload
        if kind not in (1, 4):
            continue
        rec = pb.Record()
        rec.ParseFromString(buf)
        which = rec.WhichOneof("record_type")
        if which == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            hist[int(row["_step"])] = row
        elif which in ("run", "config"):
            items = rec.run.config.update if which == "run" else rec.config.update
            for i in items:
                v = json.loads(i.value_json)
                config[i.key or "/".join(i.nested_key)] = v.get("value", v) if isinstance(v, dict) else v
    return hist, config


class WandbModeTest(unittest.TestCase):
    """--wandb's mode (issue 48 item 11): online where the environment is logged in, offline otherwise, and a
    failed export never reported as one. Needs no wandb package: a stand-in module fails on purpose."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dflash-wandb-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_mode_follows_the_login(self):
        netrc = os.path.join(self.tmp, "netrc")
        self.assertEqual(export.wandb_mode({"NETRC": netrc})[0], "offline")  # no key, no netrc
        self.assertEqual(export.wandb_mode({"WANDB_API_KEY": "k", "NETRC": netrc})[0], "online")
        with open(netrc, "w") as f:
            f.write("machine api.wandb.ai\n  login user\n  password k\n")
        mode, why = export.wandb_mode({"NETRC": netrc})
        self.assertEqual(mode, "online")
        self.assertIn("api.wandb.ai", why)
        # another server's login is not W&B's; WANDB_MODE always wins
        self.assertEqual(export.wandb_mode({"NETRC": netrc, "WANDB_BASE_URL": "https://wandb.example.org"})[0], "offline")
        self.assertEqual(export.wandb_mode({"NETRC": netrc, "WANDB_MODE": "offline"})[0], "offline")
        self.assertEqual(export.wandb_mode({"NETRC": netrc, "WANDB_MODE": "disabled"})[0], "disabled")

    def fake_wandb(self, init_body):
        pkg = os.path.join(self.tmp, "fake", "wandb")
        os.makedirs(pkg, exist_ok=True)
        with open(os.path.join(pkg, "__init__.py"), "w") as f:
            f.write("__version__ = '0.0-fake'\n"
                    "class Settings:\n    model_fields = {}\n"
                    "calls = []\n"
                    "def init(**kw):\n" + init_body)
        return os.path.dirname(pkg)

    def run_report(self, fake, extra_env=None):
        os.makedirs(os.path.join(self.tmp, "myrun"), exist_ok=True)
        p = rich_run(os.path.join(self.tmp, "myrun", "metrics.h5"))
        env = {**os.environ, "PYTHONPATH": fake, "DFLASH_NO_REEXEC": "1", "NETRC": os.path.join(self.tmp, "none")}
        env.pop("WANDB_MODE", None)
        env.pop("WANDB_API_KEY", None)
        env.update(extra_env or {})
        return subprocess.run([sys.executable, REPORT, p, "--csv", os.path.join(self.tmp, "csv"), "--wandb",
                               "--wandb-dir", os.path.join(self.tmp, "wb")], capture_output=True, text=True,
                              timeout=300, env=env)

    def test_failed_export_is_never_said_exported(self):
        r = self.run_report(self.fake_wandb("    raise RuntimeError('no network here')\n"))
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"dflash-report: error: --wandb: the W&B export of myrun failed "
                                   r"\(RuntimeError: no network here\); nothing was logged")
        self.assertNotIn("wandb: ", r.stdout)  # no "wandb: offline run ..." line
        self.assertIn("csv: ", r.stdout)      # what did go out is still said

    def test_online_start_that_fails_is_logged_offline(self):
        body = ("    if kw['mode'] == 'online':\n        raise RuntimeError('cannot reach api.wandb.ai')\n"
                "    class R:\n        dir = None\n        id = 'abc'\n"
                "        def log(self, row, step): pass\n        def finish(self): pass\n"
                "    return R()\n")
        r = self.run_report(self.fake_wandb(body), {"WANDB_API_KEY": "k"})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"wandb: offline run abc \(dflash-train/myrun, \d+ steps\) "
                                   r"\[online failed \(RuntimeError: cannot reach api.wandb.ai\)\]")


class OverlayTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def run_dir(self, name, **kw):
        os.makedirs(os.path.join(self.dir, name))
        return rich_run(os.path.join(self.dir, name, "metrics.h5"), **kw)

    def test_two_runs_on_the_same_axes(self):
        from dflash_report import overlay
        a = self.run_dir("7-1", topology="7-1", ranks=8, backend="cuda")
        b = self.run_dir("6-2", topology="6-2", ranks=8, backend="cuda", seed=1)
        with h5py.File(b, "a") as f:  # a much shorter run than the other (its smoothing window is its own)
            for k in list(f["steps"]):
                if k != "block_position":
                    data = f["steps"][k][:20]
                    del f["steps"][k]
                    f["steps"][k] = data
        png = os.path.join(self.dir, "both.png")
        r = report(a, b, "--png", png)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("2 runs side by side", r.stdout)
        self.assertIn(f"overlay: {png} (loss, loss by time, acc, streak, throughput, held-out loss, tau)", r.stdout)
        with open(png, "rb") as fh:
            self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")
        self.assertEqual(overlay.run_names([a, b]), ["7-1", "6-2"])
        self.assertEqual(overlay.run_names(["x/a/metrics.h5", "y/a/metrics.h5"]), ["x/a", "y/a"])
        self.assertEqual(overlay.run_names(["a.h5", "a.h5"]), ["a [1]", "a [2]"])
        self.assertEqual(overlay.label(Run(a), "7-1"), "7-1: 7-1 on 1 x 8 GPUs (cuda)")
        # --json keeps the PNG's path; without /eval, no held-out panels
        self.assertEqual(overlay.panel_names([Run(write_run(os.path.join(self.dir, "plain.h5")))]),
                         ["loss", "loss by time", "acc", "streak", "throughput"])

    def test_wording_when_only_the_rank_count_differs(self):
        a = self.run_dir("three", ranks=3)
        b = self.run_dir("four", ranks=4)
        r = report(a, b, "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        v = json.loads(r.stdout)["verdict"]
        self.assertIn("trained equally fast", v)  # the same split at the same speed: no "fastest, +0%"
        self.assertNotIn("+0%", v)
        self.assertIn("The runs differ only in ranks per node (3 vs 4)", v)
        self.assertIn(f"2-1 ({os.path.join(self.dir, 'four')}) left 1 rank per node idle", v)
        self.assertIn("Both keep 3 ranks busy as 2-1, so they compare as the same split", v)
        self.assertNotIn("backend", v)
        self.assertEqual([c["idle_per_node"] for c in json.loads(r.stdout)["runs"]], [0, 1])
        c = self.run_dir("twotwo", topology="2-2", ranks=4)
        v = json.loads(report(a, c, "--json").stdout)["verdict"]
        self.assertIn("They keep 3 and 4 ranks busy: a difference in speed comes from the extra ranks", v)
        g = self.run_dir("gpu", topology="2-1", ranks=3, backend="cuda")
        v = json.loads(report(a, g, "--json").stdout)["verdict"]
        self.assertIn("The runs used different backends (cpu vs cuda)", v)
        text = report(a, b).stdout
        self.assertRegex(text, r"idle per node\s+0\s+1")


class CliTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_usage_errors(self):
        a = write_run(os.path.join(self.dir, "a.h5"))
        for args in ([a, a, "--csv", "x.csv"], [a, "--wandb-name", "n"], [a, "--tensorboard-writer", "builtin"],
                     [a, a, "--wandb", "--wandb-name", "n"]):
            r = report(*args)
            self.assertEqual(r.returncode, 2, f"{args}: {r.stderr}")

    def test_a_run_without_a_verdict_yet_still_exports(self):
        # the first minute of a job: steps, but no report interval with a finished batch yet
        p = rich_run(os.path.join(self.dir, "young.h5"))
        with h5py.File(p, "a") as f:
            f["ranks"]["batches"][...] = 0
        d = os.path.join(self.dir, "tb")
        r = report(p, "--tensorboard", d, "--tensorboard-writer", "builtin")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no verdict", r.stderr)
        self.assertIn("tensorboard:", r.stdout)
        self.assertIn("train/loss", read_events(event_file(d))["scalars"])
        self.assertEqual(report(p).returncode, 3, "without an export it is the error it was")

    def test_json_stays_json_with_exports(self):
        p = rich_run(os.path.join(self.dir, "a.h5"))
        r = report(p, "--json", "--csv", os.path.join(self.dir, "s.csv"))
        self.assertEqual(r.returncode, 0, r.stderr)
        json.loads(r.stdout)
        self.assertIn("csv:", r.stderr)

    def test_several_runs_export_one_directory_each(self):
        os.makedirs(os.path.join(self.dir, "r1"))
        os.makedirs(os.path.join(self.dir, "r2"))
        a = rich_run(os.path.join(self.dir, "r1", "metrics.h5"))
        b = rich_run(os.path.join(self.dir, "r2", "metrics.h5"), topology="1-2")
        tb, cs = os.path.join(self.dir, "tb"), os.path.join(self.dir, "csv")
        r = report(a, b, "--tensorboard", tb, "--tensorboard-writer", "builtin", "--csv", cs)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(tb)), ["r1", "r2"])
        self.assertTrue(os.path.exists(os.path.join(cs, "r2", "steps.csv")))
        self.assertEqual(len(read_events(event_file(os.path.join(tb, "r1")))["scalars"]["train/loss"]),
                         len(Run(a).steps["step"]))


if __name__ == "__main__":
    unittest.main()
