"""bench/quality on the CPU at tiny sizes: the reference trainer's pieces against independent computations
(bench/ref_drafter_step.py's layers, a per-block loop for the loss, torch's CosineAnnealingLR for the schedule),
and run.sh end to end (target -> reference -> dflash-train -> dflash-eval -> table) on a 6-layer hidden-64 Qwen3
with the real vocabulary. Needs torch (DFLASH_TORCH=1 tools/setup.sh); the end-to-end part also the built
dflash-train and dflash-eval (DFLASH_BIN)."""
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

import numpy as np
import torch

SRC = os.environ.get("DFLASH_SRC") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "bench", "quality"))
sys.path.insert(0, os.path.join(SRC, "bench"))
import collect  # noqa: E402
import dflash_ref as R  # noqa: E402
import ref_drafter_step as RDS  # noqa: E402

TARGET_CFG = {"vocab_size": 151936, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 6,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
              "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}, "max_position_embeddings": 4096}


def drafter(block=4, seed=0):
    torch.manual_seed(seed)
    d = R.DFlashDrafter(R.drafter_config(TARGET_CFG, 2, block_size=block))
    with torch.no_grad():  # norms away from 1 so a swapped norm would show
        for n, p in d.named_parameters():
            if "norm" in n:
                p.uniform_(0.5, 1.5)
    return d


def fp32_rope(pos, hd, theta=1e6):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = pos.float()[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return ang.cos(), ang.sin()


class Pieces(unittest.TestCase):
    def test_layer_ids_official_rule(self):
        self.assertEqual(collect.build_target_layer_ids(36, 5), [1, 9, 17, 25, 33])   # Qwen3-8B
        self.assertEqual(collect.build_target_layer_ids(64, 5), [1, 16, 31, 46, 61])  # Qwen3.6-27B
        self.assertEqual(collect.build_target_layer_ids(6, 2), [1, 3])
        self.assertEqual(collect.build_target_layer_ids(36, 1), [18])

    def test_drafter_matches_ref_drafter_step(self):
        """One sequence: the batched drafter equals bench/ref_drafter_step.py's layers with the same weights."""
        bs, T, H = 4, 40, 64
        d = drafter(bs)
        anchors = torch.tensor([3, 11, 30])
        N = len(anchors)
        feats = torch.randn(1, T, 2 * H)
        noise = torch.randn(1, N * bs, H)
        pos = torch.cat([torch.arange(T), (anchors[:, None] + torch.arange(bs)[None]).reshape(-1)])[None]
        mask = R.create_dflash_sdpa_mask(anchors[None], torch.ones(1, N, dtype=torch.bool), T, bs, "cpu")
        ours = d(pos, noise, feats, mask, "sdpa")[0]
        # the same through ref_drafter_step.Layer
        s = dict(H=H, I=128, nh=4, nkv=2, hd=16)
        th = d.hidden_norm(d.fc(feats[0]))
        x = noise[0]
        rq, rc = fp32_rope(pos[0, T:], 16), fp32_rope(torch.arange(T), 16)
        dm = RDS.dense_mask(anchors, T, bs, 0, "cpu")
        for L in d.layers:
            ref = RDS.Layer(s)
            sd = {"input_layernorm.weight": L.input_layernorm.weight, "post_attention_layernorm.weight": L.post_attention_layernorm.weight,
                  "q_norm.weight": L.self_attn.q_norm.weight, "k_norm.weight": L.self_attn.k_norm.weight}
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                sd[n + ".weight"] = getattr(L.self_attn, n).weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                sd[n + ".weight"] = getattr(L.mlp, n).weight
            ref.load_state_dict(sd)
            x = ref(x, th, rq, rc, dm, "sdpa")
        x = d.norm(x)
        torch.testing.assert_close(ours, x, rtol=1e-5, atol=1e-5)

    def test_flex_matches_sdpa(self):
        """The flex_attention BlockMask path (eager, forward only on the CPU) equals the dense-mask path, with a
        block that was not kept (its rows are zero in both)."""
        try:
            from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
        except ImportError:
            self.skipTest("no flex_attention in this torch")
        import dflash_ref
        bs, S = 4, 48
        d = drafter(bs)
        anchors = torch.tensor([[2, 20, 40], [5, 9, 0]])
        keep = torch.tensor([[True, True, True], [True, True, False]])
        N = 3
        feats, noise = torch.randn(2, S, 128), torch.randn(2, N * bs, 64)
        pos = torch.cat([torch.arange(S)[None].expand(2, -1), (anchors[..., None] + torch.arange(bs)).reshape(2, -1)], 1)
        dense = d(pos, noise, feats, R.create_dflash_sdpa_mask(anchors, keep, S, bs, "cpu"), "sdpa")
        from torch.nn.attention.flex_attention import flex_attention as eager_flex
        saved = dflash_ref.flex_attention_compiled
        dflash_ref.flex_attention_compiled = lambda: eager_flex
        try:
            with torch.no_grad():  # CPU flex_attention has no backward
                flex = d(pos, noise, feats, R.create_dflash_block_mask(anchors, keep, S, bs, "cpu"), "flex")
                dense = dense.detach()
        finally:
            dflash_ref.flex_attention_compiled = saved
        torch.testing.assert_close(flex, dense, rtol=1e-4, atol=1e-4)

    def test_anchors(self):
        torch.manual_seed(3)
        lm = torch.zeros(3, 50)
        lm[0, 10:50] = 1        # 39 valid positions
        lm[1, 5:8] = 1          # 2 valid
        lm[2, 0:30] = 1         # 29 valid
        a, keep = R.sample_anchor_positions(50, lm, 16, "cpu")
        self.assertEqual(tuple(a.shape), (3, 16))
        self.assertEqual(keep.sum(1).tolist(), [16, 2, 16])
        for b in range(3):
            kept = a[b][keep[b]]
            self.assertTrue(bool((kept[1:] > kept[:-1]).all()))        # sorted, distinct
            self.assertTrue(bool((lm[b, kept] == 1).all() and (lm[b, kept + 1] == 1).all()))

    def test_loss_matches_a_direct_computation(self):
        bs, S, V = 4, 30, 151936
        d = drafter(bs)
        emb = torch.nn.Embedding(V, 64)
        head = torch.nn.Linear(64, V, bias=False)
        m = R.OnlineDFlash(d, emb, head, num_anchors=5, gamma=3.0, chunk_blocks=2, attention="sdpa")
        ids = torch.randint(0, 1000, (2, S))
        lm = torch.zeros(2, S)
        lm[0, 4:S] = 1
        lm[1, 2:12] = 1
        hs = torch.randn(2, S, 128)
        torch.manual_seed(7)
        loss, acc, st = m(ids, hs, lm)
        torch.manual_seed(7)
        anchors, keep = R.sample_anchor_positions(S, lm, 5, "cpu")
        N = anchors.shape[1]
        noise = torch.full((2, N * bs), d.mask_token_id)
        for b in range(2):
            for n in range(N):
                if keep[b, n]:
                    noise[b, n * bs] = ids[b, anchors[b, n]]
        pos = torch.cat([torch.arange(S)[None].expand(2, -1), (anchors[..., None] + torch.arange(bs)).reshape(2, -1)], 1)
        out = d(pos, emb(noise), hs, R.create_dflash_sdpa_mask(anchors, keep, S, bs, "cpu"), "sdpa")
        num = den = 0.0
        for b in range(2):
            for n in range(N):
                a = int(anchors[b, n])
                for k in range(1, bs):
                    if not keep[b, n] or a + k >= S or lm[b, a + k] == 0:
                        continue
                    w = math.exp(-(k - 1) / 3.0)
                    logits = head(out[b, n * bs + k])
                    num = num + w * torch.nn.functional.cross_entropy(logits[None], ids[b, a + k][None])
                    den += w
        torch.testing.assert_close(loss, num / den, rtol=1e-5, atol=1e-6)
        self.assertEqual(st["anchors"], int(keep.sum()))
        loss.backward()  # through the checkpointed chunks
        self.assertTrue(all(p.grad is not None for p in d.parameters()))

    def test_schedule_is_specforges(self):
        """Closed form vs SpecForge's CosineAnnealingWarmupLR: linear (s+1)/W warmup, then torch's
        CosineAnnealingLR over total - W steps down to 0."""
        total, W, base = 50, 2, 6e-4
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=base)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, total - W, eta_min=0.0)
        for s in range(total):
            if s < W:
                expect = base * (s + 1) / W
            else:
                expect = opt.param_groups[0]["lr"]
                opt.step()
                cos.step()
            self.assertAlmostEqual(R.lr_at(s, base, total, W), expect, delta=1e-12)
        self.assertAlmostEqual(R.lr_at(total, base, total, W), 0.0, delta=1e-12)

    def test_time_accounting(self):
        st = {"step": np.arange(1, 9), "time_s": np.array([10.0, 11, 12, 13, 20, 21, 22, 23])}
        secs, med = collect.training_seconds(st, {4})  # the save after step 4 took 6 s more
        self.assertEqual(med, 1.0)
        self.assertEqual(secs, [1, 2, 3, 4, 5, 6, 7, 8])
        first, interp = collect.time_to_reach([(60, 1.3), (120, 1.6)], 1.45)
        self.assertEqual(first, 120)
        self.assertAlmostEqual(interp, 90.0)
        self.assertEqual(collect.time_to_reach([(60, 1.3)], 1.45), (None, None))


