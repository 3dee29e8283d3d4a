"""Reads metrics.h5 (layout: docs/metrics.md) into plain numpy arrays and the run's attributes."""

import json
import os
import stat

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # read a file the job is still writing

import h5py  # noqa: E402
import numpy as np  # noqa: E402

from .model import MAX_GPUS_PER_NODE  # noqa: E402

ROLE_TARGET, ROLE_DRAFTER, ROLE_IDLE = 0, 1, 2

# metrics.h5's format_version this reader knows (docs/metrics.md): 1 (no version attribute either), 2
# (dimension scales, the role enum, /steps/epoch and acc_by_pos, /options). A newer file is refused.
FORMAT_VERSIONS = (1, 2)
# The NAME netCDF-4 gives a dimension scale that holds no values (/ranks/row, /queues/sample, ...).
_DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"


# Plausibility bounds of the run's sizes (gpus_per_node: model.MAX_GPUS_PER_NODE). The what-if iterates over
# every split of gpus_per_node, so a size from a damaged file (1e9) must be refused before anything uses it.
MAX_NODES = 1 << 16
MAX_HOST_CPU_CORES = 1 << 16

# /ranks' timings are what every service rate, the observed rate and so the verdict are built from; the writer
# never puts NaN or infinity in them, so one there is damage, and no verdict can stand on it (exit 3).
VERDICT_SERIES = ("interval", "time_s", "rank", "role", "batches", "busy_s", "wait_s")
# Series the report can do without: (group, the series tested, the series left out when one of them is not
# finite, what the report does without them). It says what it left out (Run.unusable) instead of printing
# NaN or building a number on it.
OPTIONAL_SERIES = (
    ("ranks", ("allreduce_s",), ("allreduce_s",), "the allreduce cost is modelled as not measured"),
    ("ranks", ("compute_s",), ("compute_s",), "no compute share"),
    ("ranks", ("credit_wait_s",), ("credit_wait_s",), "no credit-wait share"),
    ("ranks", ("data_wait_s",), ("data_wait_s",), "no data-wait share"),
    ("ranks", ("optimizer_s",), ("optimizer_s",), "no optimizer share"),
    ("steps", ("tokens",), ("tokens",), "tokens per batch from --token-budget, no ETA from the epochs"),
    # the anchors what-if places the steps in the report intervals by their time
    ("steps", ("time_s",), ("time_s", "anchors"), "no steady window for the steps, no anchors what-if"),
    ("steps", ("anchors",), ("anchors",), "no anchors what-if"),
    ("queues", ("time_s", "q_hs", "q_pre"), ("time_s", "q_hs", "q_pre"), "no queue statistics"),
    ("gpus", ("time_s", "power_w"), ("time_s", "power_w"), "no power data"),
)
# Numeric attributes the report computes with; a non-finite one is left out as if not recorded.
OPTIONAL_NUMBERS = ("gpu_idle_power_w", "dataset_tokens", "drafter_grad_bytes", "allreduce_bytes_per_s")

# /segments (docs/metrics.md "Segments"): one row per job start that opened the file. kind: what the start
# was. Files written before the table have none: their segments are found by /ranks' interval restarting.
SEGMENT_KINDS = {0: "start", 1: "resume", 2: "resplit", 3: "rebalance"}
SEGMENT_REQUIRED = ("first_step", "kind", "nodes", "targets_per_node", "drafters_per_node")
SEGMENT_OPTIONAL = ("world_size", "grad_accum", "unix_time_s")


def _interval_rule(iv):
    """Segment index of each /ranks row of a file without /ranks/segment: a new segment where the interval
    number goes back (every job start reports from interval 0 again)."""
    iv = np.asarray(iv)
    if not len(iv):
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(iv[1:] < iv[:-1])]).astype(np.int64)


class ReportError(Exception):
    """A problem with the input the operator can fix (printed without a traceback, exit 3)."""


def not_finite(values):
    """'all 24 values' / '3 of 24 values' when a float series holds NaN or infinity, else None."""
    a = np.asarray(values)
    if a.dtype.kind not in "fc" or a.size == 0:
        return None  # integers are always finite; strings and the like are damage the callers meet
    bad = int(a.size - np.count_nonzero(np.isfinite(a)))
    if not bad:
        return None
    return f"all {a.size} values" if bad == a.size else f"{bad} of {a.size} values"


