"""The what-if model: predicted throughput and power of every T-D split of the same GPUs.

The same formulas live in C++ (src/runtime/auto_topology.cpp, used by --topology auto); both are checked
against the scenarios in tests/report/ and against each other (tests/e2e/test_report_model.sh).

Per node: T targets, D drafters, the node's other GPUs idle; N nodes; drafters allreduce over all N*D.

  target side   = N * T / s_t                           s_t: busy seconds per batch of one target GPU
  drafter side  = N * D / (s_d + a(N * D))              s_d: compute + optimizer seconds per batch
  a(D)          = c * 2 (D - 1) / D                     ring allreduce of the gradients; zero at D = 1
  predicted b/s = min(target side, drafter side)
  power         = N * (T * P_t + D * P_d + (G - T - D) * P_idle)   (measured per-role draw; None if unknown)

Colocated (--topology colocated: every GPU runs a target and a drafter, docs/pipeline.md "The colocated
layout") is one more row:

  colocated b/s = N * G / (s_t + s_d + a(N * G) - o * min(s_t, s_d))
  o             = (s_t + s_d - s_both) / min(s_t, s_d)     the measured overlap of the two roles on one device
  power         = N * G * (P_t * s_t + P_d * s_d) / (s_t + s_d)

o is at most 1 (the shorter role hidden under the longer), 0 where they take turns, below 0 where together
they took longer than one after the other (contention); it comes from --topology auto's colocated phase or a
colocated run's own wall time. Not measured, it is taken as 0 and the row is shown but never the best; a
colocated rank holds both roles' memory, and a row known not to fit (colocated_fit "does not fit") is never
the best either.

c (seconds) is the allreduce cost at factor 1 (bytes / bandwidth): from the allreduce time measured at the
run's own D when D > 1 (c = a_measured / (2 (D - 1) / D)), else from the gradient size and an assumed
bandwidth, else unknown (then a = 0, and the report says so).
"""

from dataclasses import dataclass, field
from typing import List, Optional


def ring_allreduce_factor(drafters_total: int) -> float:
    """Bytes each drafter sends per byte of gradient in a ring allreduce: 2 (D - 1) / D."""
    return 0.0 if drafters_total <= 1 else 2.0 * (drafters_total - 1) / drafters_total


@dataclass
class Measurements:
    gpus_per_node: int
    nodes: int
    target_s_per_batch: float          # busy seconds per batch, one target GPU
    drafter_s_per_batch: float         # compute + optimizer seconds per batch, one drafter GPU
    allreduce_coeff_s: Optional[float]  # c above; None = unknown (modelled as 0)
    tokens_per_batch: float
    power_target_w: Optional[float] = None
    power_drafter_w: Optional[float] = None
    power_idle_w: Optional[float] = None
    remaining_tokens: Optional[float] = None
    colocated_overlap: Optional[float] = None  # o above; None = not measured
    colocated_fit: str = "unknown"              # "fits", "does not fit" or "unknown"

    def to_json(self):
        return dict(self.__dict__)


COLOCATED_FITS = ("fits", "does not fit", "unknown")


def colocated_overlap(target_s: float, drafter_s: float, both_s: float) -> float:
    """o of two roles timed apart and together on one device, at most 1 (0 when a time is missing)."""
    shorter = min(target_s, drafter_s)
    if not shorter > 0 or both_s is None or both_s != both_s:
        return 0.0
    return min((target_s + drafter_s - both_s) / shorter, 1.0)


@dataclass
class Prediction:
    targets: int
    drafters: int
    idle: int
    target_cap_bps: float
    drafter_cap_bps: float
    batches_per_s: float
    ktok_per_s: float
    limit: str                       # "target" or "drafter": the side that sets the rate
    allreduce_s_per_batch: float
    power_w: Optional[float]
    ktok_per_kw: Optional[float]
    eta_s: Optional[float]
    split: str = ""
    layout: str = "split"            # "split" or "colocated"
    fit: str = "fits"                # a split's roles fit; a colocated row: Measurements.colocated_fit
    overlap: Optional[float] = None  # a colocated row's o (None: not measured)

    @property
    def gpus(self) -> int:
        """Busy GPUs per node: T + D, or G colocated."""
        return self.targets if self.layout == "colocated" else self.targets + self.drafters

    def to_json(self):
        return dict(self.__dict__)


