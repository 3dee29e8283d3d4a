#!/usr/bin/env python3
"""dflash-report --wandb into a shared --out (issue 48 item 1; docs/checkpoint.md "The run directory"): W&B
writes its directory by path from its own service process, so the export has it write a private directory
(tempfile.mkdtemp under $TMPDIR), waits until W&B has ended (wandb.teardown), and copies the finished tree
into OUT/wandb through safe_out.StagedDir. A link swapped in at OUT/wandb while W&B writes, or while the
tree is copied in, is refused naming OUT/wandb, and nothing where the link points is written.

W&B here is a stand-in module that writes the way W&B does (by path, making its directories as it goes,
a late write at finish): no wandb package needed. tests/report/test_export.py's
test_wandb_offline_run_holds_the_history runs the real one. Run: python3 -m unittest -v test_wandb_out
(from tests/report; tests/e2e/test_report_py.sh discovers it).
"""
import os
import shutil
import sys
import tempfile
import types
import unittest

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))
sys.path.insert(0, HERE)

from dflash_report import export, safe_out  # noqa: E402
from dflash_report.load import Run  # noqa: E402
from test_export import rich_run  # noqa: E402

RUN = "offline-run-20261201_100000-abc"


class StandInWandb:
    """A module that logs like W&B: init(dir=D) -> D/wandb/RUN/..., latest-run and debug.log links beside it,
    every write by path after makedirs (as W&B's service does), one file written at finish. on_log(step) is
    called before each row is written; calls records init, finish, teardown in order."""

    def __init__(self, on_log=None):
        self.on_log = on_log or (lambda step: None)
        self.calls = []
        self.module = types.ModuleType("wandb")
        self.module.Settings = type("Settings", (), {"model_fields": {}})
        self.module.init = self.init
        self.module.teardown = lambda: self.calls.append("teardown")

    def init(self, mode, dir, **kw):  # noqa: A002 (W&B's own keyword)
        self.calls.append("init")
        top = os.path.join(dir, "wandb")
        run_dir = os.path.join(top, RUN)
        os.makedirs(os.path.join(run_dir, "logs"))
        for link, text in (("latest-run", RUN), ("debug.log", f"{RUN}/logs/debug.log")):  # replaced, as W&B does
            if os.path.lexists(os.path.join(top, link)):
                os.unlink(os.path.join(top, link))
            os.symlink(text, os.path.join(top, link))
        stand_in = self

        def write(rel, text):
            path = os.path.join(run_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a") as f:
                f.write(text)

        class R:
            dir = os.path.join(run_dir, "files")
            id = "abc"

            def log(self, row, step):
                stand_in.on_log(step)
                write("run-abc.wandb", f"{step}\n")

            def finish(self):
                stand_in.calls.append("finish")
                write("files/late.txt", "written at finish\n")
                write("logs/debug.log", "done\n")
        write("logs/debug.log", "start\n")
        return R()


class WandbPrivateDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dflash-wandb-out-")
        self.out = os.path.join(self.tmp, "out")
        self.wandb_dir = os.path.join(self.out, "wandb")
        self.victim = os.path.join(self.tmp, "victim")
        self.private_tmp = os.path.join(self.tmp, "private-tmp")
        for d in (self.out, self.victim, self.private_tmp):
            os.makedirs(d)
        with open(os.path.join(self.victim, "keep"), "w") as f:
            f.write("outside --out\n")
        self.run = Run(rich_run(os.path.join(self.out, "metrics.h5")))
        # an earlier export's run, as W&B left it
        os.makedirs(os.path.join(self.wandb_dir, "offline-run-old", "files"))
        with open(os.path.join(self.wandb_dir, "offline-run-old", "run-old.wandb"), "w") as f:
            f.write("old\n")
        os.symlink("offline-run-old", os.path.join(self.wandb_dir, "latest-run"))
        self.saved = sys.modules.get("wandb"), tempfile.tempdir
        tempfile.tempdir = self.private_tmp  # where the private directory goes ($TMPDIR)

    def tearDown(self):
        wandb, tempfile.tempdir = self.saved
        if wandb is None:
            sys.modules.pop("wandb", None)
        else:
            sys.modules["wandb"] = wandb
        shutil.rmtree(self.tmp, ignore_errors=True)

    def export(self, stand_in):
        sys.modules["wandb"] = stand_in.module
        return export.write_wandb(self.run, "proj", "myrun", self.out, mode="offline")

    def swap_for_link(self, *_):
        if not os.path.islink(self.wandb_dir):
            os.rename(self.wandb_dir, self.wandb_dir + ".moved")
            os.symlink(self.victim, self.wandb_dir)

    def assert_refused_and_untouched(self, refused):
        self.assertIn(f"{self.wandb_dir} is a symbolic link: refused", str(refused.exception))
        self.assertEqual(os.listdir(self.victim), ["keep"])  # nothing written where the link points
        self.assertEqual(os.listdir(self.private_tmp), [])   # the private directory removed
        self.assertEqual(sorted(os.listdir(self.wandb_dir + ".moved")), ["latest-run", "offline-run-old"])
        self.assertEqual([n for n in os.listdir(self.out) if n.startswith(".wandb.")], [])  # no staging left

    def test_finished_tree_is_copied_in_beside_the_earlier_runs(self):
        stand_in = StandInWandb()
        seen = []
        stand_in.module.teardown = lambda: (stand_in.calls.append("teardown"),
                                            seen.append(os.path.exists(os.path.join(self.wandb_dir, RUN))))
        old_inode = os.stat(os.path.join(self.wandb_dir, "offline-run-old", "run-old.wandb")).st_ino
        out = self.export(stand_in)
        self.assertEqual(stand_in.calls, ["init", "finish", "teardown"])
        self.assertEqual(seen, [False])  # nothing in OUT before W&B has ended
        run_dir = os.path.join(self.wandb_dir, RUN)
        self.assertEqual(out["dir"], run_dir)
        with open(os.path.join(run_dir, "run-abc.wandb")) as f:
            self.assertEqual(len(f.read().split()), out["rows"])
        with open(os.path.join(run_dir, "files", "late.txt")) as f:  # the write at finish is in the copy
            self.assertEqual(f.read(), "written at finish\n")
        self.assertEqual(os.readlink(os.path.join(self.wandb_dir, "latest-run")), RUN)
        self.assertEqual(os.readlink(os.path.join(self.wandb_dir, "debug.log")), f"{RUN}/logs/debug.log")
        self.assertEqual(os.stat(os.path.join(self.wandb_dir, "offline-run-old", "run-old.wandb")).st_ino, old_inode)
        self.assertEqual(os.listdir(self.private_tmp), [])
        self.assertEqual(sorted(n for n in os.listdir(self.out) if n.startswith(".")), [])

    def test_link_swapped_in_while_wandb_writes(self):
        stand_in = StandInWandb(on_log=self.swap_for_link)
        with self.assertRaises(safe_out.Refused) as refused:
            self.export(stand_in)
        self.assertEqual(stand_in.calls, ["init", "finish", "teardown"])
        self.assert_refused_and_untouched(refused)

    def test_link_swapped_in_while_the_tree_is_copied_in(self):
        copy_tree = safe_out.copy_tree

        def copy_then_swap(*a, **kw):
            made = copy_tree(*a, **kw)
            self.swap_for_link()
            return made
        safe_out.copy_tree = copy_then_swap
        try:
            with self.assertRaises(safe_out.Refused) as refused:
                self.export(StandInWandb())
        finally:
            safe_out.copy_tree = copy_tree
        self.assert_refused_and_untouched(refused)

    def test_link_or_file_at_the_start_is_refused_before_wandb_runs(self):
        self.swap_for_link()
        stand_in = StandInWandb()
        with self.assertRaises(safe_out.Refused) as refused:
            self.export(stand_in)
        self.assertEqual(stand_in.calls, [])
        self.assert_refused_and_untouched(refused)
        os.unlink(self.wandb_dir)
        with open(self.wandb_dir, "w") as f:
            f.write("a file\n")
        with self.assertRaises(safe_out.Refused) as refused:
            self.export(stand_in)
        self.assertIn(f"{self.wandb_dir} is not a directory: refused", str(refused.exception))

    def test_failed_start_still_waits_for_the_service(self):
        stand_in = StandInWandb()

        def init(**kw):
            stand_in.calls.append("init")
            raise RuntimeError("no network here")
        stand_in.module.init = init
        with self.assertRaisesRegex(RuntimeError, "no network here"):
            self.export(stand_in)
        self.assertEqual(stand_in.calls, ["init", "teardown"])
        self.assertEqual(os.listdir(self.private_tmp), [])
        self.assertEqual(sorted(os.listdir(self.wandb_dir)), ["latest-run", "offline-run-old"])

    def test_service_that_fails_at_teardown_is_an_error(self):
        stand_in = StandInWandb()

        def teardown():
            sys.exit(3)  # what wandb's teardown does when its service process ended badly
        stand_in.module.teardown = teardown
        with self.assertRaisesRegex(RuntimeError, "W&B's service process ended with exit code 3"):
            self.export(stand_in)
        self.assertFalse(os.path.exists(os.path.join(self.wandb_dir, RUN)))
        self.assertEqual(os.listdir(self.private_tmp), [])


if __name__ == "__main__":
    unittest.main()
