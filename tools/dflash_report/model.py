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
layout"), predicted only for a run that is colocated (from its own measurements; the C++ twin and the
verdict of split runs do not price it yet):

  colocated b/s = N * G / (s_t + s_d + a(N * G) - o)    o: the measured overlap of the two per batch

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

    def to_json(self):
        return dict(self.__dict__)


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


def predict_colocated(m: Measurements, overlap_s: float = 0.0) -> Prediction:
    """Every GPU both roles: a batch costs the target's forward plus the drafter's step, less what of the
    two overlapped (measured: the next forward on its own stream while the drafter steps; 0 when unknown)."""
    g, n = m.gpus_per_node, m.nodes
    a = (m.allreduce_coeff_s or 0.0) * ring_allreduce_factor(n * g)
    per_batch = max(m.target_s_per_batch + m.drafter_s_per_batch + a - max(overlap_s, 0.0),
                    max(m.target_s_per_batch, m.drafter_s_per_batch + a))
    bps = n * g / per_batch
    ktok = bps * m.tokens_per_batch / 1000.0
    power = None
    if m.power_target_w is not None and m.power_drafter_w is not None:
        # a GPU that runs both draws each role's power for that role's share of the batch's time
        busy = m.target_s_per_batch + m.drafter_s_per_batch
        power = n * g * (m.power_target_w * m.target_s_per_batch + m.power_drafter_w * m.drafter_s_per_batch) / busy
    per_kw = ktok / (power / 1000.0) if power else None
    eta = m.remaining_tokens / (ktok * 1000.0) if (m.remaining_tokens is not None and ktok > 0) else None
    limit = "target" if m.target_s_per_batch >= m.drafter_s_per_batch + a else "drafter"
    return Prediction(g, g, 0, bps, bps, bps, ktok, limit, a, power, per_kw, eta, split="colocated")


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


# Two predictions closer than this are a tie (measurement noise); the tie goes to less power, then fewer GPUs.
TIE_FRACTION = 0.005


def _better(a: Prediction, b: Prediction) -> bool:
    """Is a a better choice than b?"""
    top = max(a.batches_per_s, b.batches_per_s)
    if abs(a.batches_per_s - b.batches_per_s) > TIE_FRACTION * top:
        return a.batches_per_s > b.batches_per_s
    if a.power_w is not None and b.power_w is not None and a.power_w != b.power_w:
        return a.power_w < b.power_w
    return (a.targets + a.drafters) < (b.targets + b.drafters)


def best_split(preds: List[Prediction], power_budget_w: Optional[float] = None) -> Optional[Prediction]:
    """The fastest split (within power_budget_w when given and the power is known); None if none fits."""
    best = None
    for p in preds:
        if power_budget_w is not None and (p.power_w is None or p.power_w > power_budget_w):
            continue
        if best is None or _better(p, best):
            best = p
    return best
