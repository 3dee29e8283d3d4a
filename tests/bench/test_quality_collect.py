#!/usr/bin/env python3
"""bench/quality/collect.py's eval statistics (no torch, no h5py): tau and its standard error over the prompts,
the mean acceptance length over every step, the prompt-by-prompt difference of two drafters, and the
summarise table's cells, from dflash-eval jsons written here."""
import json
import math
import os
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
            self.assertIn("- 40 s, ours-a: τ +1.000 ± 1.000 (2 prompts), steps τ +66.7 %", md)
            with open(os.path.join(tmp, "r.json")) as f:
                row = json.load(f)["table"][0]["ours-a"]
            self.assertAlmostEqual(row["tau_se"], 0.5)
            self.assertAlmostEqual(row["steps_tau"], 2.5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
