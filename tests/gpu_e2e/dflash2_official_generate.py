#!/usr/bin/env python3
"""Greedy speculative decoding of a DFlash2 export with the official z-lab code, for comparison with dflash-eval.

Loads the drafter with the official DFlash2DraftModel.from_pretrained (its key_mapping turns the release names
candidate_selector.{predecessor,successor}_codebook into the module's .weight names), the target with
transformers' AutoModelForCausalLM, and runs the official dflash_generate for each prompt. The official
module (z-lab/dflash dflash/model.py, the DFlash2 version, e.g. commit 10129599) is third-party code that
is not in this repository: pass its path.

usage:
  python3 tests/gpu_e2e/dflash2_official_generate.py --official-model /path/to/dflash/model.py \\
      --target TARGET_DIR --drafter EXPORT_DIR --prompts PROMPTS --max-new-tokens N --out OUT.jsonl \\
      [--temperature 0] [--max-prompts 32] [--max-prompt-length 2048] [--stop-token ID ...] [--no-stop] \\
      [--device cuda|cpu] [--dtype float32|bfloat16] [--compare EVAL.json]

  TARGET_DIR   Hugging Face Qwen3 checkpoint (config.json + safetensors)
  EXPORT_DIR   DFlash2 drafter in the release format: config.json with architectures ["DFlash2DraftModel"] and
               dflash_config, model.safetensors with the release tensor names (what dflash-train exports;
               tests/data/golden/dflash2-tiny-a/drafter_init is one)
  PROMPTS      either dflash-eval's own input, a token dataset DATA.h5 (/tokens, /offsets, /loss_mask;
               docs/data.md): a record's prompt is its tokens before the first loss_mask 1, records with no
               prompt or a prompt longer than --max-prompt-length are skipped, the first --max-prompts usable
               ones are taken (dflash-eval's rule, src/eval/eval_prompts.cpp);
               or JSONL, one object a line: {"prompt_ids": [...]} (the whole list is the prompt) or
               {"input_ids": [...], "loss_mask": [...]} (dflash-prep's input; the same rule as the .h5)
  OUT.jsonl    one line per prompt: {"prompt": i, "record": r, "prompt_tokens": n, "tokens": [...],
               "acceptance_lengths": [...], "tau": mean}
               i counts the usable prompts from 0 as dflash-eval's "prompt" column and r is the record index
               (dflash-eval's "record"); tokens are the new tokens after the prompt (the target's first token
               included), at most N, cut after the first stop token: what dflash-eval's --json writes as
               prompts[i].tokens.
  --compare EVAL.json   dflash-eval's --json output of the same prompts: prints the prompts whose tokens
               differ and exits 9 when any does (speculative decoding at temperature 0 is lossless, so both
               must equal the target's greedy decoding; numerics of another backend can still flip a near-tie)

Stop tokens default to dflash-eval's: eos_token_id of the target's config.json and generation_config.json.
acceptance_lengths are the official ones: per verification step, the tokens it added (accepted drafts + 1),
cut at a stop token and at the N-token limit, the last block shrunk to the rows left; dflash-eval's
"acceptance" counts the same way (docs/recipe.md section 6), step for step. --temperature > 0 runs the official sampled path (seeded by --seed): not token-comparable.

The official dflash_generate calls torch.cuda.synchronize() in its timer when asked for acceptance lengths
(return_stats=True); on a machine without CUDA this script replaces that timer with a plain clock.

Tested on the CPU (float32) with tests/data/golden/dflash2-tiny-a/{target,drafter_init} and JSONL prompts.
"""
import argparse
import importlib.util
import json
import os
import sys
import time

import torch


