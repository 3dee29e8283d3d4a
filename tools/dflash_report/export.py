"""A run's series for the user's own tools (docs/report.md "Experiment tracking"): TensorBoard event files
(--tensorboard DIR), CSV (--csv FILE or DIR) and Weights & Biases, offline by default (--wandb).

Every series is put on the training step as its x axis, with the wall time the file says it happened:

  train/*       /steps: loss, acc, agree, streak, lr, noise, grad_norm, epoch (one point per step)
  throughput/*  /ranks and /steps per report interval: trained Ktok/s, trained and produced batches/s
  queues/*      /queues: q_hs and q_pre, mean and minimum over their columns
  eval/*        /eval (--eval-data): held-out loss, acc, streak, and tau where it was measured
  power/*, gpu/*  /gpus (NVML readings only): total, targets' and drafters' W; mean utilisation, most memory

A series sampled in time (throughput, queues, power) gets, at each sample, the number of steps done by then;
the samples that fall on one step are averaged into one point (W&B takes one value per key and step).
Times restart at 0 in each segment of a resumed run; the wall time of a segment's clock 0 is `start_utc` for
the first segment, `segment_start_utc` for the last, the previous segment's last row for one in between, and,
in a file without those attributes, the file's modification time less the run's length.
"""

import csv
import math
import os
import shutil
import socket
import struct
import sys
import tempfile
import time
from datetime import datetime, timezone

import numpy as np

from .analysis import _gpu_column_ranks
from .load import ROLE_DRAFTER, ROLE_TARGET
from . import safe_out

STEP_SERIES = ("loss", "acc", "agree", "streak", "lr", "noise", "grad_norm", "epoch")  # train/<name>, in this order
EVAL_SERIES = ("loss", "acc", "streak", "tau")
# The /steps series the CSV leads with (the others follow by name); acc_by_pos becomes acc_pos_<k> columns.
CSV_FIRST = ("step", "time_s") + STEP_SERIES + ("tokens", "anchors")
# Event files this tool writes end with this; a new export into the same directory replaces them.
EVENT_SUFFIX = ".dflash-report"


class Series:
    """One scalar series: tag, steps (int64), values (float64, finite), wall times (s since the epoch)."""

    def __init__(self, tag, steps, values, wall):
        self.tag = tag
        steps, values, wall = np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float), \
            np.asarray(wall, dtype=float)
        keep = np.isfinite(values)  # NaN = nothing recorded there (tau not measured, a resumed file's early rows)
        self.steps, self.values, self.wall = steps[keep], values[keep], wall[keep]

    def __len__(self):
        return len(self.steps)


def _utc(text):
    """'2026-12-04T02:19:00Z' -> seconds since the epoch (None when absent or unreadable)."""
    if not text:
        return None
    try:
        d = datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=timezone.utc)
    return d.timestamp()


def segments(t):
    """Segment index of each row of a time_s series (its clock restarts in each resumed segment)."""
    t = np.asarray(t, dtype=float)
    if len(t) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(t[1:] < t[:-1])]).astype(np.int64)


class Timeline:
    """Steps, segments and wall clock of a run: which step was done at a time of a segment, and when that was."""

    def __init__(self, run):
        st = run.steps
        self.step = np.asarray(st.get("step", np.zeros(0)), dtype=np.int64)
        t = st.get("time_s")
        self.has_time = t is not None and len(t) == len(self.step)
        self.t = np.asarray(t, dtype=float) if self.has_time else np.zeros(len(self.step))
        self.seg = segments(self.t)
        self.nseg = int(self.seg.max()) + 1 if len(self.seg) else 1
        seg_end = [float(self.t[self.seg == k].max()) if np.any(self.seg == k) else 0.0 for k in range(self.nseg)]
        first, last = _utc(run.attrs.get("start_utc")), _utc(run.attrs.get("segment_start_utc"))
        known = {}
        if first is not None:
            known[0] = first
        if last is not None and (self.nseg > 1 or first is None):
            known[self.nseg - 1] = last
        if 0 not in known:
            if self.nseg - 1 in known:  # only the last segment's start: the ones before it end there
                known[0] = known[self.nseg - 1] - sum(seg_end[: self.nseg - 1])
            else:  # no recorded start: the file's modification time less the run's length
                try:
                    mtime = os.path.getmtime(run.path)
                except OSError:
                    mtime = time.time()
                known[0] = mtime - sum(seg_end)
        self.seg_wall = [known[0]]
        for k in range(1, self.nseg):
            self.seg_wall.append(known.get(k, self.seg_wall[k - 1] + seg_end[k - 1]))
        self.wall = np.array([self.seg_wall[k] for k in self.seg]) + self.t if len(self.step) else np.zeros(0)
        # continuous time (each segment following the last), for series whose segments do not line up
        offs = np.concatenate([[0.0], np.cumsum(seg_end)])
        self.cont = self.t + offs[self.seg] if len(self.step) else np.zeros(0)
        self.cont_offsets = offs

    def at(self, t):
        """(steps done, wall time) at each time of a series sampled in time (its own time_s, segments and all)."""
        t = np.asarray(t, dtype=float)
        sseg = segments(t)
        steps = np.zeros(len(t), dtype=np.int64)
        wall = np.zeros(len(t))
        if len(t) == 0:
            return steps, wall
        if not len(self.step) or not self.has_time:
            return steps, self.seg_wall[0] + t
        if int(sseg.max()) + 1 == self.nseg:  # segment k of the series = segment k of the steps
            return _steps_at_segment_times(self, sseg, t)
        # Segments that do not line up (a segment that died before its first step): continuous time.
        cont = np.zeros(len(t))
        off = 0.0
        for i in range(len(t)):
            if i and t[i] < t[i - 1]:
                off = cont[i - 1]
            cont[i] = t[i] + off
        j = np.searchsorted(self.cont, cont, side="right")
        steps = np.where(j > 0, self.step[np.maximum(j - 1, 0)], 0)
        return steps, self.seg_wall[0] + cont

    def wall_of_steps(self, steps):
        """Wall times of given step numbers (an /eval row: right after its step)."""
        steps = np.asarray(steps, dtype=float)
        if not len(self.step):
            return np.full(len(steps), self.seg_wall[0])
        return np.interp(steps, self.step.astype(float), self.wall)