def synthetic_dataset(path, n, seed):
    import h5py
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(n):
        L, start = int(rng.integers(40, 100)), int(rng.integers(0, 1000))
        x = [151644] + [int(v) for v in (start + 7 * np.arange(L)) % 2000]
        p = int(rng.integers(5, 12))
        ids.append(x)
        masks.append([0] * p + [1] * (len(x) - p))
    with h5py.File(path, "w") as f:
        f["tokens"] = np.concatenate(ids).astype(np.int32)
        f["offsets"] = np.cumsum([0] + [len(x) for x in ids]).astype(np.int64)
        f["loss_mask"] = np.concatenate(masks).astype(np.uint8)
        f.attrs["vocab_size"] = 151936
        f.attrs["tokenizer"] = "synthetic"
        f.attrs["format_version"] = 1


@unittest.skipUnless(all(os.path.exists(os.path.join(os.environ.get("DFLASH_BIN", ""), b))
                         for b in ("dflash-train", "dflash-eval")), "needs DFLASH_BIN with dflash-train and dflash-eval")
class RunSh(unittest.TestCase):
    def test_reference_loss_equals_dflash_train_eval_loss(self):
        """One drafter (large random weights, so the loss depends on every detail), saved by the reference in the
        release format: the reference's loss over every anchor of a small set equals dflash-train's --eval-data
        loss of the same drafter (CPU, float32, after one step at lr 1e-30): same features, mask, RoPE, weights,
        labels and normalisation on both sides."""
        from safetensors.torch import load_file
        from transformers import Qwen3ForCausalLM
        import h5py
        import train_target
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            tcfg = train_target.model_config(64, 6, 151936, 4096, "yes")
            tm = Qwen3ForCausalLM(tcfg)
            with torch.no_grad():  # unit-sized embeddings: the tied lm_head gives peaked logits
                tm.model.embed_tokens.weight.normal_(0.0, 1.0)
            tm.to(torch.bfloat16).save_pretrained(os.path.join(tmp, "target"))
            with open(os.path.join(tmp, "target", "config.json")) as f:
                cfg = R.drafter_config(json.load(f), 2)
            d = R.DFlashDrafter(cfg)
            with torch.no_grad():
                for n, p in d.named_parameters():
                    p.copy_(torch.rand_like(p) + 0.5 if "norm" in n else torch.randn_like(p) * 0.3)
            R.save_drafter(d, os.path.join(tmp, "drafter"))
            rng = np.random.default_rng(5)
            ids = [rng.integers(0, 3000, int(n)).tolist() for n in (40, 33, 47, 28)]
            masks = [[0] * 12 + [1] * (len(x) - 12) for x in ids]
            data = os.path.join(tmp, "data.h5")
            with h5py.File(data, "w") as f:
                f["tokens"] = np.concatenate(ids).astype(np.int32)
                f["offsets"] = np.cumsum([0] + [len(x) for x in ids]).astype(np.int64)
                f["loss_mask"] = np.concatenate(masks).astype(np.uint8)
                f.attrs["vocab_size"] = 151936
                f.attrs["tokenizer"] = "synthetic"
                f.attrs["format_version"] = 1
            # the reference's side
            target = Qwen3ForCausalLM.from_pretrained(os.path.join(tmp, "target"), dtype=torch.float32).eval()
            ref = R.DFlashDrafter(cfg)
            ref.load_state_dict({k: v.float() for k, v in load_file(os.path.join(tmp, "drafter", "model.safetensors")).items()})
            m = R.OnlineDFlash(ref, target.model.embed_tokens, target.lm_head, num_anchors=10 ** 6, gamma=7.0,
                               attention="sdpa")
            S = max(len(x) for x in ids)
            x = torch.zeros(4, S, dtype=torch.long)
            lm = torch.zeros(4, S)
            att = torch.zeros(4, S, dtype=torch.long)
            for i, (a, b) in enumerate(zip(ids, masks)):
                x[i, :len(a)], lm[i, :len(a)], att[i, :len(a)] = torch.tensor(a), torch.tensor(b, dtype=torch.float32), 1
            with torch.no_grad():
                loss, _, st = m(x, R.TargetFeatures(target, cfg["dflash_config"]["target_layer_ids"])(x, att), lm)
            # dflash-train's side
            env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                       OMPI_MCA_rmaps_base_oversubscribe="1")
            r = subprocess.run(["mpirun", "-np", "2", os.path.join(os.environ["DFLASH_BIN"], "dflash-train"), "--backend", "cpu",
                                "--topology", "1-1", "--target", os.path.join(tmp, "target"), "--drafter",
                                os.path.join(tmp, "drafter"), "--data", data, "--eval-data", data, "--eval-every", "0",
                                "--max-steps", "1", "--lr", "1e-30", "--max-anchors", "1024", "--token-budget", "512",
                                "--out", os.path.join(tmp, "run")], env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            with h5py.File(os.path.join(tmp, "run", "metrics.h5"), "r") as f:
                theirs = float(f["eval/loss"][-1])
                blocks = int(f["eval/anchors"][-1])
            print(f"reference loss {float(loss):.5f}, dflash-train eval loss {theirs:.5f}, {blocks} blocks")
            self.assertEqual(blocks, st["anchors"])
            self.assertGreater(abs(float(loss) - math.log(151936)), 1.0)  # far from uniform: the check can fail
            self.assertAlmostEqual(float(loss), theirs, delta=2e-3 * theirs)

    def test_stages_end_to_end(self):
        """run.sh's target, ref, ours-a, ours-c (DFlash2), eval (greedy and sampled), table and speed stages on the
        CPU (data made here; ours-b needs options of later builds)."""
        with tempfile.TemporaryDirectory() as tmp:
            work, out = os.path.join(tmp, "work"), os.path.join(tmp, "out")
            os.makedirs(os.path.join(work, "data"))
            os.makedirs(os.path.join(work, "tokenizer"))
            synthetic_dataset(os.path.join(work, "data", "train.h5"), 200, 0)
            synthetic_dataset(os.path.join(work, "data", "heldout.h5"), 20, 1)
            open(os.path.join(work, "data.done"), "w").close()
            env = dict(os.environ, WORK=work, BIN=os.environ["DFLASH_BIN"], BACKEND="cpu", PY=sys.executable,
                       HIDDEN="64", BUDGETS="8,16", TARGET_SECONDS="30",
                       TARGET_ARGS="--device cpu --max-steps 3 --seq-len 64 --batch-tokens 256 --micro-batch 4",
                       REF_ARGS="--device cpu --attention sdpa --dtype float32 --calib-steps 3 --batch-size 2 --num-anchors 16",
                       TOKEN_BUDGET="256", A_ARGS="--max-anchors 8", A_RATE="0.25", EVAL_PROMPTS="2", EVAL_NEW="8")
            env["C_RATE"] = "0.25"  # ours-c: a DFlash2 drafter (block 8, the strict selector), issue 47's comparison
            r = subprocess.run(["bash", os.path.join(SRC, "bench", "quality", "run.sh"), out,
                                "target", "ref", "ours-a", "ours-c", "eval", "table"], env=env, capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 0, r.stdout[-4000:] + r.stderr[-4000:])
            with open(os.path.join(out, "results.json")) as f:
                res = json.load(f)
            self.assertEqual(res["budgets_s"], [8.0, 16.0])
            self.assertTrue(res["same_target"])
            names = [run["trainer"] for run in res["runs"]]
            self.assertEqual(names, ["ours-a", "ours-c", "reference"])
            with open(os.path.join(res["runs"][1]["snapshots"][0]["dir"], "config.json")) as f:
                cfg = json.load(f)  # a DFlash2 release keeps its block in dflash_config
                self.assertEqual(cfg["architectures"], ["DFlash2DraftModel"])
                self.assertEqual(cfg.get("block_size", cfg["dflash_config"].get("block_size")), 8)  # not DFlash's 16
            for run in res["runs"]:
                self.assertTrue(run["snapshots"])
                for s in run["snapshots"]:
                    self.assertIsNotNone(s["tau"], s)          # every drafter went through dflash-eval
                    self.assertGreaterEqual(s["tau"], 1.0)
                    self.assertGreater(s["tokens"], 0)
                    self.assertGreater(s["anchors"], 0)
            ours = res["runs"][0]
            self.assertEqual([s["steps"] for s in ours["snapshots"]], [2, 4])  # A_RATE 0.25 step/s: every 2, 4 in all
            rate = subprocess.run([sys.executable, os.path.join(SRC, "bench", "quality", "collect.py"), "rate",
                                   os.path.join(work, "ours-a", "metrics.h5")], capture_output=True, text=True)
            self.assertEqual(rate.returncode, 0, rate.stderr)
            self.assertGreater(float(rate.stdout), 0)
            with open(os.path.join(out, "results.md")) as f:
                md = f.read()
            self.assertIn("| budget (s) | τ ours-a | τ ours-c | τ reference |", md)
            self.assertLessEqual(len(os.listdir(out)), 8)  # what the GPU tool brings back
            for stage in ("target", "ref", "ours-a", "ours-c", "eval"):
                self.assertTrue(os.path.exists(os.path.join(out, stage + ".log")), stage)
            # idempotent: a second call finds every stage done and redoes nothing
            r2 = subprocess.run(["bash", os.path.join(SRC, "bench", "quality", "run.sh"), out, "target", "ref", "ours-a"],
                                env=env, capture_output=True, text=True)
            self.assertEqual(r2.returncode, 0, r2.stdout[-2000:] + r2.stderr[-2000:])
            self.assertIn("done earlier", r2.stdout)
            # issue 46: ours-e on the FP8 target's features, ours-f over the FP8 wire, each as many steps as ours-a
            # (its rate), evaluated under the FP8 target (the CPU backend emulates it): their table apart
            env_fp8 = dict(env, EVAL_TARGET_PRECISION="fp8", EVAL_RUNS="ours-a ours-e ours-f")
            env_fp8.pop("A_RATE")
            r5 = subprocess.run(["bash", os.path.join(SRC, "bench", "quality", "run.sh"), out, "ours-e", "ours-f",
                                 "eval", "table"], env=env_fp8, capture_output=True, text=True)
            self.assertEqual(r5.returncode, 0, r5.stdout[-4000:] + r5.stderr[-4000:])
            with open(os.path.join(out, "results-fp8.json")) as f:
                fp8 = json.load(f)
            by_name = {run["trainer"]: run for run in fp8["runs"]}
            self.assertEqual(sorted(by_name), ["ours-a", "ours-c", "ours-e", "ours-f", "reference"])
            for name in ("ours-a", "ours-e", "ours-f"):
                run = by_name[name]
                self.assertEqual([s["steps"] for s in run["snapshots"]], [2, 4], name)  # ours-a's steps
                for s in run["snapshots"]:
                    self.assertIsNotNone(s["tau"], s)
            evals = [n for n in os.listdir(os.path.join(work, "eval-fp8")) if not n.endswith((".log", ".tmp"))]
            self.assertTrue(evals)
            for n in evals:  # every tau of this table is the FP8 target's
                with open(os.path.join(work, "eval-fp8", n)) as f:
                    self.assertEqual(json.load(f)["target_linears"], "fp8 blocks", n)
            # sampled decoding (T = 1): its taus and table apart from the greedy ones
            env1 = dict(env, EVAL_TEMPERATURE="1", EVAL_RUNS="ours-c")
            r3 = subprocess.run(["bash", os.path.join(SRC, "bench", "quality", "run.sh"), out, "eval", "table"],
                                env=env1, capture_output=True, text=True)
            self.assertEqual(r3.returncode, 0, r3.stdout[-4000:] + r3.stderr[-4000:])
            self.assertTrue(os.listdir(os.path.join(work, "eval-t1")))
            with open(os.path.join(out, "results-t1.json")) as f:
                sampled = json.load(f)
            for s in sampled["runs"][1]["snapshots"]:  # ours-c
                self.assertIsNotNone(s["tau"], s)
            # the speed stage: ours-a on the colocated layout and on 1-1, rates only
            out_speed = os.path.join(tmp, "speed")
            env2 = dict(env, SPEED_RECIPES="a", SPEED_LAYOUTS="colocated 1-1", A_CALIB_STEPS="6")
            r4 = subprocess.run(["bash", os.path.join(SRC, "bench", "quality", "run.sh"), out_speed, "speed"],
                                env=env2, capture_output=True, text=True)
            self.assertEqual(r4.returncode, 0, r4.stdout[-4000:] + r4.stderr[-4000:])
            with open(os.path.join(out_speed, "speed-summary.txt")) as f:
                summary = f.read()
            self.assertIn("## ours-a colocated", summary)
            self.assertIn("## ours-a 1-1", summary)
            self.assertEqual(summary.count("K anchors/s"), 2)


if __name__ == "__main__":
    unittest.main()
