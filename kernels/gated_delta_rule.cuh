// The gated delta rule of the Qwen3.5 / Qwen3.6 hybrid target on CUDA, chunked (UT transform), forward only.
#pragma once
#include "dflash/tensor.h"
#include "ops/gated_delta.h"

namespace dflash::cuda {

// Each `decltype(ops::<op>) <op>;` declares the op's CUDA twin with the op's own signature (written once,
// in the op's header; core/cuda_entry.h says why).

// Same recurrence as ops::gated_delta_rule_forward (src/ops/gated_delta.h), per packed sequence and value
// head, run in chunks of 64 tokens:
//   out [T, nv*dv] BF16;  qkv [T, 2*nk*dk + nv*dv] BF16 (q | k | v per token, after the conv);
//   g, beta [T, nv] F32 or BF16 (each on its own);  cu_seqlens [nseq + 1] I32 in device memory;
//   state [nv, dk, dv] F32: on return the final state of the last sequence (zero if it is empty);
//   workspace BF16, at least ops::gated_delta_rule_workspace_elems(T, heads) = T * nv * 64 elements: the
//     inverse of each chunk's unit-lower-triangular system, one 64-wide row per token and value head.
// Head dims: dk and dv multiples of 8, at most 128 (padded to 64 or 128 in shared memory); nv % nk == 0.
// qkv, out and workspace 16-byte aligned.
decltype(ops::gated_delta_rule_forward) gated_delta_rule_forward;

// Which chunk-scan kernel runs. kAuto: the pipelined one (the next chunk's tiles copied by cp.async during
// the current one; 106.5 KB of shared memory per block at dk or dv > 64, 73.5 KB below) where the device
// offers that much per block (sm_90, sm_100), else the synchronous one (89 KB: sm_120's 99 KB). kSync: the synchronous one everywhere (tests
// and benchmarks compare the two). The environment variable DFLASH_GDR_SCAN=sync chooses kSync at the first
// call unless this was called before. Not thread-safe: set it before the forwards run.
enum class GdrScan { kAuto, kSync };
void set_gated_delta_rule_scan(GdrScan scan);
// Whether gated_delta_rule_forward on ctx's device runs the pipelined scan for these heads now.
bool gated_delta_rule_scan_is_pipelined(const Ctx& ctx, ops::GdnHeads heads);

}  // namespace dflash::cuda
