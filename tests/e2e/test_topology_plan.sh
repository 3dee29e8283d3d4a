#!/usr/bin/env bash
# --topology plan and learning from the run (issue 44 items 2 and 3, issue 45 item 3; docs/cost_model.md "Learning
# from a run"): on the CPU backend, `--topology plan --gpu h200` runs the layout the cost model recommends for an
# H200 node of this many ranks (the dry run names the same one). On the tiny target both roles fit one GPU many
# times over, so the plan recommends the colocated layout and the job runs it (every rank both roles); under a
# --power-budget-w below what 3 busy GPUs draw it recommends a split and runs that. metrics.h5 keeps the
# prediction (attribute layout_plan), dflash-report sets it beside what the run measured and writes
# OUT/calibration.json, and a later run given `--calibration` that file predicts exactly the first run's observed
# role times (source "user"). Without a GPU kind, --topology plan refuses with a hint; --calibration of a broken
# file is refused naming it.
source "$(dirname "$0")/lib.sh"
$PY -c "import h5py, numpy" 2>/dev/null || { echo "SKIPPED: needs python3-h5py python3-numpy"; exit 77; }
tiny=$(tiny_dir)
REPORT="$DFLASH_SRC/tools/dflash-report"
planned_layout() { sed -n 's/.*topology: plan over 3 rank(s): \([0-9a-z-]*\), the layout plan.*/\1/p' "$WORK/$1.log"; }

# The dry run's recommendation for 3 ranks of H200s: colocated (each GPU runs both roles of the tiny job).
dry plan_co_dry --target "$tiny/target" --data "$tiny/data.h5" --draft-layers 1 --token-budget 512 --ranks 3 \
  --topology plan --gpu h200 --backend cpu
expect_rc 0 plan_co_dry
[ "$(planned_layout plan_co_dry)" = colocated ] || { cat "$WORK/plan_co_dry.log"; fail "plan_co_dry: the plan should recommend colocated"; }
grep -q "recommended (\*) colocated" "$WORK/plan_co_dry.log" || fail "plan_co_dry: colocated is not the table's recommendation"
grep -q "topology colocated on 1 node(s) x 3 rank(s), backend cpu: 3 target(s), 3 drafter(s) (every rank both)" \
  "$WORK/plan_co_dry.log" || fail "plan_co_dry: the dry run does not plan every rank colocated"
grep -q "plan: colocated overlaps 0.23 of the shorter role (the h200 calibration's colocated_overlap" "$WORK/plan_co_dry.log" \
  || fail "plan_co_dry: no line on how colocated is priced"
if grep -q "not a layout the job runs yet" "$WORK/plan_co_dry.log"; then fail "plan_co_dry: the stale note is back"; fi

# The job runs it: every rank a colocated rank, and metrics.h5 keeps the colocated prediction.
run_job planned_co 3 240 --topology plan --gpu h200 --max-steps 6 --log-every 2
expect_rc 0 planned_co
expect_log planned_co "[dflash] --topology plan: colocated, predicted"
grep -q "topology colocated on 1 node" "$WORK/planned_co.log" || fail "planned_co: the job did not run colocated"
grep -q "| colocated" "$WORK/planned_co.log" || fail "planned_co: the status line does not say colocated"
$PY - "$WORK/planned_co/metrics.h5" <<'PY' || fail "planned_co: metrics.h5"
import h5py, json, sys
with h5py.File(sys.argv[1], "r") as f:
    lp = json.loads(f.attrs["layout_plan"])
    topo = f.attrs["topology"]
    topo = topo.decode() if isinstance(topo, bytes) else str(topo)
assert lp["choice"] == "plan" and lp["plan"]["recommended"] == "colocated", lp["plan"]["recommended"]
assert lp["running"]["layout"] == "colocated" and lp["running"]["batches_per_s"] > 0, lp["running"]
assert lp["plan"]["colocated_overlap"] == 0.23 and lp["plan"]["colocated_regime"] == "overlapped", lp["plan"]
assert topo.startswith("colocated"), topo
print("ok   ran colocated:", lp["running"])
PY

# Under a power budget below three busy GPUs (3 x 700 W) the plan recommends a split of them, and runs it.
BUDGET=(--power-budget-w 2000)
dry plan_dry --target "$tiny/target" --data "$tiny/data.h5" --draft-layers 1 --token-budget 512 --ranks 3 \
  --topology plan --gpu h200 --backend cpu "${BUDGET[@]}"
expect_rc 0 plan_dry
want=$(planned_layout plan_dry)
case $want in [0-9]-[0-9]) ;; *) cat "$WORK/plan_dry.log"; fail "plan_dry: the dry run names no planned split under the budget ('$want')" ;; esac
grep -q "recommended (\*) $want" "$WORK/plan_dry.log" || fail "plan_dry: the split is not the table's recommendation"
note "the plan for 3 H200s within 2000 W: $want"