def _count(path, name, value, lo, hi, what):
    """An attribute that is a size: an integer in lo..hi, else the file is damaged (ReportError)."""
    try:
        ok = float(value) == int(value) and lo <= int(value) <= hi
    except (TypeError, ValueError, OverflowError):  # not a number, NaN, infinity
        ok = False
    if not ok:
        raise ReportError(f"{path}: attribute {name} = {value!r} is not a plausible {what} ({lo}..{hi}): a damaged "
                          "metrics file")
    return int(value)


def _attr(obj, name, default=None):
    if name not in obj.attrs:
        return default
    v = obj.attrs[name]
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, np.ndarray) and v.size == 1:
        v = v.reshape(-1)[0]
    if isinstance(v, np.generic):
        return v.item()
    return v


def _series(group):
    """The group's datasets as arrays: not its committed types (/ranks/role_t) nor its value-less dimensions."""
    out = {}
    for k, v in group.items():
        if not isinstance(v, h5py.Dataset):
            continue
        name = v.attrs.get("NAME", b"")
        if _DIMENSION_ONLY in (name.encode() if isinstance(name, str) else bytes(name)):
            continue
        out[k] = np.asarray(v[()])
    return out


def _json_attr(f, name, default):
    text = _attr(f, name)
    if text is None:
        return default
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return default