def _binned(tag, steps, values, wall):
    """One point per step: the mean of the samples that fall on it, at the last one's wall time."""
    values = np.asarray(values, dtype=float)
    ok = np.isfinite(values)
    steps, values, wall = steps[ok], values[ok], wall[ok]
    if not len(steps):
        return Series(tag, [], [], [])
    u, inv = np.unique(steps, return_inverse=True)
    n = np.bincount(inv)
    mean = np.bincount(inv, weights=values) / n
    last = np.full(len(u), -np.inf)
    np.maximum.at(last, inv, wall)
    return Series(tag, u, mean, last)


def intervals(run):
    """Report intervals from /ranks: [(segment, start_s, end_s, target batches, drafter batches)], each
    interval's rows being consecutive (every rank at one time)."""
    r = run.ranks
    if not len(r.get("time_s", [])):
        return []
    t, iv, role, batches = (np.asarray(r[k]) for k in ("time_s", "interval", "role", "batches"))
    out = []
    seg, prev_end = 0, 0.0
    i = 0
    while i < len(t):
        j = i
        while j < len(t) and iv[j] == iv[i] and t[j] == t[i]:
            j += 1
        if out and (iv[i] == 0 or t[i] < out[-1][2]):  # a new segment: interval 0 again, or the clock restarted
            seg, prev_end = seg + 1, 0.0
        rows = slice(i, j)
        out.append((seg, prev_end, float(t[i]), int(batches[rows][role[rows] == ROLE_TARGET].sum()),
                    int(batches[rows][role[rows] == ROLE_DRAFTER].sum())))
        prev_end = float(t[i])
        i = j
    return out


def interval_throughput(run, tl=None):
    """Per report interval (None without /ranks rows): segment, start and end (s on its segment's clock), dt,
    elapsed (its end, continuous across resumes), steps done and wall time at its end, target and drafter
    batches, and the tokens of the steps finished in it (None without /steps/tokens or time_s)."""
    tl = tl or Timeline(run)
    ivs = intervals(run)
    if not ivs:
        return None
    seg = np.array([x[0] for x in ivs])
    start, end = np.array([x[1] for x in ivs]), np.array([x[2] for x in ivs])
    if int(seg.max()) + 1 == tl.nseg or not len(tl.step):  # the segments line up: each on its own clock
        steps, wall = _steps_at_segment_times(tl, seg, end)
        elapsed = end + tl.cont_offsets[np.minimum(seg, tl.nseg - 1)]
    else:  # else on the continuous clock
        steps, wall = tl.at(end)
        elapsed = wall - tl.seg_wall[0]
    st = run.steps
    tokens = None
    if "tokens" in st and tl.has_time and len(st["tokens"]) == len(tl.step):
        tok = np.asarray(st["tokens"], dtype=float)
        tokens = np.zeros(len(ivs))
        for k in np.unique(seg):  # per segment: the tokens of its steps with start < time_s <= end
            rows = np.flatnonzero(tl.seg == k)
            m = seg == k
            cum = np.concatenate([[0.0], np.cumsum(tok[rows])])
            t = tl.t[rows]
            tokens[m] = cum[np.searchsorted(t, end[m], side="right")] - cum[np.searchsorted(t, start[m], side="right")]
    return {"segment": seg, "start": start, "end": end, "dt": end - start, "elapsed": elapsed, "steps": steps,
            "wall": wall, "target_batches": np.array([x[3] for x in ivs], dtype=float),
            "drafter_batches": np.array([x[4] for x in ivs], dtype=float), "tokens": tokens}