def predict(m: Measurements, targets: int, drafters: int) -> Prediction:
    g, n = m.gpus_per_node, m.nodes
    idle = g - targets - drafters
    assert targets >= 1 and drafters >= 1 and idle >= 0, (targets, drafters, g)
    target_cap = n * targets / m.target_s_per_batch
    a = (m.allreduce_coeff_s or 0.0) * ring_allreduce_factor(n * drafters)
    drafter_cap = n * drafters / (m.drafter_s_per_batch + a)
    bps = min(target_cap, drafter_cap)
    ktok = bps * m.tokens_per_batch / 1000.0
    power = None
    if m.power_target_w is not None and m.power_drafter_w is not None and (idle == 0 or m.power_idle_w is not None):
        power = n * (targets * m.power_target_w + drafters * m.power_drafter_w + idle * (m.power_idle_w or 0.0))
    per_kw = ktok / (power / 1000.0) if power else None
    eta = m.remaining_tokens / (ktok * 1000.0) if (m.remaining_tokens is not None and ktok > 0) else None
    return Prediction(targets, drafters, idle, target_cap, drafter_cap, bps, ktok,
                      "target" if target_cap <= drafter_cap else "drafter", a, power, per_kw, eta,
                      split=f"{targets}-{drafters}")


def predict_colocated(m: Measurements) -> Prediction:
    """Every GPU both roles: a batch costs the target's forward plus the drafter's step (and the allreduce over
    every GPU), less the measured overlap of the two (taken as 0 when not measured)."""
    g, n = m.gpus_per_node, m.nodes
    t, d = m.target_s_per_batch, m.drafter_s_per_batch
    assert t > 0 and d > 0, (t, d)
    a = (m.allreduce_coeff_s or 0.0) * ring_allreduce_factor(n * g)
    overlap = None if m.colocated_overlap is None else min(m.colocated_overlap, 1.0)
    bps = n * g / (t + d + a - (overlap or 0.0) * min(t, d))
    ktok = bps * m.tokens_per_batch / 1000.0
    power = None
    if m.power_target_w is not None and m.power_drafter_w is not None:
        # a GPU that runs both draws each role's power for that role's share of the batch's time
        power = n * g * (m.power_target_w * t + m.power_drafter_w * d) / (t + d)
    per_kw = ktok / (power / 1000.0) if power else None
    eta = m.remaining_tokens / (ktok * 1000.0) if (m.remaining_tokens is not None and ktok > 0) else None
    return Prediction(g, g, 0, n * g / t, n * g / (d + a), bps, ktok, "target" if t >= d + a else "drafter", a,
                      power, per_kw, eta, split="colocated", layout="colocated", fit=m.colocated_fit,
                      overlap=overlap)


# The most GPUs (CPU ranks) per node the model splits: there are ~G^2/2 splits, so a size read from a damaged
# file (gpus_per_node 1e9) must not reach the loops below; load.py refuses such files before this point.
MAX_GPUS_PER_NODE = 1024


def all_splits(m: Measurements) -> List[Prediction]:
    """Every T-D with T, D >= 1 and T + D <= GPUs per node, most targets first."""
    if not 1 <= m.gpus_per_node <= MAX_GPUS_PER_NODE:
        raise ValueError(f"{m.gpus_per_node} GPUs per node: the model splits 1..{MAX_GPUS_PER_NODE}")
    out = []
    for t in range(m.gpus_per_node - 1, 0, -1):
        for d in range(1, m.gpus_per_node - t + 1):
            out.append(predict(m, t, d))
    return out


def all_layouts(m: Measurements) -> List[Prediction]:
    """Every split (all_splits' order), then colocated: what the report chooses among."""
    return all_splits(m) + [predict_colocated(m)]


# Two predictions closer than this are a tie (measurement noise); the tie goes to less power, then fewer GPUs.
TIE_FRACTION = 0.005


def _better(a: Prediction, b: Prediction) -> bool:
    """Is a a better choice than b?"""
    top = max(a.batches_per_s, b.batches_per_s)
    if abs(a.batches_per_s - b.batches_per_s) > TIE_FRACTION * top:
        return a.batches_per_s > b.batches_per_s
    if a.power_w is not None and b.power_w is not None and a.power_w != b.power_w:
        return a.power_w < b.power_w
    return a.gpus < b.gpus


def candidate(p: Prediction) -> bool:
    """A colocated row counts only with a measured overlap and a fit not known to fail."""
    return p.layout != "colocated" or (p.overlap is not None and p.fit != "does not fit")


def best_split(preds: List[Prediction], power_budget_w: Optional[float] = None) -> Optional[Prediction]:
    """The fastest row (within power_budget_w when given and the power is known; colocated: candidate());
    None if none fits."""
    best = None
    for p in preds:
        if not candidate(p):
            continue
        if power_budget_w is not None and (p.power_w is None or p.power_w > power_budget_w):
            continue
        if best is None or _better(p, best):
            best = p
    return best