def load_official(path):
    """Imports the official dflash/model.py (with the name shims gen_golden_dflash2.py uses)."""
    import transformers.models.qwen3.modeling_qwen3 as mq
    if not hasattr(mq, "GradientCheckpointingLayer"):
        from transformers.modeling_layers import GradientCheckpointingLayer
        mq.GradientCheckpointingLayer = GradientCheckpointingLayer
    if not hasattr(mq, "ALL_ATTENTION_FUNCTIONS"):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        mq.ALL_ATTENTION_FUNCTIONS = ALL_ATTENTION_FUNCTIONS
    if not os.path.isfile(path):
        sys.exit(f"official model file not found: {path}")
    spec = importlib.util.spec_from_file_location("dflash_official_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("DFlash2DraftModel", "dflash_generate"):
        if not hasattr(mod, name):
            sys.exit(f"{path} has no {name}: it is not the DFlash2 version of dflash/model.py")
    if not torch.cuda.is_available():  # its timer synchronises CUDA; only the timer, not the tokens
        mod._cuda_time = time.perf_counter
    return mod


def prompt_of(tokens, mask, max_len):
    """dflash-eval's rule: the tokens before the first loss_mask 1; None (and why) when unusable."""
    first = next((i for i, m in enumerate(mask) if m), len(mask))
    if first == 0:
        return None, "no_prompt"
    if first > max_len:
        return None, "too_long"
    return list(tokens[:first]), None


def read_prompts(path, max_prompts, max_len):
    """-> [(record, prompt ids)], counts of skipped records."""
    out, skipped = [], {"no_prompt": 0, "too_long": 0}
    if path.endswith((".h5", ".hdf5")):
        import h5py
        with h5py.File(path, "r") as f:
            offs = f["offsets"][:]
            for r in range(len(offs) - 1):
                if len(out) >= max_prompts:
                    break
                tok = f["tokens"][offs[r]:offs[r + 1]].tolist()
                msk = f["loss_mask"][offs[r]:offs[r + 1]].tolist()
                p, why = prompt_of(tok, msk, max_len)
                if p is None:
                    skipped[why] += 1
                else:
                    out.append((r, p))
    else:
        with open(path) as f:
            lines = [ln for ln in f if ln.strip()]
        for r, ln in enumerate(lines):
            if len(out) >= max_prompts:
                break
            o = json.loads(ln)
            if "prompt_ids" in o:
                p, why = (list(o["prompt_ids"]), None) if len(o["prompt_ids"]) <= max_len else (None, "too_long")
                if p is not None and not p:
                    p, why = None, "no_prompt"
            else:
                p, why = prompt_of(o["input_ids"], o["loss_mask"], max_len)
            if p is None:
                skipped[why] += 1
            else:
                out.append((r, p))
    if not out:
        sys.exit(f"{path}: no usable prompt ({skipped})")
    return out, skipped


def default_stop_ids(target_dir):
    """eos_token_id of config.json and generation_config.json (dflash-eval's default_stop_ids)."""
    ids = []
    for name in ("config.json", "generation_config.json"):
        try:
            with open(os.path.join(target_dir, name)) as f:
                e = json.load(f).get("eos_token_id")
        except (OSError, ValueError):
            continue
        for v in (e if isinstance(e, list) else [e]):
            if isinstance(v, int) and v not in ids:
                ids.append(v)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--official-model", required=True, help="path of z-lab dflash/model.py (DFlash2 version)")
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", required=True)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-prompts", type=int, default=32)
    ap.add_argument("--max-prompt-length", type=int, default=2048)
    ap.add_argument("--stop-token", type=int, action="append", default=None)
    ap.add_argument("--no-stop", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    ap.add_argument("--attn-implementation", default=None, help="the target's (transformers' default if unset)")
    ap.add_argument("--compare", default=None, help="dflash-eval --json output to compare tokens with")
    args = ap.parse_args()

    from transformers import AutoModelForCausalLM
    off = load_official(args.official_model)
    dt = getattr(torch, args.dtype)
    dev = torch.device(args.device)

    def pretrained(cls, path, **kw):
        try:
            return cls.from_pretrained(path, dtype=dt, **kw)
        except TypeError:
            return cls.from_pretrained(path, torch_dtype=dt, **kw)

    tkw = {"attn_implementation": args.attn_implementation} if args.attn_implementation else {}
    target = pretrained(AutoModelForCausalLM, args.target, **tkw).to(dev).eval()
    drafter = pretrained(off.DFlash2DraftModel, args.drafter).to(dev).eval()
    arch = (drafter.config.architectures or ["?"])[0]
    if arch != "DFlash2DraftModel":
        print(f"warning: {args.drafter}/config.json says architectures {drafter.config.architectures}")
    stop = None if args.no_stop else (args.stop_token or default_stop_ids(args.target) or None)
    prompts, skipped = read_prompts(args.prompts, args.max_prompts, args.max_prompt_length)
    print(f"# official dflash_generate: target {args.target} ({target.config.num_hidden_layers} layers), drafter "
          f"{args.drafter} (block {drafter.block_size}, mask {drafter.mask_token_id}, target layers "
          f"{drafter.target_layer_ids}, top-K {drafter.candidate_selector.top_k}); {len(prompts)} prompts "
          f"(skipped {skipped}); {args.max_new_tokens} new tokens; T={args.temperature}; stop ids {stop}; "
          f"{args.device} {args.dtype}")

    results = []
    with open(args.out + ".tmp", "w") as fo:
        for i, (rec, ids) in enumerate(prompts):
            torch.manual_seed(args.seed)
            x = torch.tensor([ids], dtype=torch.long, device=dev)
            t0 = time.perf_counter()
            r = off.dflash_generate(drafter, target, x, args.max_new_tokens, stop, temperature=args.temperature,
                                    return_stats=True)
            sec = time.perf_counter() - t0
            toks = r.output_ids[0, len(ids):].tolist()
            acc = [int(a) for a in r.acceptance_lengths]
            tau = sum(acc) / len(acc) if acc else 0.0
            row = {"prompt": i, "record": rec, "prompt_tokens": len(ids), "tokens": toks,
                   "acceptance_lengths": acc, "tau": tau}
            results.append(row)
            fo.write(json.dumps(row) + "\n")
            print(f"{i:6d} {rec:6d} prompt {len(ids):5d} new {len(toks):5d} steps {len(acc):4d} tau {tau:.3f} "
                  f"({sec:.2f} s)")
    os.replace(args.out + ".tmp", args.out)
    taus = [row["tau"] for row in results]
    print(f"tau {sum(taus) / len(taus):.3f} (mean over {len(taus)} prompts of each prompt's mean acceptance length)")

    if args.compare:
        ev = json.load(open(args.compare))["prompts"]
        bad = 0
        for row in results:
            if row["prompt"] >= len(ev):
                print(f"prompt {row['prompt']}: not in {args.compare}")
                bad += 1
                continue
            e = ev[row["prompt"]]
            if e.get("record", row["record"]) != row["record"] or e["tokens"] != row["tokens"]:
                n = next((j for j, (a, b) in enumerate(zip(e["tokens"], row["tokens"])) if a != b),
                         min(len(e["tokens"]), len(row["tokens"])))
                print(f"prompt {row['prompt']} (record {row['record']}): tokens differ from dflash-eval at new "
                      f"token {n} (official {row['tokens'][n:n + 4]}, dflash-eval {e['tokens'][n:n + 4]}; lengths "
                      f"{len(row['tokens'])} / {len(e['tokens'])})")
                bad += 1
        print(f"compare: {bad} of {len(results)} prompts differ from {args.compare}")
        if bad:
            sys.exit(9)


if __name__ == "__main__":
    main()