def scalar_series(run):
    """Every scalar series of the run as Series, in the order of the module docstring."""
    tl = Timeline(run)
    st = run.steps
    out = []
    for k in STEP_SERIES:
        if k in st and np.ndim(st[k]) == 1 and len(st[k]) == len(tl.step):
            out.append(Series(f"train/{k}", tl.step, st[k], tl.wall))

    # throughput per report interval: its steps' tokens and its drafters'/targets' batches over its length
    th = interval_throughput(run, tl)
    if th is not None:
        ok = th["dt"] > 0
        steps, wall, dt = th["steps"][ok], th["wall"][ok], th["dt"][ok]
        if th["tokens"] is not None:
            out.append(Series("throughput/trained_ktok_per_s", steps, th["tokens"][ok] / dt / 1000.0, wall))
        out.append(Series("throughput/trained_batches_per_s", steps, th["drafter_batches"][ok] / dt, wall))
        out.append(Series("throughput/produced_batches_per_s", steps, th["target_batches"][ok] / dt, wall))

    q = run.queues
    if len(q.get("time_s", [])):
        qs, qw = tl.at(q["time_s"])
        for name in ("q_hs", "q_pre"):
            a = np.asarray(q.get(name, np.zeros((0, 0))), dtype=float)
            if a.ndim == 2 and a.shape[0] == len(qs) and a.shape[1] > 0:
                out.append(_binned(f"queues/{name}_mean", qs, a.mean(axis=1), qw))
                out.append(_binned(f"queues/{name}_min", qs, a.min(axis=1), qw))

    ev = run.eval or {}
    if len(ev.get("step", [])):
        es = np.asarray(ev["step"], dtype=np.int64)
        ew = tl.wall_of_steps(es)
        for k in EVAL_SERIES:
            if k in ev and np.ndim(ev[k]) == 1 and len(ev[k]) == len(es):
                out.append(Series(f"eval/{k}", es, ev[k], ew))

    if run.gpu_available:
        g = run.gpus
        gs, gw = tl.at(g["time_s"])
        p = np.asarray(g["power_w"], dtype=float)
        owners = _gpu_column_ranks(run, p.shape[1])
        roles = np.array([run.role_of_rank.get(o, -1) for o in owners])
        out.append(_binned("power/total_w", gs, p.sum(axis=1), gw))
        for role, name in ((ROLE_TARGET, "targets"), (ROLE_DRAFTER, "drafters")):
            if np.any(roles == role):
                out.append(_binned(f"power/{name}_w", gs, p[:, roles == role].sum(axis=1), gw))
        if "util_pct" in g and np.shape(g["util_pct"]) == p.shape:
            out.append(_binned("gpu/util_pct_mean", gs, np.asarray(g["util_pct"], dtype=float).mean(axis=1), gw))
        if "mem_used_mib" in g and np.shape(g["mem_used_mib"]) == p.shape:
            out.append(_binned("gpu/mem_used_mib_max", gs, np.asarray(g["mem_used_mib"], dtype=float).max(axis=1),
                               gw))
    return [s for s in out if len(s)]


def _steps_at_segment_times(tl, seg, t):
    """(steps done, wall) at time t of segment seg, per element."""
    seg, t = np.asarray(seg), np.asarray(t, dtype=float)
    steps = np.zeros(len(t), dtype=np.int64)
    wall = np.zeros(len(t))
    for k in np.unique(seg):
        m = seg == k
        rows = np.flatnonzero(tl.seg == k)
        if len(rows):
            j = np.searchsorted(tl.t[rows], t[m], side="right")
            before = tl.step[rows[0] - 1] if rows[0] > 0 else 0
            steps[m] = np.where(j > 0, tl.step[rows[np.maximum(j - 1, 0)]], before)
        else:
            earlier = np.flatnonzero(tl.seg < k)
            steps[m] = tl.step[earlier[-1]] if len(earlier) else 0
        wall[m] = tl.seg_wall[min(int(k), tl.nseg - 1)] + t[m]
    return steps, wall


# ---- TensorBoard ------------------------------------------------------------------------------------------

def _crc32c_table():
    poly = 0x82F63B78  # Castagnoli, reflected
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE = _crc32c_table()


