#!/usr/bin/env python3
"""bench/quality/collect.py's eval statistics (no torch, no h5py): tau and its standard error over the prompts,
the mean acceptance length over every step, the prompt-by-prompt difference of two drafters, and the
summarise table's cells, from dflash-eval jsons written here."""
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
QUALITY = os.path.join(HERE, "..", "..", "bench", "quality")
sys.path.insert(0, QUALITY)
import collect  # noqa: E402


def eval_json(acceptances, records=None):
    """A dflash-eval --json of prompts with these acceptance lengths (a prompt's tau: their mean)."""
    records = records if records is not None else list(range(len(acceptances)))
    prompts = [{"record": r, "acceptance": a, "tau": sum(a) / len(a), "new_tokens": sum(a)}
               for r, a in zip(records, acceptances)]
    steps = sum(len(a) for a in acceptances)
    return {"tau": sum(p["tau"] for p in prompts) / len(prompts), "prompts": prompts, "steps": steps,
            "new_tokens": sum(p["new_tokens"] for p in prompts)}


class EvalStats(unittest.TestCase):
    def test_tau_se_and_steps_tau(self):
        d = eval_json([[1, 1, 1, 1], [2, 2], [9]])  # prompt taus 1, 2, 9
        st = collect.eval_stats(d)
        self.assertAlmostEqual(st["tau"], 4.0)
        sd = math.sqrt(((1 - 4) ** 2 + (2 - 4) ** 2 + (9 - 4) ** 2) / 2)
        self.assertAlmostEqual(st["tau_se"], sd / math.sqrt(3))
        self.assertAlmostEqual(st["steps_tau"], (4 + 4 + 9) / 7)  # every step weighs the same
        self.assertEqual(st["prompts"], 3)
        self.assertIsNone(collect.eval_stats(eval_json([[3, 1]]))["tau_se"])  # one prompt: no spread

    def test_paired_matches_records(self):
        a = eval_json([[1, 1], [2, 2], [3, 3]], records=[5, 6, 7])
        b = eval_json([[4, 4], [2, 2], [1, 2]], records=[7, 6, 9])  # records 6, 7 in both
        p = collect.paired(a, b)
        self.assertEqual(p["prompts"], 2)
        self.assertAlmostEqual(p["diff"], ((2 - 2) + (4 - 3)) / 2)
        self.assertAlmostEqual(p["se"], math.sqrt(((0 - 0.5) ** 2 + (1 - 0.5) ** 2) / 1) / math.sqrt(2))
        ratio = collect.eval_stats(b)["steps_tau"] / collect.eval_stats(a)["steps_tau"]
        self.assertAlmostEqual(p["steps_tau_ratio"], ratio)

    def test_steps_tau_ratio_se(self):
        # the same drafter twice: ratio 1, no spread
        a = eval_json([[1, 2, 3], [2, 2], [5, 1]])
        p = collect.paired(a, a)
        self.assertAlmostEqual(p["steps_tau_ratio"], 1.0)
        self.assertAlmostEqual(p["steps_tau_ratio_se"], 0.0)
        # b accepts one more token than a on every step: easy prompts move both, and the delta method's standard
        # error agrees with a jackknife over the prompts (leave one prompt out, recompute the ratio) at 300 prompts
        import random
        rng = random.Random(7)
        acc_a = [[rng.choice([1, 1, 2, 3, 6]) for _ in range(rng.randint(5, 60))] for _ in range(300)]
        acc_b = [[x + rng.choice([0, 0, 1]) for x in row] for row in acc_a]
        a, b = eval_json(acc_a), eval_json(acc_b)
        p = collect.paired(a, b)
        def ratio(rows):
            sa = sum(sum(acc_a[i]) for i in rows) / sum(len(acc_a[i]) for i in rows)
            sb = sum(sum(acc_b[i]) for i in rows) / sum(len(acc_b[i]) for i in rows)
            return sb / sa
        n = len(acc_a)
        self.assertAlmostEqual(p["steps_tau_ratio"], ratio(range(n)))
        loo = [ratio([j for j in range(n) if j != i]) for i in range(n)]
        m = sum(loo) / n
        jack = math.sqrt((n - 1) / n * sum((x - m) ** 2 for x in loo))
        self.assertGreater(p["steps_tau_ratio_se"], 0)
        self.assertAlmostEqual(p["steps_tau_ratio_se"] / jack, 1.0, delta=0.05)
        self.assertIsNone(collect.paired(eval_json([[1]]), eval_json([[2]]))["steps_tau_ratio_se"])  # one prompt

    def test_seeds_pools_runs_by_snapshot(self):
        with tempfile.TemporaryDirectory() as tmp:
            # run 1: b's steps tau 1.1x a's at both snapshots; run 2: 0.9x and 1.3x (its steps numbered apart)
            plan = {"r1": {"ours-a": ([[2, 2], [2]], [[1, 1], [1]]), "ours-e": ([[2.2, 2.2], [2.2]], [[1.1, 1.1], [1.1]])},
                    "r2": {"ours-a": ([[1, 1]], [[1, 1]]), "ours-e": ([[0.9, 0.9]], [[1.3, 1.3]])}}
            dirs = []
            for run, labels in plan.items():
                d = os.path.join(tmp, run)
                os.makedirs(d)
                dirs.append(d)
                for label, snaps in labels.items():
                    for step, acc in zip((100, 200) if run == "r1" else (7, 14), snaps):
                        with open(os.path.join(d, collect.eval_name(label, {"steps": step})), "w") as f:
                            json.dump(eval_json(acc), f)
            rows = collect.seeds("ours-a", "ours-e", dirs)
            self.assertEqual([r["snapshot"] for r in rows], [0, 1])
            self.assertEqual([x["steps"] for x in rows[1]["runs"]], [[200, 200], [14, 14]])
            self.assertAlmostEqual(rows[0]["runs"][0]["ratio"], 1.1)
            self.assertAlmostEqual(rows[0]["mean"], (1.1 + 0.9) / 2)
            self.assertAlmostEqual(rows[0]["se_runs"], statistics.stdev([1.1, 0.9]) / math.sqrt(2))
            self.assertAlmostEqual(rows[1]["mean"], (1.1 + 1.3) / 2)
            out = subprocess.run([sys.executable, os.path.join(QUALITY, "collect.py"), "seeds", "ours-a", "ours-e",
                                  *dirs], capture_output=True, text=True, check=True).stdout
            self.assertIn("snapshot 2: 2 runs:", out)
            self.assertIn("mean +20.0 % ± 10.0 %", out)
            # one run: no spread across runs
            self.assertIsNone(collect.seeds("ours-a", "ours-e", dirs[:1])[0]["se_runs"])

    def test_prompt_split_by_the_pair_mean(self):
        # prompt taus a: 1, 2, 10, 5; b: 1, 2, 8, 2. Pair means 1, 2, 9, 3.5: at 4 only the third is high (the
        # fourth, 5 for a alone, is not: a split on a's tau would count b's drop there as a high prompt's)
        a = eval_json([[1], [2], [10], [5]])
        b = eval_json([[1], [2], [8], [2]])
        r = collect.prompt_split(a, b, 4.0)
        mean_a = (1 + 2 + 10 + 5) / 4
        self.assertAlmostEqual(r["ratio"], (1 + 2 + 8 + 2) / 4 / mean_a)
        self.assertAlmostEqual(r["high"], (8 - 10) / 4 / mean_a)
        self.assertAlmostEqual(r["low"], (2 - 5) / 4 / mean_a)
        self.assertAlmostEqual(r["low"] + r["high"], r["ratio"] - 1)  # the two parts make the whole difference
        self.assertEqual((r["prompts"], r["high_prompts"]), (4, 1))
        self.assertIsNone(collect.prompt_split(a, eval_json([[1]], records=[99]), 4.0))  # no prompt in common
        with tempfile.TemporaryDirectory() as tmp:
            dirs = []
            for run, (pa, pb) in enumerate(((a, b), (b, a))):
                d = os.path.join(tmp, f"r{run}")
                os.makedirs(d)
                dirs.append(d)
                for label, j in (("ours-a", pa), ("ours-f", pb)):
                    with open(os.path.join(d, collect.eval_name(label, {"steps": 10})), "w") as f:
                        json.dump(j, f)
            row = collect.seeds("ours-a", "ours-f", dirs)[0]
            back = collect.prompt_split(b, a, 4.0)
            self.assertAlmostEqual(row["by_prompt_ratio"][0], (r["ratio"] + back["ratio"]) / 2)
            self.assertAlmostEqual(row["by_prompt_high"][0], (r["high"] + back["high"]) / 2)
            self.assertAlmostEqual(row["by_prompt_low"][1], abs(r["low"] - back["low"]) / 2)  # stdev of 2 / sqrt(2)
            out = subprocess.run([sys.executable, os.path.join(QUALITY, "collect.py"), "seeds", "ours-a", "ours-f",
                                  *dirs, "--by-prompt", "--split", "4"], capture_output=True, text=True,
                                 check=True).stdout
            self.assertIn("the mean over prompts of each prompt's tau", out)
            self.assertIn(f"snapshot 1: {100 * (r['ratio'] - 1):+.1f}, {100 * (back['ratio'] - 1):+.1f} %", out)
            self.assertIn("(prompts at or above per run: 1, 1)", out)

    def test_summarise_cells_and_paired_lines(self):
        with tempfile.TemporaryDirectory() as tmp:
            ev = os.path.join(tmp, "eval")
            os.makedirs(ev)
            runs = []
            for trainer, steps, acc in (("ours-a", 100, [[3, 3], [1, 3]]), ("reference", 50, [[1, 1], [1, 3]])):
                snap = {"trainer": trainer, "steps": steps, "seconds": 40.0, "budget_s": 40.0, "tokens": 1000,
                        "anchors": 100, "dir": "x"}
                run = {"trainer": trainer, "snapshots": [snap]}
                runs.append(os.path.join(tmp, trainer + ".json"))
                with open(runs[-1], "w") as f:
                    json.dump(run, f)
                with open(os.path.join(ev, collect.eval_name(trainer, snap)), "w") as f:
                    json.dump(eval_json(acc), f)
            out = subprocess.run([sys.executable, os.path.join(QUALITY, "collect.py"), "summarise", "--runs", *runs,
                                  "--eval-dir", ev, "--budgets", "40", "--out-json", os.path.join(tmp, "r.json"),
                                  "--out-md", os.path.join(tmp, "r.md")], capture_output=True, text=True, check=True)
            md = out.stdout
            self.assertIn("| 40 | 2.500 ± 0.500 | 1.500 ± 0.500 |", md)        # taus 3, 2 and 1, 2
            self.assertIn("| 40 | 2.500 | 1.500 |", md)                        # steps tau 10/4, 6/4
            # prompt by prompt: 3 - 1 and 2 - 2: mean 1, standard deviation sqrt(2), over sqrt(2) prompts
            self.assertIn("- 40 s, ours-a: τ +1.000 ± 1.000 (2 prompts), steps τ +66.7 ± ", md)
            with open(os.path.join(tmp, "r.json")) as f:
                row = json.load(f)["table"][0]["ours-a"]
            self.assertAlmostEqual(row["tau_se"], 0.5)
            self.assertAlmostEqual(row["steps_tau"], 2.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
