#!/usr/bin/env python3
"""Which records a run trained on, from --inject-trace-dir (src/runtime/test_trace.h), per epoch.

check_trace.py TRACE_DIR DATA.h5 [--straight STRAIGHT_TRACE_DIR] [--segments N] [--token-budget B]

Every epoch but the last: every record of the dataset trained exactly once (and, with --straight, as in that
run). The last epoch: no record twice; the run's very end may leave one batch untrained (--batch-order fixed
ends the drafters' sequence at the first missing batch of any target, and D drafters in lockstep stop when
one has none: include/dflash/flow_control.h), in straight runs too, so up to one batch's records (token
budget / shortest record) may be missing there. --segments: the trace must hold that many segments.
Exit 1 with FAIL: ... on a violation."""
import argparse, collections, glob, sys

import h5py
import numpy as np


def trained_records(trace_dir):
    sent, trained = {}, []
    for path in glob.glob(trace_dir + "/trace.rank*"):
        for line in open(path):
            w = line.split()
            if w[0] == "sent":  # sent SEGMENT TARGET_RANK BATCH_INDEX EPOCH RECORD...
                sent[(int(w[1]), int(w[2]), int(w[3]))] = (int(w[4]), [int(x) for x in w[5:]])
            elif w[0] == "trained":  # trained SEGMENT TARGET_RANK BATCH_INDEX STEP
                trained.append((int(w[1]), int(w[2]), int(w[3])))
    per_epoch = collections.defaultdict(collections.Counter)
    for key in trained:
        if key not in sent:
            sys.exit(f"FAIL: {trace_dir}: batch {key} trained but never sent")
        epoch, records = sent[key]
        per_epoch[epoch].update(records)
    return per_epoch, len({k[0] for k in trained})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir")
    ap.add_argument("data")
    ap.add_argument("--straight")
    ap.add_argument("--segments", type=int)
    ap.add_argument("--token-budget", type=int, default=512)
    a = ap.parse_args()
    got, segments = trained_records(a.trace_dir)
    want = trained_records(a.straight)[0] if a.straight else None
    with h5py.File(a.data, "r") as f:
        lengths = np.diff(f["offsets"][:])
    every = set(range(len(lengths)))
    most_per_batch = a.token_budget // int(lengths.min())
    if a.segments is not None and segments != a.segments:
        sys.exit(f"FAIL: the trace holds {segments} segment(s), expected {a.segments}")
    if not got:
        sys.exit("FAIL: the trace holds no trained batch")
    if want is not None and sorted(got) != sorted(want):
        sys.exit(f"FAIL: epochs trained {sorted(got)}, the straight run's {sorted(want)}")
    last = max(got)
    for e in sorted(got):
        twice = [r for r, c in got[e].items() if c > 1]
        if twice:
            sys.exit(f"FAIL: epoch {e}: {len(twice)} record(s) trained more than once, e.g. {twice[:5]}")
        missing = sorted(every - set(got[e]))
        if e < last and missing:
            sys.exit(f"FAIL: epoch {e}: {len(missing)} record(s) never trained, e.g. {missing[:8]}")
        if e < last and want is not None and set(want[e]) != every:
            sys.exit(f"FAIL: the straight run's epoch {e} is not whole")
        if e == last and len(missing) > most_per_batch:
            sys.exit(f"FAIL: last epoch {e}: {len(missing)} record(s) never trained, more than one batch's")
        ref = f" (the straight run: {len(want[e])})" if want is not None else ""
        print(f"# epoch {e}: {len(got[e])} of {len(every)} records, each trained once{ref}")


if __name__ == "__main__":
    main()
