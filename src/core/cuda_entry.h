// The one way from code outside the CUDA library into it: the CUDA library's table. The op layer (after its
// checks), the backend context (core/backend.cpp) and the other floors' queries reach every CUDA function
// through `cuda::library_for(what).<entry>(...)`; a CUDA build defines `cuda::library` in the CUDA library
// (src/core/cuda/library.cpp), a CPU-only build as null (src/core/no_cuda.cpp), where library_for is the one
// fatal BadOptions error "<what>: this build has no CUDA backend" (exit 2) with the fix, and in_build() says
// "no CUDA". The cost over a direct call: one load of the table pointer, one test, one indirect call.
//
// Each twin's signature is written at most twice. An op's twin with the op's own signature is declared in
// its op's CUDA header as `decltype(ops::<op>) <op>;` (kernels/<op>.cuh) and its entry here is typed the
// same way, so only the op's header and the .cu definition spell it; a twin or backend call with a
// signature of its own (attention_varlen_causal_forward, kernels/backend_entry.cuh) is declared once in its
// header and typed here by decltype of that declaration. The other floors' CUDA factories are declared where
// each floor lives, as slots of the same kind (a const function pointer the CUDA library defines, null in a
// CPU-only build: dflash/data_plane.h, dflash/grad_reducer.h, drafter/trainer_engine.h).
//
// Plain C++, no CUDA header, so the op layer compiles the same in both builds. Call the CUDA library only
// through the table: a direct cuda::<op>(...) call links in a CUDA build but not in a CPU-only one.
#pragma once
#include "adamw.cuh"
#include "attention.cuh"
#include "backend_entry.cuh"
#include "base/device_runtime.h"  // fatal_no_cuda
#include "block_attention.cuh"
#include "causal_conv1d.cuh"
#include "dflash/tensor.h"
#include "embedding.cuh"
#include "fp8_linear.cuh"
#include "fp8_rows.cuh"
#include "fp8_weight.cuh"
#include "gated_delta_rule.cuh"
#include "gated_rmsnorm.cuh"
#include "gdn_gates.cuh"
#include "grad_accum.cuh"
#include "grouped_conv.cuh"
#include "head_norm_rope.cuh"
#include "lm_loss.cuh"
#include "matmul.cuh"
#include "qkv_norm_rope.cuh"
#include "rmsnorm.cuh"
#include "selector.cuh"
#include "sigmoid_gate.cuh"
#include "swiglu.cuh"

namespace dflash::cuda {

struct Library {
  // ---- the backend (kernels/backend_entry.cuh) ----
  decltype(&cuda::device_count) device_count;
  decltype(&cuda::context) context;
  decltype(&cuda::set_deterministic) set_deterministic;
  decltype(&cuda::deterministic) deterministic;
  decltype(&cuda::check_device_errors) check_device_errors;
  decltype(&cuda::copy_bytes) copy_bytes;
  decltype(&cuda::synchronize_stream) synchronize_stream;
  decltype(&cuda::pci_bus_id) pci_bus_id;
  // ---- the ops' twins: dflash/ops.h ----
  decltype(&ops::matmul_forward) matmul_forward;
  decltype(&ops::matmul_residual_forward) matmul_residual_forward;
  decltype(&ops::matmul_backward) matmul_backward;
  decltype(&ops::embedding_forward) embedding_forward;
  decltype(&ops::rmsnorm_forward) rmsnorm_forward;
  decltype(&ops::rmsnorm_fp8_forward) rmsnorm_fp8_forward;
  decltype(&ops::head_norm_rope_forward) head_norm_rope_forward;
  decltype(&ops::qkv_norm_rope_forward) qkv_norm_rope_forward;
  decltype(&ops::swiglu_forward) swiglu_forward;
  decltype(&ops::swiglu_fused_forward) swiglu_fused_forward;
  decltype(&ops::swiglu_fp8_forward) swiglu_fp8_forward;
  decltype(&ops::fp8_activation_qdq) fp8_activation_qdq;
  decltype(&ops::fp8_linear_forward) fp8_linear_forward;
  decltype(&ops::fp8_gemm_forward) fp8_gemm_forward;
  decltype(&ops::fp8_block_gemm_available) fp8_block_gemm_available;
  decltype(&ops::fp8_token_gemm_available) fp8_token_gemm_available;
  decltype(&ops::fp8_weight_dequantize) fp8_weight_dequantize;
  decltype(&ops::fp8_rows_quantize) fp8_rows_quantize;
  decltype(&ops::fp8_rows_dequantize) fp8_rows_dequantize;
  decltype(&cuda::attention_varlen_causal_forward) attention_varlen_causal_forward;  // + kernel choice
  // ---- dflash/drafter_ops.h ----
  decltype(&ops::block_attention_forward) block_attention_forward;
  decltype(&ops::block_attention_backward) block_attention_backward;
  decltype(&ops::lm_loss_forward) lm_loss_forward;
  decltype(&ops::lm_loss_backward) lm_loss_backward;
  decltype(&ops::lm_loss_sparse_backward) lm_loss_sparse_backward;
  decltype(&ops::grouped_conv_forward) grouped_conv_forward;
  decltype(&ops::grouped_conv_backward) grouped_conv_backward;
  decltype(&ops::selector_candidates) selector_candidates;
  decltype(&ops::selector_forward) selector_forward;
  decltype(&ops::selector_backward) selector_backward;
  // ---- ops/gated_delta.h ----
  decltype(&ops::gated_delta_rule_forward) gated_delta_rule_forward;
  decltype(&ops::gated_rmsnorm_forward) gated_rmsnorm_forward;
  decltype(&ops::gdn_gates_forward) gdn_gates_forward;
  decltype(&ops::causal_conv1d_silu_forward) causal_conv1d_silu_forward;
  decltype(&ops::sigmoid_gate_forward) sigmoid_gate_forward;
  // ---- dflash/optim.h ----
  decltype(&ops::adamw_step) adamw_step;
  decltype(&ops::adamw_step_bf16state) adamw_step_bf16state;
  decltype(&ops::grad_sumsq) grad_sumsq;
  decltype(&ops::scale_inplace) scale_inplace;
  decltype(&ops::grad_accumulate) grad_accumulate;
  decltype(&ops::grad_fold) grad_fold;
};

// The CUDA library's table; null in a build without it.
extern const Library* const library;

// Whether this build has the CUDA backend.
inline bool in_build() { return library != nullptr; }

// The table; without one, fatal_no_cuda(what) (BadOptions, exit 2, "<what>: this build has no CUDA backend").
inline const Library& library_for(const char* what) {
  if (!library) fatal_no_cuda(what);
  return *library;
}

}  // namespace dflash::cuda
