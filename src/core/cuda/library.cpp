// The CUDA library's table (core/cuda_entry.h): every entry code outside the library calls. Constant
// initialized (addresses only), so it is there before any static constructor runs.
#include "core/cuda_entry.h"

namespace dflash::cuda {

namespace {
constexpr Library kLibrary = {
    // the backend
    &device_count, &context, &set_deterministic, &deterministic, &check_device_errors, &copy_bytes,
    &synchronize_stream, &pci_bus_id,
    // dflash/ops.h
    &matmul_forward, &matmul_residual_forward, &matmul_backward, &embedding_forward, &rmsnorm_forward,
    &rmsnorm_fp8_forward, &head_norm_rope_forward, &qkv_norm_rope_forward, &swiglu_forward, &swiglu_fused_forward,
    &swiglu_fp8_forward, &fp8_activation_qdq, &fp8_linear_forward, &fp8_gemm_forward, &fp8_block_gemm_available, &fp8_token_gemm_available,
    &fp8_weight_dequantize, &fp8_rows_quantize,
    &fp8_rows_dequantize,
    &attention_varlen_causal_forward,
    // dflash/drafter_ops.h
    &block_attention_forward, &block_attention_backward, &lm_loss_forward, &lm_loss_backward,
    &lm_loss_sparse_backward, &grouped_conv_forward, &grouped_conv_backward, &selector_candidates,
    &selector_forward, &selector_backward,
    // ops/gated_delta.h
    &gated_delta_rule_forward, &gated_rmsnorm_forward, &gdn_gates_forward, &causal_conv1d_silu_forward,
    &sigmoid_gate_forward,
    // dflash/optim.h
    &adamw_step, &adamw_step_bf16state, &grad_sumsq, &scale_inplace, &grad_accumulate, &grad_fold,
};
}  // namespace

const Library* const library = &kLibrary;

}  // namespace dflash::cuda
