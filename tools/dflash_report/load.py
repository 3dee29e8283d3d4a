"""Reads metrics.h5 (layout: docs/metrics.md) into plain numpy arrays and the run's attributes."""

import json
import os

os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")  # read a file the job is still writing

import h5py  # noqa: E402
import numpy as np  # noqa: E402

ROLE_TARGET, ROLE_DRAFTER, ROLE_IDLE = 0, 1, 2

# metrics.h5's format_version this reader knows (docs/metrics.md): 1 (no version attribute either), 2
# (dimension scales, the role enum, /steps/epoch and acc_by_pos, /options). A newer file is refused.
FORMAT_VERSIONS = (1, 2)
# The NAME netCDF-4 gives a dimension scale that holds no values (/ranks/row, /queues/sample, ...).
_DIMENSION_ONLY = b"This is a netCDF dimension but not a netCDF variable"


class ReportError(Exception):
    """A problem with the input the operator can fix (printed without a traceback, exit 3)."""


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
        self._derive_layout()

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
        self.topology = f"{self.targets_per_node}-{self.drafters_per_node}"
        self.nodes = int(self.attrs.get("num_nodes") or 1)
        world = len(self.rank_cards) if self.rank_cards else None
        if world is None and self.ranks.get("rank") is not None and len(self.ranks["rank"]):
            world = int(self.ranks["rank"].max()) + 1
        gpus = self.attrs.get("gpus_per_node")
        if gpus is None:
            gpus = (world // self.nodes) if world else self.targets_per_node + self.drafters_per_node
        self.gpus_per_node = int(gpus)
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
        self.host_cpu_cores = int(cores) if cores else None  # None: an older file, not recorded
