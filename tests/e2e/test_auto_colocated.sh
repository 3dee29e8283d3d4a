#!/usr/bin/env bash
# --topology auto times the colocated layout beside the splits (src/runtime/auto_measure.cpp: each rank, after
# timing its roles standalone, runs a target forward and a drafter step at once on its captured batches) and
# picks it when it is predicted faster (docs/report.md "The model"). On 2 CPU ranks the only split is 1-1:
#  - slow targets (--inject-delay-target-ms): a colocated rank's step hides under its forward, every rank
#    forwards, so colocated is predicted about twice 1-1's rate: auto picks colocated, the run trains colocated,
#    and dflash-report names it (its what-if row, the auto choice, the verdict's colocated sentence);
#  - contention on the device (--inject-delay-colocated-ms: the two roles at once take seconds longer than one
#    after the other): colocated is predicted far slower, auto picks 1-1 and the report keeps it.
source "$(dirname "$0")/lib.sh"
REPORT="$DFLASH_SRC/tools/dflash-report"
auto_json() {  # auto_json NAME PYTHON_EXPR_ON_a: the auto_topology record of the run's metrics.h5 as `a`
  h5check "$WORK/$1/metrics.h5" "(lambda a: $2)(__import__('json').loads(f.attrs['auto_topology']))"
}

run_job coloc_fast 2 300 --topology auto --max-steps 4 --log-every 2 --inject-delay-target-ms 1500
expect_rc 0 coloc_fast
expect_log coloc_fast "--topology auto: colocated (a forward and a step at once)"
expect_log coloc_fast "--topology auto chose colocated"
expect_log coloc_fast "topology colocated on 1 node(s) x 2 rank(s)"
expect_log coloc_fast "drafter exported to"
grep -qE '^ \*colocated ' "$WORK/coloc_fast.log" || fail "coloc_fast: the what-if table does not mark the colocated row"
h5check "$WORK/coloc_fast/metrics.h5" "f.attrs['topology'] in ('colocated', b'colocated')"
auto_json coloc_fast "a['chosen'] == 'colocated' and [w['split'] for w in a['whatif']] == ['1-1', 'colocated']"
auto_json coloc_fast "a['measurements']['colocated_overlap'] > 0.5 and a['measurements']['colocated_fit'] == 'unknown'"
auto_json coloc_fast "a['whatif'][1]['batches_per_s'] > 1.5 * a['whatif'][0]['batches_per_s']"
"$REPORT" "$WORK/coloc_fast/metrics.h5" >"$WORK/coloc_fast.report" 2>&1 || { cat "$WORK/coloc_fast.report" >&2; fail "dflash-report failed"; }
for want in "chosen by --topology auto (colocated" "run: topology colocated on 1 node(s) x 2 rank(s)" \
            "colocated runs at" "every GPU runs both roles one batch at a time (overlap"; do
  grep -qF "$want" "$WORK/coloc_fast.report" || { cat "$WORK/coloc_fast.report" >&2; fail "the report lacks '$want'"; }
done

run_job coloc_slow 2 300 --topology auto --max-steps 4 --log-every 2 --inject-delay-colocated-ms 3000
expect_rc 0 coloc_slow
expect_log coloc_slow "--topology auto chose 1-1"
expect_log coloc_slow "topology 1-1 on 1 node(s) x 2 rank(s)"
auto_json coloc_slow "a['chosen'] == '1-1' and a['measurements']['colocated_overlap'] < 0"
auto_json coloc_slow "a['whatif'][1]['split'] == 'colocated' and a['whatif'][1]['batches_per_s'] < a['whatif'][0]['batches_per_s']"
"$REPORT" "$WORK/coloc_slow/metrics.h5" --json >"$WORK/coloc_slow.json" 2>&1 || { cat "$WORK/coloc_slow.json" >&2; fail "dflash-report --json failed"; }
"$PY" - "$WORK/coloc_slow.json" <<'PY' || fail "the report of the 1-1 run does not price colocated from auto's overlap"
import json, sys
r = json.load(open(sys.argv[1]))
co = r["colocated"]
assert co["overlap"] is not None and co["overlap"] < 0, co
assert "--topology auto" in co["overlap_source"], co
assert r["whatif"][-1]["split"] == "colocated", [w["split"] for w in r["whatif"]]
assert r["best"] != "colocated", r["best"]
print("report of 1-1: colocated overlap", co["overlap"], "best", r["best"])
PY
echo "PASS"