class Run:
    """Everything the report needs from one metrics file."""

    def __init__(self, path):
        self.path = path
        if not os.path.exists(path):
            raise ReportError(f"{path}: no such file (give the run's metrics.h5, e.g. RUN/metrics.h5)")
        # A FIFO or device at the path (planted in a shared run directory) would block HDF5's open for ever:
        # opened without blocking (O_NONBLOCK), checked (fstat), and HDF5 handed /proc/self/fd/N, the very
        # file checked (as dflash-train opens metrics.h5, include/dflash/safe_file.h's PinnedPath).
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise ReportError(f"{path}: cannot be opened ({e})")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ReportError(f"{path}: not a regular file (a FIFO, device or socket): refused")
            pinned = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else path
            try:
                f = h5py.File(pinned, "r")
            except OSError as e:
                raise ReportError(f"{path}: not a readable HDF5 metrics file ({e})")
        finally:
            os.close(fd)
        with f:
            self.format_version = int(_attr(f, "format_version", 1))
            if self.format_version not in FORMAT_VERSIONS:
                raise ReportError(f"{path}: metrics format_version {self.format_version}, this dflash-report reads "
                                  f"{', '.join(map(str, FORMAT_VERSIONS))}: use the dflash-report of the dflash-train "
                                  "that wrote it")
            for group in ("steps", "ranks", "queues"):
                if group not in f:
                    raise ReportError(f"{path}: no /{group} group: not a dflash-train metrics.h5")
            self.steps = _series(f["steps"])
            self.ranks = _series(f["ranks"])
            self.queues = _series(f["queues"])
            g = f["gpus"] if "gpus" in f else None
            self.gpu_available = bool(g is not None and _attr(g, "available", 0) and "power_w" in g
                                      and g["power_w"].shape[0] > 0)
            self.gpu_reason = (_attr(g, "reason", "") if g is not None else "") or ""
            if self.gpu_available:
                self.gpus = _series(g)
            else:
                self.gpus = {}
                if not self.gpu_reason:
                    self.gpu_reason = "no GPU power readings in the file"
            self.attrs = {k: _attr(f, k) for k in f.attrs}
            self.options = _json_attr(f, "options", {})
            self.rank_cards = _json_attr(f, "ranks", [])
            self.auto_topology = _json_attr(f, "auto_topology", None)  # --topology auto's measurement + choice
            self.layout_plan = _json_attr(f, "layout_plan", None)  # the cost model's plan at start (forecast.py)
            # --eval-data's held-out rows (docs/metrics.md "/eval"); {} in runs without it
            self.eval = ({k: np.asarray(v[()]) for k, v in f["eval"].items() if isinstance(v, h5py.Dataset)}
                         if "eval" in f else {})
            # the segment table (None in files written before it); /segments/K/{queues,gpus} are not read
            self.segments = self._read_segments(f["segments"]) if isinstance(f.get("segments"), h5py.Group) else None
        self._check_finite()
        self._find_segments()
        self._derive_layout()

    def _read_segments(self, g):
        """/segments' rows as dicts (index, first_step, kind, kind_name, nodes, targets_per_node,
        drafters_per_node, topology, world_size, grad_accum, unix_time_s; None for a series the file lacks).
        The series can differ in length by one row (a flush between them): the rows all of them have count."""
        series = _series(g)
        missing = [k for k in SEGMENT_REQUIRED if k not in series]
        if missing:
            raise ReportError(f"{self.path}: /segments lacks {', '.join('/segments/' + k for k in missing)}: a "
                              "damaged metrics file")
        present = [k for k in SEGMENT_REQUIRED + SEGMENT_OPTIONAL if k in series]
        for k in present:
            if np.ndim(series[k]) != 1:
                raise ReportError(f"{self.path}: /segments/{k} is not a 1-D series: a damaged metrics file")
        n = min(len(series[k]) for k in present)
        rows = []
        for i in range(n):
            def num(k, kind=int):
                if k not in series:
                    return None
                v = series[k][i]
                return kind(v) if np.isfinite(v) else None
            row = {"index": i, "first_step": num("first_step"), "kind": num("kind"), "nodes": num("nodes"),
                   "targets_per_node": num("targets_per_node"), "drafters_per_node": num("drafters_per_node"),
                   "world_size": num("world_size"), "grad_accum": num("grad_accum"),
                   "unix_time_s": num("unix_time_s", float)}
            for k in ("nodes", "targets_per_node", "drafters_per_node"):
                hi = MAX_NODES if k == "nodes" else MAX_GPUS_PER_NODE
                if row[k] is None or not 1 <= row[k] <= hi:
                    raise ReportError(f"{self.path}: /segments/{k}[{i}] = {row[k]} is not in 1..{hi}: a damaged "
                                      "metrics file")
            if row["first_step"] is None or row["first_step"] < 0:
                raise ReportError(f"{self.path}: /segments/first_step[{i}] = {row['first_step']}: a damaged metrics "
                                  "file")
            row["kind_name"] = SEGMENT_KINDS.get(row["kind"], f"kind {row['kind']}")
            row["topology"] = f"{row['targets_per_node']}-{row['drafters_per_node']}"
            ws = row.get("world_size")
            if ws and row["targets_per_node"] == row["drafters_per_node"] == ws // row["nodes"]:
                row["topology"] = "colocated"  # every rank a target and a drafter (docs/pipeline.md)
            rows.append(row)
        return rows

    def _find_segments(self):
        """The segment of each /ranks row (self.rank_segment), and the one the report measures
        (self.report_segment, its rows self.report_rows): the last segment.

        /ranks/segment names each row's /segments row when the file has the table; rows written before the
        table (a file of an earlier build, resumed by this one) hold -1: their segments are found by /ranks'
        interval restarting at 0 (self.pre_segments, their rows each), as in files without the table
        (rank_segment then numbers them from 0 and self.segments is None). A last segment without a report
        interval yet is left for the one before it when that ran the same split and nodes (as older files
        always did); after a change of split it is not: service times of one split say nothing about the
        rate another runs at, so there is no verdict until the new split has reported."""
        r = self.ranks
        iv = np.asarray(r.get("interval", np.zeros(0, dtype=np.int64)))
        seg = r.get("segment")
        table = self.segments or []
        self.segment_note = None
        self.pre_segments = []
        if table and seg is not None and np.ndim(seg) == 1 and len(seg) == len(iv) and (
                not len(seg) or int(np.min(seg)) >= -1):
            self.rank_segment = np.asarray(seg, dtype=np.int64)
            self.segment_source = "/ranks/segment"
            pre = np.flatnonzero(self.rank_segment == -1)
            self.pre_segments = [pre[_interval_rule(iv[pre]) == j] for j in range(
                int(_interval_rule(iv[pre]).max()) + 1 if len(pre) else 0)]
        else:
            self.rank_segment = _interval_rule(iv)
            self.segment_source = "interval restarts"
            has = sorted(set(int(x) for x in self.rank_segment))
            self.report_segment = has[-1] if has else 0
            self.report_rows = np.flatnonzero(self.rank_segment == self.report_segment)
            return
        has_rows = sorted(set(int(x) for x in self.rank_segment if x >= 0))
        last = max(len(table) - 1, has_rows[-1] if has_rows else 0)
        self.report_segment = last
        self.report_rows = np.flatnonzero(self.rank_segment == last)
        if len(self.report_rows) or (not has_rows and not self.pre_segments):
            return
        b = self.segment_row(last)
        if has_rows:
            k = has_rows[-1]
            a = self.segment_row(k)
            same = a is not None and b is not None and all(
                a[x] == b[x] for x in ("targets_per_node", "drafters_per_node", "nodes"))
            rows, name = np.flatnonzero(self.rank_segment == k), f"segment {k}"
        else:  # only rows written before the table: the same split when the table's first row is a resume on it
            k = -1
            first = self.segment_row(0)
            same = first is not None and first["kind"] == 1 and (last == 0 or all(
                table[j]["kind"] == 1 for j in range(1, min(last + 1, len(table)))))
            rows, name = self.pre_segments[-1], "the segment before the segment table"
        if not same:
            now = f" ({b['kind_name']} to {b['topology']} on {b['nodes']} node(s) from step {b['first_step']})" \
                if b else ""
            raise ReportError(f"{self.path}: the last segment, {last}{now}, has written no report interval yet, and "
                              "the segments before it ran another split (their service times say nothing about "
                              "this one): look again after --log-every steps")
        self.segment_note = f"segment {last} has no report interval yet: measured on {name} (the same split)"
        self.report_segment, self.report_rows = k, rows

    def pre_segment_split(self, rows):
        """(targets, drafters, nodes) per node of rows written before the segment table: its distinct ranks by
        role over the nodes of the table's first row (whose world size they must have), else None."""
        first = self.segment_row(0)
        r = self.ranks
        ranks, roles = np.asarray(r["rank"])[rows], np.asarray(r["role"])[rows]
        t = len(set(int(x) for x in ranks[roles == ROLE_TARGET]))
        d = len(set(int(x) for x in ranks[roles == ROLE_DRAFTER]))
        world = int(ranks.max()) + 1 if len(ranks) else 0
        if first is None or not t or not d or (first["world_size"] and world > first["world_size"]):
            return None
        n = first["nodes"]
        if t % n or d % n:
            return None
        return t // n, d // n, n

    def segment_row(self, k):
        """The /segments row of segment k, or None (no table, or a row not written yet)."""
        if self.segments and 0 <= k < len(self.segments):
            return self.segments[k]
        return None

    def _check_finite(self):
        """No verdict from non-finite timings (ReportError); other non-finite series and numbers are left out,
        each noted in self.unusable ({"/group/series" or "attribute name": what and why})."""
        bad = [f"/ranks/{k} ({w})" for k in VERDICT_SERIES if k in self.ranks and (w := not_finite(self.ranks[k]))]
        if bad:
            raise ReportError(f"{self.path}: no finite measurements to build a verdict on: {', '.join(bad)} NaN or "
                              "infinite (every service rate comes from them; dflash-train never writes NaN there: "
                              "a damaged file)")
        self.unusable = {}
        for group, tested, dropped, without in OPTIONAL_SERIES:
            series = getattr(self, group)
            found = {k: w for k in tested if k in series and (w := not_finite(series[k]))}
            for k in dropped if found else ():
                series.pop(k, None)
            for k, w in found.items():
                self.unusable[f"/{group}/{k}"] = f"{w} NaN or infinite: {without}"
        if self.gpu_available and "power_w" not in self.gpus:
            self.gpu_available, self.gpus = False, {}
            self.gpu_reason = "the GPU readings are not finite (NaN or infinite)"
        for k in OPTIONAL_NUMBERS:
            v = self.attrs.get(k)
            if isinstance(v, (int, float)) and not np.isfinite(v):
                self.unusable[f"attribute {k}"] = "NaN or infinite: left out, as if not recorded"
                del self.attrs[k]

    def option(self, name, default=None, cast=float):
        v = self.options.get(name)
        if v is None or v == "":
            return default
        try:
            return cast(v)
        except (TypeError, ValueError):
            return default

    def _derive_layout(self):
        seg = self.segment_row(self.report_segment)
        if seg is not None:  # the split of the segment the report measures (the root attribute: the latest)
            self._derive_layout_from(seg)
            return
        topo = self.attrs.get("topology")
        if str(topo) == "colocated":  # every rank both: T = D = the ranks per node
            self.nodes = _count(self.path, "num_nodes", self.attrs.get("num_nodes", 1), 1, MAX_NODES, "number of nodes")
            gpus = self.attrs.get("gpus_per_node")
            if gpus is None:
                raise ReportError(f"{self.path}: topology 'colocated' without gpus_per_node: a damaged metrics file")
            self.targets_per_node = self.drafters_per_node = int(gpus)
            self.topology = "colocated"
            self._derive_sizes(gpus, "gpus_per_node")
            return
        if not topo or "-" not in str(topo):
            raise ReportError(f"{self.path}: no 'topology' attribute (T-D); the run did not record its split")
        t, d = str(topo).split("-", 1)
        try:
            self.targets_per_node, self.drafters_per_node = int(t), int(d)
        except ValueError:
            raise ReportError(f"{self.path}: topology attribute {topo!r} is not T-D")
        if self.targets_per_node < 1 or self.drafters_per_node < 1:
            raise ReportError(f"{self.path}: topology attribute {topo!r}: a split has at least one target and one "
                              "drafter per node")
        self.topology = f"{self.targets_per_node}-{self.drafters_per_node}"
        num_nodes = self.attrs.get("num_nodes")
        self.nodes = _count(self.path, "num_nodes", num_nodes, 1, MAX_NODES, "number of nodes") \
            if num_nodes is not None else 1
        self._derive_sizes(self.attrs.get("gpus_per_node"), "gpus_per_node")

    def _derive_layout_from(self, seg):
        """The layout from a /segments row: its split and nodes; GPUs per node = its world size / nodes."""
        self.targets_per_node, self.drafters_per_node = seg["targets_per_node"], seg["drafters_per_node"]
        self.topology = seg["topology"]
        self.nodes = seg["nodes"]
        gpus, name = self.attrs.get("gpus_per_node"), "gpus_per_node"
        ws = seg.get("world_size")
        if ws and ws > 0 and ws % self.nodes == 0:
            gpus, name = ws // self.nodes, f"/segments/world_size[{seg['index']}] / nodes"
        self._derive_sizes(gpus, name)

    def _derive_sizes(self, gpus, name):
        world = len(self.rank_cards) if self.rank_cards else None
        rows = self.report_rows
        if world is None and self.ranks.get("rank") is not None and len(rows):
            world = int(np.asarray(self.ranks["rank"])[rows].max()) + 1  # the measured segment's ranks
        if gpus is None:  # an older file: from the ranks it holds
            gpus = (world // self.nodes) if world else self.targets_per_node + self.drafters_per_node
            name = "gpus_per_node (not recorded: from the ranks the file holds)"
        self.gpus_per_node = _count(self.path, name, gpus, 1, MAX_GPUS_PER_NODE, "number of GPUs (ranks) per node")
        self._check_world(world)
        self.world_size = world or self.gpus_per_node * self.nodes
        # world rank -> role (from the ranks attribute, else from /ranks/role)
        self.role_of_rank = {}
        for c in self.rank_cards:
            self.role_of_rank[int(c.get("rank", -1))] = {"target": ROLE_TARGET, "drafter": ROLE_DRAFTER,
                                                          # a colocated rank's GPU power counts as its target's
                                                          # (as the job's /gpus accounting does)
                                                          "colocated": ROLE_TARGET}.get(c.get("role"), ROLE_IDLE)
        if "rank" in self.ranks and "role" in self.ranks:  # the measured segment's roles first, then the newest
            rk, rl = np.asarray(self.ranks["rank"]), np.asarray(self.ranks["role"])
            order = np.concatenate([self.report_rows, np.arange(len(rk))[::-1]]).astype(np.int64)
            ranks, first = np.unique(rk[order], return_index=True)
            for r, i in zip(ranks, first):
                self.role_of_rank.setdefault(int(r), int(rl[order[i]]))
        self.backend = self.attrs.get("backend", "?")
        # One rank per GPU on CUDA; on the CPU backend a "GPU" of the report is a rank (a process).
        self.unit = "rank" if self.backend == "cpu" else "GPU"
        cores = self.attrs.get("host_cpu_cores")
        self.host_cpu_cores = _count(self.path, "host_cpu_cores", cores, 1, MAX_HOST_CPU_CORES, "number of cores") \
            if cores else None  # None: an older file, not recorded

    def _check_world(self, world):
        """The sizes must agree with the ranks the file holds: every node runs gpus_per_node ranks (the job
        refuses anything else), the ranks attribute lists each rank once, /ranks has no rank beyond them."""
        n, g = self.nodes, self.gpus_per_node
        sizes = f"num_nodes {n} x gpus_per_node {g} = {n * g} ranks"
        if self.topology != "colocated" and self.targets_per_node + self.drafters_per_node > g:
            raise ReportError(f"{self.path}: topology attribute {self.topology} needs "
                              f"{self.targets_per_node + self.drafters_per_node} ranks per node, but attribute "
                              f"gpus_per_node = {g}: a damaged metrics file")
        if self.rank_cards and world != n * g:
            raise ReportError(f"{self.path}: attributes {sizes}, but the ranks attribute lists {world}: a damaged "
                              "metrics file")
        if world is not None and world > n * g:
            raise ReportError(f"{self.path}: /ranks holds rank {world - 1}, beyond the {sizes}: a damaged metrics "
                              "file")
