#!/usr/bin/env bash
# metrics.h5 of a real run (1-2: the drafters sum acc_by_pos) as netCDF readers see it, checked with h5py:
# format_version 2; every axis of every series carries a netCDF-4 dimension scale (step, block_position,
# row, sample, target, drafter); the role is the committed enum /ranks/role_t; /options holds the options
# as typed attributes; /steps/epoch follows the status line's epoch~ and /steps/acc_by_pos is
# [step, block_position] accuracies. (test_metrics_xarray.sh opens the file with xarray itself.)
source "$(dirname "$0")/lib.sh"
run_job run 3 240 --topology 1-2 --max-steps 8 --log-every 4 --epochs 2 --lr 1e-3
expect_rc 0 run
status_epoch=$(grep -o 'epoch~[0-9.]*' "$WORK/run.log" | tail -1 | cut -d'~' -f2)
[ -n "$status_epoch" ] || fail "no epoch~ on the status line"
"$PY" - "$WORK/run/metrics.h5" "$status_epoch" <<'PYEOF' || fail "metrics.h5 checks"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
status_epoch = float(sys.argv[2])
ok = True
def check(cond, msg):
    global ok
    print(("ok   " if cond else "FAIL ") + msg)
    ok = ok and bool(cond)
NOT_A_VARIABLE = b"This is a netCDF dimension but not a netCDF variable"
def dims(ds):  # the dimension names xarray gives ds's axes
    out = []
    for d in ds.dims:
        if len(d) == 0:
            out.append(None)
        else:
            out.append(d[0].name.split("/")[-1])
    return out
check(f.attrs["format_version"] == 2, "format_version 2")
steps = f["steps"]
n = len(steps["step"])
check(n == 8, f"8 steps ({n})")
for k, ds in steps.items():
    want = {"step": ["step"], "block_position": ["block_position"], "acc_by_pos": ["step", "block_position"]}.get(k, ["step"])
    if k in ("step", "block_position"):
        check(ds.attrs.get("CLASS") == b"DIMENSION_SCALE" and ds.attrs.get("NAME") == k.encode(), f"/steps/{k} is the coordinate {k}")
    else:
        check(dims(ds) == want, f"/steps/{k} dims {dims(ds)}")
ranks = f["ranks"]
for k, ds in ranks.items():
    if isinstance(ds, h5py.Dataset) and k != "row":
        check(dims(ds) == ["row"], f"/ranks/{k} dims {dims(ds)}")
check(NOT_A_VARIABLE in ranks["row"].attrs["NAME"], "/ranks/row is a dimension without values")
for k, want in (("time_s", ["sample"]), ("q_pre", ["sample", "target"]), ("q_hs", ["sample", "drafter"])):
    check(dims(f["queues"][k]) == want, f"/queues/{k} dims {dims(f['queues'][k])}")
check(f["queues/target"].shape == (1,) and f["queues/drafter"].shape == (2,), "target and drafter dimensions of 1 and 2")
check(len(f["gpus"].keys()) == 0, "no /gpus series (nor dimensions) on the CPU backend")
# the role enum
check(isinstance(ranks["role_t"], h5py.Datatype), "/ranks/role_t is a committed type")
check(h5py.check_enum_dtype(ranks["role"].dtype) == {"target": 0, "drafter": 1, "idle": 2},
      f"/ranks/role is the enum {h5py.check_enum_dtype(ranks['role'].dtype)}")
check(sorted(set(ranks["role"][:].tolist())) == [0, 1], "roles: target and drafter")
# typed options
o = f["options"].attrs
check(isinstance(o["max-steps"], np.integer) and o["max-steps"] == 8, f"max-steps int {o['max-steps']!r}")
check(isinstance(o["lr"], np.floating) and abs(o["lr"] - 1e-3) < 1e-9, f"lr float {o['lr']!r}")
check(isinstance(o["topology"], str) and o["topology"] == "1-2", f"topology str {o['topology']!r}")
check(isinstance(o["dpace"], np.integer) and o["dpace"] == 0, f"dpace (a flag) 0 {o['dpace']!r}")
# epoch and acc_by_pos
ep = steps["epoch"][:]
check(np.all(np.diff(ep) >= 0) and 0 < ep[0] and ep[-1] <= 2, f"epoch grows within (0, 2]: {np.round(ep, 3).tolist()}")
check(abs(ep[-1] - status_epoch) <= 0.1, f"last epoch {ep[-1]:.3f} ~ the status line's {status_epoch}")
acc = steps["acc_by_pos"][:]
bp = steps["block_position"][:]
check(acc.shape == (n, len(bp)) and bp.tolist() == list(range(1, len(bp) + 1)) and len(bp) >= 2,
      f"acc_by_pos {acc.shape}, block positions 1..{len(bp)}")
check(np.all(np.isfinite(acc)) and acc.min() >= 0 and acc.max() <= 1 and acc.max() > 0, "accuracies in [0, 1], not all 0")
sys.exit(0 if ok else 1)
PYEOF
echo "PASS"
