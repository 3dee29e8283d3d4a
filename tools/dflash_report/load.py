"""Reads metrics.h5 (layout: docs/metrics.md) into plain numpy arrays and the run's attributes."""

import json
import os

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
        try:
            f = h5py.File(path, "r")
        except OSError as e:
            raise ReportError(f"{path}: not a readable HDF5 metrics file ({e})")
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
            # --eval-data's held-out rows (docs/metrics.md "/eval"); {} in runs without it
            self.eval = ({k: np.asarray(v[()]) for k, v in f["eval"].items() if isinstance(v, h5py.Dataset)}
                         if "eval" in f else {})
        self._check_finite()
        self._derive_layout()

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
        topo = self.attrs.get("topology")
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
        world = len(self.rank_cards) if self.rank_cards else None
        if world is None and self.ranks.get("rank") is not None and len(self.ranks["rank"]):
            world = int(self.ranks["rank"].max()) + 1
        gpus, name = self.attrs.get("gpus_per_node"), "gpus_per_node"
        if gpus is None:  # an older file: from the ranks it holds
            gpus = (world // self.nodes) if world else self.targets_per_node + self.drafters_per_node
            name = "gpus_per_node (not recorded: from the ranks the file holds)"
        self.gpus_per_node = _count(self.path, name, gpus, 1, MAX_GPUS_PER_NODE, "number of GPUs (ranks) per node")
        self._check_world(world)
        self.world_size = world or self.gpus_per_node * self.nodes
        # world rank -> role (from the ranks attribute, else from /ranks/role)
        self.role_of_rank = {}
        for c in self.rank_cards:
            self.role_of_rank[int(c.get("rank", -1))] = {"target": ROLE_TARGET, "drafter": ROLE_DRAFTER}.get(
                c.get("role"), ROLE_IDLE)
        if "rank" in self.ranks and "role" in self.ranks:
            for r, role in zip(self.ranks["rank"], self.ranks["role"]):
                self.role_of_rank.setdefault(int(r), int(role))
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
        if self.targets_per_node + self.drafters_per_node > g:
            raise ReportError(f"{self.path}: topology attribute {self.topology} needs "
                              f"{self.targets_per_node + self.drafters_per_node} ranks per node, but attribute "
                              f"gpus_per_node = {g}: a damaged metrics file")
        if self.rank_cards and world != n * g:
            raise ReportError(f"{self.path}: attributes {sizes}, but the ranks attribute lists {world}: a damaged "
                              "metrics file")
        if world is not None and world > n * g:
            raise ReportError(f"{self.path}: /ranks holds rank {world - 1}, beyond the {sizes}: a damaged metrics "
                              "file")
