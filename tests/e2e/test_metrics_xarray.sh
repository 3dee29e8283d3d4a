#!/usr/bin/env bash
# metrics.h5 opened with xarray (engine h5netcdf), as docs/metrics.md shows: each group is a dataset with
# named dimensions (no phony_dim_N), the role decodes as the enum role_t, /options holds typed attributes.
# Skipped (exit 77, with the reason) where no python3 has xarray and h5netcdf (tools/setup.sh --tests
# installs them into the project venv).
source "$(dirname "$0")/lib.sh"
XPY=$(SKIP_HINT="tools/setup.sh --tests installs them into the project venv: requirements-tests.txt" \
      bash -c 'source "$1/tests/data_tools/lib.sh"; find_py xarray h5netcdf' _ "$DFLASH_SRC") || exit $?
note "$("$XPY" -c 'import xarray, h5netcdf; print("xarray", xarray.__version__, "h5netcdf", h5netcdf.__version__)') at $XPY"
run_job run 3 240 --topology 1-2 --max-steps 6 --log-every 3
expect_rc 0 run
"$XPY" - "$WORK/run/metrics.h5" <<'PYEOF' || fail "xarray checks"
import sys, warnings
import xarray as xr
path = sys.argv[1]
warnings.simplefilter("error")  # e.g. an unsupported HDF5 feature skipped with a warning
ok = True
def check(cond, msg):
    global ok
    print(("ok   " if cond else "FAIL ") + msg)
    ok = ok and bool(cond)
steps = xr.open_dataset(path, engine="h5netcdf", group="steps")
check(dict(steps.sizes) == {"step": 6, "block_position": steps.sizes["block_position"]}, f"/steps sizes {dict(steps.sizes)}")
check(steps.loss.dims == ("step",) and steps.acc_by_pos.dims == ("step", "block_position"), "loss [step], acc_by_pos [step, block_position]")
check(steps.step.values.tolist() == list(range(1, 7)), "the step coordinate holds the step numbers")
check(steps.block_position.values[0] == 1, "block positions start after the anchor")
check(steps.loss.attrs["units"] == "1" and "loss" in steps.loss.attrs["description"], "units and description")
check(float(steps.acc_by_pos.sel(step=6, block_position=1)) >= 0, "acc_by_pos selects by step and position")
ranks = xr.open_dataset(path, engine="h5netcdf", group="ranks")
check(ranks.role.dims == ("row",), f"/ranks dims {ranks.role.dims}")
meta = ranks.role.encoding["dtype"].metadata or {}
check(meta.get("enum_name") == "role_t" and meta.get("enum") == {"target": 0, "drafter": 1, "idle": 2}, f"role enum {meta}")
queues = xr.open_dataset(path, engine="h5netcdf", group="queues")
check(queues.q_pre.dims == ("sample", "target") and queues.q_hs.dims == ("sample", "drafter"), "q_pre [sample, target], q_hs [sample, drafter]")
check(dict(queues.sizes)["drafter"] == 2, "2 drafters")
every = [d for g in (steps, ranks, queues) for v in g.variables.values() for d in v.dims]
check(not any(d.startswith("phony_dim") for d in every), "no phony dimensions")
opts = xr.open_dataset(path, engine="h5netcdf", group="options").attrs
check(opts["max-steps"] == 6 and isinstance(opts["lr"], float) and opts["topology"] == "1-2", "typed options")
root = xr.open_dataset(path, engine="h5netcdf").attrs
check(root["format_version"] == 2 and "git_commit" in root and "command_line" in root, "run metadata at the root")
sys.exit(0 if ok else 1)
PYEOF
echo "PASS"
