"""The PNG dashboard: throughput, queues, loss/acc/streak, power per GPU."""

import matplotlib

matplotlib.use("Agg")  # no display on a cluster node
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .analysis import _gpu_column_ranks as analysis_columns  # noqa: E402
from .load import ROLE_DRAFTER, ROLE_TARGET  # noqa: E402


def _interval_rates(run, role):
    r = run.ranks
    m = r["role"] == role
    times = sorted(set(float(t) for t in r["time_s"][m]))
    out_t, out_b = [], []
    prev = 0.0
    for t in times:
        b = float(r["batches"][m & (r["time_s"] == t)].sum())
        if t > prev:
            out_t.append(t)
            out_b.append(b / (t - prev))
        prev = t
    return np.array(out_t), np.array(out_b)


def write_png(run, rep, path):
    fig, ax = plt.subplots(2, 2, figsize=(14, 9))
    fig.suptitle(f"{run.path}: {run.topology} on {run.nodes} node(s) x {run.gpus_per_node} GPUs  |  "
                 f"{rep['observed']['batches_per_s']:.2f} b/s, {rep['observed']['ktok_per_s']:.1f} Ktok/s", fontsize=11)

    a = ax[0][0]
    for role, name in ((ROLE_TARGET, "targets produce"), (ROLE_DRAFTER, "drafters train")):
        t, b = _interval_rates(run, role)
        if len(t):
            a.step(t / 60, b, where="pre", label=f"{name} (b/s)")
    a.axhline(rep["observed"]["target_ceiling_bps"], ls="--", c="C0", lw=0.8, label="target-side ceiling")
    a.axhline(rep["observed"]["drafter_ceiling_bps"], ls="--", c="C1", lw=0.8, label="drafter-side ceiling")
    a.set_title("throughput")
    a.set_xlabel("minutes")
    a.set_ylabel("batches/s")
    a.legend(fontsize=8)

    a = ax[0][1]
    q = run.queues
    if len(q.get("time_s", [])):
        tm = q["time_s"] / 60
        if q["q_pre"].shape[1]:
            a.plot(tm, q["q_pre"].mean(axis=1), lw=1.0, c="C2", label="q_pre (mean over targets)")
            a.plot(tm, q["q_pre"].min(axis=1), lw=0.7, c="C2", ls=":", label="q_pre (emptiest target)")
        for j in range(q["q_hs"].shape[1]):
            a.plot(tm, q["q_hs"][:, j], lw=1.2, c="C3", label="q_hs (per drafter)" if j == 0 else None)
        a.legend(fontsize=8)
    a.set_title("queue depths")
    a.set_xlabel("minutes")
    a.set_ylabel("batches")

    a = ax[1][0]
    st = run.steps
    if len(st.get("step", [])):
        a.plot(st["step"], st["loss"], lw=0.8, label="loss")
        a.set_ylabel("loss")
        b = a.twinx()
        b.plot(st["step"], st["acc"], c="C1", lw=0.8, label="acc")
        b.plot(st["step"], st["streak"], c="C2", lw=0.8, label="streak")
        b.set_ylabel("acc / streak")
        b.legend(loc="upper right", fontsize=8)
    a.set_title("training")
    a.set_xlabel("step")
    a.legend(loc="upper left", fontsize=8)

    a = ax[1][1]
    if run.gpu_available:
        p = run.gpus["power_w"]
        owners = analysis_columns(run, p.shape[1])
        for j in range(p.shape[1]):
            role = {ROLE_TARGET: "target", ROLE_DRAFTER: "drafter"}.get(run.role_of_rank.get(owners[j], -1), "idle")
            a.plot(run.gpus["time_s"] / 60, p[:, j], lw=0.8, label=f"GPU {j} ({role})")
        a.legend(fontsize=7, ncol=2)
        a.set_ylabel("W")
    else:
        a.text(0.5, 0.5, f"no power data:\n{run.gpu_reason}", ha="center", va="center", transform=a.transAxes)
    a.set_title("power per GPU")
    a.set_xlabel("minutes")

    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