def crc32c_many(chunks):
    """CRC-32C of each bytes object in chunks; those of one length are computed together (numpy, a column
    of bytes at a time), which keeps a pure-Python writer fast on a run of a million steps."""
    out = [0] * len(chunks)
    by_len = {}
    for i, c in enumerate(chunks):
        by_len.setdefault(len(c), []).append(i)
    for n, idx in by_len.items():
        data = np.frombuffer(b"".join(chunks[i] for i in idx), dtype=np.uint8).reshape(len(idx), n)
        crc = np.full(len(idx), 0xFFFFFFFF, dtype=np.uint32)
        for col in range(n):
            crc = _CRC_TABLE[(crc ^ data[:, col]) & 0xFF] ^ (crc >> np.uint32(8))
        crc ^= np.uint32(0xFFFFFFFF)
        for i, v in zip(idx, crc.tolist()):
            out[i] = v
    return out


def crc32c(data):
    return crc32c_many([bytes(data)])[0]


def masked_crc32c(crc):
    """TFRecord's mask of a CRC (so a CRC stored in the data does not checksum to itself)."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_SMALL = [bytes((i,)) for i in range(0x80)]


def _varint(n):
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= (1 << 64) - 1  # int64 as protobuf encodes it (a negative one takes 10 bytes)
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number, wire, payload):
    return _varint(number << 3 | wire) + payload


def _length_delimited(number, data):
    return _field(number, 2, _varint(len(data)) + data)


def encode_event(wall_time, step=None, file_version=None, scalar=None, session_start=False):
    """tensorflow.Event: wall_time (1, double), step (2, int64), file_version (3, string), summary (5):
    Summary.value (1): Summary.Value tag (1, string), simple_value (2, float); session_log (7): SessionLog
    status (1, enum: START = 1). The bytes tensorboardX writes for the same event (tests/report/test_export.py
    compares them)."""
    out = _field(1, 1, struct.pack("<d", wall_time))
    if step:  # proto3 leaves a field at its default (0) out, as TensorFlow's and tensorboardX's writers do
        out += _field(2, 0, _varint(int(step)))
    if file_version is not None:
        out += _length_delimited(3, file_version.encode())
    if scalar is not None:
        tag, value = scalar
        v = _length_delimited(1, tag.encode()) + _field(2, 5, struct.pack("<f", value))
        out += _length_delimited(5, _length_delimited(1, v))
    if session_start:
        out += _length_delimited(7, _field(1, 0, _varint(1)))
    return out


def tfrecords(payloads):
    """TFRecord framing: uint64 length, masked CRC-32C of the length, the data, masked CRC-32C of the data."""
    heads = [struct.pack("<Q", len(p)) for p in payloads]
    crcs = crc32c_many(heads + list(payloads))
    n = len(payloads)
    return b"".join(h + struct.pack("<I", masked_crc32c(crcs[i])) + p + struct.pack("<I", masked_crc32c(crcs[n + i]))
                    for i, (h, p) in enumerate(zip(heads, payloads)))


def event_file_name(logdir, wall=None):
    wall = time.time() if wall is None else wall
    return os.path.join(logdir, f"events.out.tfevents.{int(wall):010d}.{socket.gethostname()}.{os.getpid()}"
                                f"{EVENT_SUFFIX}")


class BuiltinEventWriter:
    """TensorBoard's event file written here (no TensorFlow, tensorboard or protobuf needed)."""

    name = "builtin"

    def __init__(self, logdir):
        now = time.time()
        self.path = event_file_name(logdir, now)
        self.events = [encode_event(now, file_version="brain.Event:2")]
        self.tags = {}

    def add_session_start(self, walltime):
        self.events.append(encode_event(walltime, session_start=True))

    def add_scalar(self, tag, value, step, walltime):
        # = encode_event(walltime, step=step, scalar=(tag, value)), its tag's bytes made once
        head = self.tags.get(tag)
        if head is None:
            head = self.tags[tag] = _length_delimited(1, tag.encode()) + _varint(2 << 3 | 5)
        value = head + struct.pack("<f", value)
        summary = b"\x0a" + _varint(len(value)) + value
        step = b"\x10" + _varint(int(step)) if step else b""
        self.events.append(b"\x09" + struct.pack("<d", walltime) + step + b"\x2a" + _varint(len(summary)) + summary)

    def close(self):
        with open(self.path, "wb") as f:
            for i in range(0, len(self.events), 100000):
                f.write(tfrecords(self.events[i:i + 100000]))