run_job planned 3 240 --topology plan --gpu h200 "${BUDGET[@]}" --max-steps 12 --log-every 2
expect_rc 0 planned
expect_log planned "[dflash] --topology plan: $want, predicted"
grep -q "topology $want on 1 node" "$WORK/planned.log" || fail "planned: the job did not run $want"
$PY - "$WORK/planned/metrics.h5" "$want" <<'PY' || fail "planned: layout_plan attribute"
import h5py, json, sys
with h5py.File(sys.argv[1], "r") as f:
    lp = json.loads(f.attrs["layout_plan"])
assert lp["choice"] == "plan", lp["choice"]
assert lp["running"]["layout"] == sys.argv[2] and lp["plan"]["recommended"] == sys.argv[2], lp["running"]
assert lp["plan"]["gpu"] == "h200" and lp["calibration"]["gpus"][0]["name"] == "h200"
assert lp["plan"]["target_forward_s"] > 0 and lp["plan"]["drafter_step_s"] > 0
print("ok   layout_plan kept:", lp["running"])
PY

"$REPORT" "$WORK/planned/metrics.h5" > "$WORK/planned.report" || fail "planned: dflash-report failed"
grep -q "LAYOUT PLAN VS OBSERVED (cost model for h200" "$WORK/planned.report" || { cat "$WORK/planned.report"; fail "no predicted-vs-observed table"; }
grep -q "target forward" "$WORK/planned.report" || fail "report: no target row"
grep -q "calibration fitted to this run: $WORK/planned/calibration.json" "$WORK/planned.report" || fail "report: calibration.json not named"
"$REPORT" "$WORK/planned/metrics.h5" --json --calibration-out none > "$WORK/planned.json" || fail "report --json"
$PY - "$WORK/planned.json" "$WORK/planned/calibration.json" <<'PY' || fail "calibration.json"
import json, sys
rep, cal = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rows = {r["what"]: r for r in rep["layout_plan"]["rows"]}
g = cal["gpus"][0]
assert cal["version"] == 1 and g["source"] == "user" and "fitted to" in g["basis"], g
t, d = rows["target forward"], rows["drafter step"]
assert abs(g["target_time_scale"] - t["observed"] / t["predicted"]) < 1e-9 * g["target_time_scale"]
assert abs(g["drafter_time_scale"] - d["observed"] / d["predicted"]) < 1e-9 * g["drafter_time_scale"]
json.dump({"target": t["observed"], "drafter": d["observed"]}, open(sys.argv[2] + ".observed", "w"))
print("ok   scales", g["target_time_scale"], g["drafter_time_scale"])
PY

# A later run with that calibration predicts the first run's observed times.
run_job recal 3 240 --topology plan --gpu h200 --calibration "$WORK/planned/calibration.json" --max-steps 4
expect_rc 0 recal
$PY - "$WORK/recal/metrics.h5" "$WORK/planned/calibration.json.observed" <<'PY' || fail "recal: prediction"
import h5py, json, sys
with h5py.File(sys.argv[1], "r") as f:
    lp = json.loads(f.attrs["layout_plan"])
obs = json.load(open(sys.argv[2]))
p = lp["plan"]
assert lp["plan"]["gpu_calibration"] == "user", p["gpu_calibration"]
for role, key in (("target", "target_forward_s"), ("drafter", "drafter_step_s")):
    assert abs(p[key] / obs[role] - 1) < 1e-6, (role, p[key], obs[role])
print("ok   the calibrated plan predicts the observed", obs)
PY
dry recal_dry --target "$tiny/target" --data "$tiny/data.h5" --draft-layers 1 --token-budget 512 --ranks 3 \
  --topology plan --gpu h200 --backend cpu --calibration "$WORK/planned/calibration.json"
expect_rc 0 recal_dry
grep -q -- "--calibration fitted to" "$WORK/recal_dry.log" || fail "recal_dry: the plan does not say it uses the run's calibration"

# Refusals: no GPU kind on the CPU backend; --gpu on a CPU job without --topology plan; a broken file.
run_job no_kind 1 60 --topology plan --max-steps 1
expect_rc 2 no_kind
expect_log no_kind "--topology plan: no GPU kind to plan for on the CPU backend"
expect_log no_kind "HINT: give --gpu"
run_job gpu_alone 2 60 --topology 1-1 --gpu h200 --max-steps 1
expect_rc 2 gpu_alone
echo '{"version": 1, "gpus": [{"name": "h200"}]}' > "$WORK/broken.json"
dry broken --target "$tiny/target" --data "$tiny/data.h5" --draft-layers 1 --ranks 3 --topology plan --gpu h200 --backend cpu \
  --calibration "$WORK/broken.json"
expect_rc 3 broken
expect_log broken "--calibration $WORK/broken.json: a GPU entry lacks"
echo "PASS"
