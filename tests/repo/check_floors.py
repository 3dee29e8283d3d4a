#!/usr/bin/env python3
"""The floors of the house (docs/architecture.md): each floor uses only those below it.

Every source and header under src/, kernels/ and include/dflash/ belongs to one floor; a file that includes a
header of a higher floor is an up-arrow, and this check fails naming it. Floors of equal rank (the two model
folders, data and metrics, io and core, eval and checkpoint) may use each other. A public header belongs to the
folder that implements it (OWNERS); a private header to its folder.

Usage: tests/repo/check_floors.py [REPO]   (exit 1 on an up-arrow, 0 otherwise)
"""
import os
import re
import sys

RANK = {
    "base": 0,
    "core": 1, "io": 1,
    "ops": 2, "kernels": 2,
    "data": 3, "metrics": 3,
    "model": 4, "drafter": 4,
    "eval": 5, "checkpoint": 5,
    "comm": 6,
    "selftest": 7,
    "runtime": 8,
    "plan": 8,
    "apps": 9,
}

# include/dflash/<name>.h -> the floor that owns it (where it is implemented, or whose contract it is).
OWNERS = {
    "anchors": "drafter", "auto_topology": "runtime", "backend": "core", "checkpoint": "checkpoint",
    "clock": "base", "cost_model": "plan", "data_position": "base", "gpu_reading": "base", "grad_buckets": "base",
    "data": "data", "data_mix": "data", "data_plane": "comm", "data_source": "data", "device_async": "base",
    "drafter": "drafter", "drafter_model": "drafter", "drafter_ops": "ops", "error": "base",
    "eval_prompts": "eval", "eval_set": "data", "eval_stats": "drafter", "flow_control": "comm",
    "grad_reducer": "comm", "hf_config": "io", "fp8": "ops", "fp8_convert": "model", "target_quant": "io", "hs_batch": "base", "hs_wire": "comm", "jsonl_prep": "data", "message_tags": "base", "micro_batches": "base",
    "metrics": "metrics", "mpi_typed": "base", "nvml": "metrics", "ops": "ops", "optim": "ops",
    "options": "runtime", "packed_batch": "base", "pair_order": "comm", "rng": "base", "run_log": "base",
    "runtime": "runtime", "safe_dir": "io", "safe_file": "io", "safetensors": "io", "schedule": "drafter", "spec_decode": "eval",
    "stochastic_round": "ops", "target": "model", "tensor": "base", "tool_args": "io", "topology": "comm",
    "version": "base",
}

# kernels/ holds the CUDA twins of the ops and, beside them, the CUDA backend's own plumbing, which is core's
# (src/core/cuda makes the contexts with it).
KERNEL_PLUMBING = {"backend", "backend_entry", "bf16_util", "cuda_check", "device_limits", "device_memory", "mma_ptx"}

# The one allowed exception, and why: src/core/cuda_entry.h is the table the CUDA library fills (core's), typed by
# the op twins' own declarations (kernels/<op>.cuh, plain C++ declarations, no code), so that an op's signature
# is written only in its op header and its .cu (docs/architecture.md "The seam to the CUDA library").
ALLOWED_UP = {("src/core/cuda_entry.h", "kernels")}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def floor_of_path(rel):
    """The floor of a file of the repository (relative path), or None when it is outside the floors."""
    parts = rel.split("/")
    if parts[0] == "src" and len(parts) > 2:
        return parts[1]
    if parts[0] == "kernels":
        return "core" if os.path.splitext(parts[-1])[0] in KERNEL_PLUMBING else "kernels"
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "dflash":
        name = os.path.splitext(parts[2])[0]
        return OWNERS.get(name, "?" + name)
    return None


def resolve(repo, including, inc):
    """The repository path an #include "..." names (the build's include path: include/, src/, kernels/, and
    the including file's folder), or None for a header outside the repository."""
    for base in (os.path.dirname(including), "include", "src", "kernels"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(repo, cand)):
            return cand
    return None


def main():
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    files = []
    for top in ("src", "kernels", "include/dflash"):
        for root, _, names in os.walk(os.path.join(repo, top)):
            for n in names:
                if n.endswith((".h", ".cuh", ".cpp", ".cu")):
                    files.append(os.path.relpath(os.path.join(root, n), repo))
    bad, unknown = [], set()
    for rel in sorted(files):
        here = floor_of_path(rel)
        if here is None or here not in RANK:
            if here and here.startswith("?"):
                unknown.add(rel)
            continue
        text = open(os.path.join(repo, rel), encoding="utf-8", errors="replace").read()
        for inc in INCLUDE.findall(text):
            target = resolve(repo, rel, inc)
            if target is None:
                continue
            there = floor_of_path(target)
            if there is None:
                continue
            if there.startswith("?"):
                unknown.add(target)
                continue
            if RANK[there] > RANK[here] and (rel, there) not in ALLOWED_UP:
                bad.append(f"{rel} ({here}) includes {target} ({there})")
    for u in sorted(unknown):
        bad.append(f"{u}: no floor known for this public header (add it to OWNERS in tests/repo/check_floors.py)")
    for b in bad:
        print("up-arrow:", b)
    print(f"# floors: {len(files)} files checked, {len(bad)} up-arrow(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