class _LibraryWriter:
    def __init__(self, cls, logdir, name):
        self.name = name
        # a long queue: the default (10) flushes so often that it doubles the time of a long run's export
        self.w = cls(logdir, max_queue=10000, flush_secs=600)

    def add_session_start(self, walltime):
        if self.name == "tensorboardX":
            from tensorboardX.proto.event_pb2 import Event, SessionLog
        else:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        self.w._get_file_writer().add_event(Event(session_log=SessionLog(status=SessionLog.START)),
                                            walltime=float(walltime))

    def add_scalar(self, tag, value, step, walltime):
        self.w.add_scalar(tag, float(value), int(step), walltime=float(walltime))

    def close(self):
        self.w.close()


def tensorboard_writer(logdir, which="auto"):
    """The writer to use: tensorboardX, else torch.utils.tensorboard, else the built-in one ('auto');
    or the one named. ImportError when a named library is missing."""
    if which in ("auto", "tensorboardx"):
        try:
            from tensorboardX import SummaryWriter
            return _LibraryWriter(SummaryWriter, logdir, "tensorboardX")
        except ImportError:
            if which != "auto":
                raise
    if which in ("auto", "torch"):
        try:
            from torch.utils.tensorboard import SummaryWriter
            return _LibraryWriter(SummaryWriter, logdir, "torch.utils.tensorboard")
        except ImportError:
            if which != "auto":
                raise
    return BuiltinEventWriter(logdir)


def write_tensorboard(run, logdir, which="auto"):
    """Writes the run's series to one event file in logdir, replacing the one this tool wrote there before
    (a TensorBoard that is watching moves on to the new file, whose START event drops what it had). The whole
    directory is staged afresh and renamed into place (safe_out.StagedDir: never through a link planted at
    logdir, and nothing a link points at is deleted); the newest earlier file is carried over as a hard link
    (a TensorBoard reading it must finish it before it moves on to the new one), the older ones go with the
    old directory. Returns a summary (file, writer, series, points, tags)."""
    series = scalar_series(run)
    with safe_out.StagedDir(logdir) as stage:
        before = []
        if stage.old_fd is not None:
            before = sorted(n for n in os.listdir(stage.old_fd)
                            if n.startswith("events.out.tfevents.") and n.endswith(EVENT_SUFFIX))
        # Carried over as the same files (hard links: not written), plain files only: the newest earlier export
        # and every file that is not one of ours (someone else's stays); our older exports go with the old
        # directory.
        keep = [] if stage.old_fd is None else [
            n for n in os.listdir(stage.old_fd) if not n.startswith(".") and (n == (before[-1] if before else None)
                                                                                 or not n.endswith(EVENT_SUFFIX))]
        for n in keep:
            st = os.stat(n, dir_fd=stage.old_fd, follow_symlinks=False)
            if st.st_mode & 0o170000 == 0o100000:
                os.link(n, n, src_dir_fd=stage.old_fd, dst_dir_fd=stage.fd, follow_symlinks=False)
        scratch = ".dflash-report.scratch"
        os.mkdir(scratch, 0o700, dir_fd=stage.fd)
        w = tensorboard_writer(os.path.join(stage.path, scratch), which)
        # SessionLog START (at step 0, the run's start): a TensorBoard that read an earlier export drops its
        # points from step 0 on when it moves on to this file, instead of showing both
        w.add_session_start(min([float(s.wall.min()) for s in series if len(s)] + [time.time()]))
        # step by step over all series (TensorBoard reads a step going back as a restart and drops what follows)
        steps = np.concatenate([s.steps for s in series] + [np.zeros(0, dtype=np.int64)])
        which = np.concatenate([np.full(len(s), k) for k, s in enumerate(series)] + [np.zeros(0, dtype=int)])
        index = np.concatenate([np.arange(len(s)) for s in series] + [np.zeros(0, dtype=int)])
        if w.name != "builtin" and len(steps) > 500000:
            sys.stderr.write(f"dflash-report: writing {len(steps)} points with {w.name} (about "
                             f"{max(1, round(len(steps) * 1e-4 / 60))} min; --tensorboard-writer builtin writes the "
                             "same records about 10x faster)\n")
        values = [s.values.tolist() for s in series]
        walls = [s.wall.tolist() for s in series]
        tags = [s.tag for s in series]
        for j in np.lexsort((index, which, steps)).tolist():
            k, i = int(which[j]), int(index[j])
            w.add_scalar(tags[k], values[k][i], int(steps[j]), walls[k][i])
        points = len(steps)
        w.close()
        scratch_fd = os.open(scratch, safe_out.DIR_FLAGS, dir_fd=stage.fd)
        try:
            (made,) = [n for n in os.listdir(scratch_fd) if "tfevents" in n]
            wall = time.time()
            name = os.path.basename(event_file_name(logdir, wall))
            while before and name <= before[-1]:  # TensorBoard reads the files in name order: this one goes last
                wall += 1
                name = os.path.basename(event_file_name(logdir, wall))
            os.rename(made, name, src_dir_fd=scratch_fd, dst_dir_fd=stage.fd)
        finally:
            os.close(scratch_fd)
        os.rmdir(scratch, dir_fd=stage.fd)
    return {"dir": logdir, "file": os.path.join(logdir, name), "writer": w.name, "series": len(series),
            "points": points, "tags": [s.tag for s in series]}


# ---- CSV --------------------------------------------------------------------------------------------------

def _cell(v):
    if isinstance(v, (np.integer, int)):
        return str(int(v))
    v = float(v)
    return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))


def _iso(wall):
    return datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


def step_table(run):
    """(header, rows): one row per /steps row: step, time_s, elapsed_s (continuous across resumes),
    wall_time (s since the epoch), utc, every 1-D /steps series, acc_pos_<k> per block position, and the
    /eval row of that step when there is one (eval_<name>, empty on other steps)."""
    tl = Timeline(run)
    st = run.steps
    n = len(tl.step)
    one_d = [k for k in st if np.ndim(st[k]) == 1 and len(st[k]) == n and k != "block_position"]
    cols = [k for k in CSV_FIRST if k in one_d] + sorted(k for k in one_d if k not in CSV_FIRST)
    header = cols[:1] + (["time_s"] if "time_s" in cols else []) + ["elapsed_s", "wall_time", "utc"] + \
        [c for c in cols[1:] if c != "time_s"]
    data = {k: st[k] for k in cols}
    data["elapsed_s"] = tl.cont
    data["wall_time"] = tl.wall
    pos = st.get("acc_by_pos")
    if pos is not None and np.ndim(pos) == 2 and pos.shape[0] == n:
        labels = st.get("block_position")
        labels = list(labels) if labels is not None and len(labels) == pos.shape[1] else range(1, pos.shape[1] + 1)
        for j, k in enumerate(labels):
            header.append(f"acc_pos_{int(k)}")
            data[header[-1]] = pos[:, j]
    ev = run.eval or {}
    eval_cols = []
    if len(ev.get("step", [])):
        row_of = {int(s): i for i, s in enumerate(ev["step"])}
        for k in sorted(ev):
            if k != "step" and np.ndim(ev[k]) == 1 and len(ev[k]) == len(ev["step"]):
                eval_cols.append(k)
                header.append(f"eval_{k}")
    rows = []
    for i in range(n):
        row = []
        for h in header:
            if h == "utc":
                row.append(_iso(tl.wall[i]))
            elif h.startswith("eval_") and h[5:] in eval_cols:
                j = row_of.get(int(tl.step[i]))
                row.append("" if j is None else _cell(ev[h[5:]][j]))
            else:
                row.append(_cell(data[h][i]))
        rows.append(row)
    return header, rows


def time_tables(run):
    """The series sampled in time, as CSV tables {name: (header, rows)}: intervals (throughput), queues (every
    column), eval (every /eval series), power (every GPU's power, utilisation and memory)."""
    tl = Timeline(run)
    out = {}
    th = interval_throughput(run, tl)
    if th is not None:
        header = ["segment", "interval", "start_s", "end_s", "elapsed_s", "steps_done", "wall_time", "target_batches",
                  "drafter_batches", "tokens", "produced_batches_per_s", "trained_batches_per_s", "trained_ktok_per_s"]
        rows, k_in_seg = [], {}
        for i in range(len(th["dt"])):
            s = int(th["segment"][i])
            k_in_seg[s] = k_in_seg.get(s, -1) + 1
            dt = th["dt"][i]
            tok = None if th["tokens"] is None else th["tokens"][i]
            rate = (lambda x: _cell(x / dt) if dt > 0 and x is not None else "")  # noqa: E731
            rows.append([str(s), str(k_in_seg[s]), _cell(th["start"][i]), _cell(th["end"][i]), _cell(th["elapsed"][i]),
                         str(int(th["steps"][i])), _cell(th["wall"][i]), str(int(th["target_batches"][i])),
                         str(int(th["drafter_batches"][i])), "" if tok is None else str(int(tok)),
                         rate(th["target_batches"][i]), rate(th["drafter_batches"][i]),
                         rate(None if tok is None else tok / 1000.0)])
        out["intervals"] = (header, rows)
    q = run.queues
    if len(q.get("time_s", [])):
        steps, wall = tl.at(q["time_s"])
        header = ["time_s", "steps_done", "wall_time"]
        mats = []
        for name, what in (("q_hs", "drafter"), ("q_pre", "target")):
            a = q.get(name)
            if a is not None and np.ndim(a) == 2 and a.shape[0] == len(steps):
                header += [f"{name}_{what}{j}" for j in range(a.shape[1])]
                mats.append(a)
        rows = [[_cell(q["time_s"][i]), str(int(steps[i])), _cell(wall[i])] + [_cell(v) for m in mats for v in m[i]]
                for i in range(len(steps))]
        out["queues"] = (header, rows)
    ev = run.eval or {}
    if len(ev.get("step", [])):
        cols = ["step"] + sorted(k for k in ev if k != "step" and np.ndim(ev[k]) == 1 and len(ev[k]) == len(ev["step"]))
        out["eval"] = (cols, [[_cell(ev[k][i]) for k in cols] for i in range(len(ev["step"]))])
    if run.gpu_available:
        g = run.gpus
        steps, wall = tl.at(g["time_s"])
        header = ["time_s", "steps_done", "wall_time"]
        mats = []
        for name in ("power_w", "util_pct", "mem_used_mib"):
            a = g.get(name)
            if a is not None and np.ndim(a) == 2 and a.shape[0] == len(steps):
                header += [f"gpu{j}_{name}" for j in range(a.shape[1])]
                mats.append(a)
        rows = [[_cell(g["time_s"][i]), str(int(steps[i])), _cell(wall[i])] + [_cell(v) for m in mats for v in m[i]]
                for i in range(len(steps))]
        out["power"] = (header, rows)
    return out


def _csv_writer(header, rows):
    def write(f):
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return write


def write_csv(run, target, as_dir):
    """as_dir False: the step table to the file target. True: target/steps.csv and the tables of time_tables
    (intervals.csv, queues.csv, eval.csv, power.csv: those the run has), the directory staged afresh and
    renamed into place (safe_out.StagedDir). Never through a link at target. Returns the paths written."""
    header, rows = step_table(run)
    if not as_dir:
        safe_out.replace_file(target, _csv_writer(header, rows))
        return [target]
    paths = [os.path.join(target, "steps.csv")]
    with safe_out.StagedDir(target) as stage:
        safe_out.write_file(stage.fd, "steps.csv", _csv_writer(header, rows))
        for name, (h, r) in time_tables(run).items():
            paths.append(os.path.join(target, f"{name}.csv"))
            safe_out.write_file(stage.fd, f"{name}.csv", _csv_writer(h, r))
    return paths


# ---- Weights & Biases -------------------------------------------------------------------------------------

def wandb_rows(run):
    """[(step, {tag: value, '_timestamp': wall})] in step order: every series' points of a step in one row."""
    rows, walls = {}, {}
    for s in scalar_series(run):
        for step, v, w in zip(s.steps.tolist(), s.values.tolist(), s.wall.tolist()):
            rows.setdefault(step, {})[s.tag] = v
            walls.setdefault(step, {})[s.tag] = w
    for step, row in rows.items():  # the step's own time where it has one, else its latest sample's
        w = walls[step]
        row["_timestamp"] = w.get("train/loss", max(w.values()))
    return sorted(rows.items())


def run_config(run):
    """What W&B keeps as the run's config: the split, the machine, the source, every option."""
    cfg = {"topology": run.topology, "backend": run.backend, "nodes": run.nodes, "gpus_per_node": run.gpus_per_node,
           "metrics_file": os.path.abspath(run.path)}
    for k in ("git_commit", "version", "start_utc", "command_line", "dataset_tokens", "host_cpu_cores"):
        if run.attrs.get(k) is not None:
            cfg[k] = run.attrs[k]
    cfg["options"] = dict(run.options)
    return cfg


WANDB_HOST = "api.wandb.ai"


def wandb_mode(environ=None, home=None):
    """(mode, why): WANDB_MODE when set; else online where this environment is logged in to W&B (WANDB_API_KEY
    set, or `wandb login`'s entry for its host in the netrc file, $NETRC or ~/.netrc); else offline (`wandb
    sync DIR` uploads it later)."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"], "WANDB_MODE"
    if env.get("WANDB_API_KEY"):
        return "online", "WANDB_API_KEY is set"
    host = WANDB_HOST
    base = env.get("WANDB_BASE_URL")
    if base:
        host = base.split("://", 1)[-1].split("/", 1)[0].split(":", 1)[0] or host
    netrc = env.get("NETRC") or os.path.join(home or os.path.expanduser("~"), ".netrc")
    try:
        with open(netrc) as f:
            words = f.read().split()
    except OSError:
        words = []
    if any(words[i] == "machine" and words[i + 1] == host for i in range(len(words) - 1)):
        return "online", f"logged in ({netrc} has {host})"
    return "offline", "not logged in (no WANDB_API_KEY, no wandb login)"


def write_wandb(run, project, name, directory=None, mode=None):
    """Logs the run to W&B in wandb_mode()'s mode (an online start that fails, e.g. without network, is
    logged offline instead and says so), into DIRECTORY/wandb/<run>/ (DIRECTORY: default $WANDB_DIR, else the
    current directory). Returns a summary (mode, why, the run's directory, id, rows); raises whatever wandb
    raises when the run cannot be logged at all, and safe_out.Refused for a link or a file at DIRECTORY/wandb.

    W&B writes its directory by path, from its own service process, until that process ends: were it given
    DIRECTORY (a shared --out), a link swapped in at DIRECTORY/wandb while it writes would be followed. So it
    writes into a private directory of ours (tempfile.mkdtemp under $TMPDIR: mode 0700, nobody else can
    plant anything there), the export waits until W&B's service has ended (_wandb_done), and the finished
    tree is then copied into DIRECTORY/wandb the way csv/ and tensorboard/ are written (safe_out.StagedDir:
    staged in a fresh directory beside it, through descriptors, renamed in; the earlier runs there carried
    over as hard links), and the private directory removed (docs/metrics.md "The run directory")."""
    import wandb
    why = "asked"
    if not mode:
        mode, why = wandb_mode()
    want = {"silent": True, "console": "off", "save_code": False, "disable_git": True, "x_disable_stats": True,
            "x_disable_meta": True, "x_disable_machine_info": True}
    fields = getattr(wandb.Settings, "model_fields", {})
    settings = wandb.Settings(**{k: v for k, v in want.items() if k in fields}) if fields else None
    rows = wandb_rows(run)
    out = os.path.join(directory or os.environ.get("WANDB_DIR") or os.getcwd(), "wandb")
    safe_out.refuse_non_directory(out)  # before W&B runs at all; StagedDir checks again when it copies in
    # our own service, the one _wandb_done waits for (not one a parent process shares through this variable)
    os.environ.pop("WANDB_SERVICE", None)
    private = tempfile.mkdtemp(prefix="dflash-report-wandb.")
    try:
        try:
            summary = _wandb_log(wandb, run, rows, project, name, private, mode, why, settings)
        finally:  # also after a failed start: its service must not write the directory while it is removed
            _wandb_done(wandb)
        summary["dir"] = _wandb_copy_in(os.path.join(private, "wandb"), out, summary["dir"])
    finally:
        shutil.rmtree(private, ignore_errors=True)
    return summary


def _wandb_done(wandb):
    """Returns once W&B's service process has ended (wandb.teardown waits for the process it started), so
    nothing writes the private directory any more, the run's .wandb log included."""
    teardown = getattr(wandb, "teardown", None)
    if teardown is None:  # an older wandb without it: run.finish() is all there is to wait for
        return
    try:
        teardown()
    except SystemExit as e:  # wandb's teardown exits the process when its service failed: say it instead
        raise RuntimeError(f"W&B's service process ended with exit code {e.code}: the run may be incomplete") from None


def _wandb_copy_in(private, out, run_dir):
    """The finished tree PRIVATE (W&B's wandb/ directory: the run's directory, its latest-run and debug*.log
    links) copied into OUT, staged and renamed in (safe_out.StagedDir; the earlier runs at OUT carried over
    as hard links, W&B's links at the top replaced by the new run's). Returns the run's directory in OUT."""
    with safe_out.StagedDir(out) as stage:
        src = os.open(private, safe_out.DIR_FLAGS) if os.path.isdir(private) else None
        try:
            new = os.listdir(src) if src is not None else []
            if stage.old_fd is not None:
                safe_out.copy_tree(stage.old_fd, stage.fd, safe_out.link_file, skip=set(new))
            if src is not None:
                safe_out.copy_tree(src, stage.fd, safe_out.copy_file)
        finally:
            if src is not None:
                os.close(src)
    return os.path.join(out, os.path.basename(run_dir)) if run_dir else None


def _wandb_log(wandb, run, rows, project, name, directory, mode, why, settings):
    init = dict(project=project, name=name, dir=directory, config=run_config(run), tags=[run.topology, run.backend],
                settings=settings)
    try:
        r = wandb.init(mode=mode, **init)
    except Exception as e:  # noqa: BLE001 (wandb raises its own types; any failure to go online)
        if mode != "online":
            raise
        mode, why = "offline", f"online failed ({type(e).__name__}: {e})"
        r = wandb.init(mode=mode, **init)
    try:
        for step, row in rows:
            r.log(row, step=int(step))
        run_dir = os.path.dirname(r.dir) if r.dir else None
        rid = r.id
    finally:
        r.finish()
    return {"mode": mode, "why": why, "dir": run_dir, "id": rid, "project": project, "name": name, "rows": len(rows)}
