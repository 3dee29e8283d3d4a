// The CUDA entry points (core/cuda_entry.h) in a build without the CUDA library: this file is linked in its
// place (CMakeLists.txt). Queries answer "no CUDA"; everything else is fatal_no_cuda (BadOptions, exit 2,
// "<what>: this build has no CUDA backend" with the fix). Unreachable through make_ctx, which already
// refuses a CUDA context; a hand-made one (tests) reaches these.
#include "base/device_runtime.h"
#include "core/cuda_entry.h"
#include "dflash/data_plane.h"
#include "dflash/grad_buckets.h"
#include "drafter/trainer_engine.h"

namespace dflash {
std::shared_ptr<NcclPairs> make_nccl_pairs(const Topology&, const Ctx&, double, std::string* error) {
  *error = "this build has no NCCL";
  return nullptr;
}
std::unique_ptr<DataPlane> make_nccl_data_plane(const DataPlaneSpec&) { fatal_no_cuda("the nccl data plane"); }
std::unique_ptr<GradientReducer> make_nccl_reducer(MPI_Comm, const Ctx&, std::vector<GradRange>, double) {
  fatal_no_cuda("the NCCL gradient reducer");
}
}  // namespace dflash

namespace dflash::train {
std::unique_ptr<TrainerEngine> make_cuda_trainer_engine(EngineSetup) {
  fatal_no_cuda("the drafter was asked to train on CUDA");
}
}  // namespace dflash::train

namespace dflash::cuda {

namespace {
bool g_deterministic = false;  // recorded for deterministic_kernels(); the CPU backend is deterministic anyway
}  // namespace

bool in_build() { return false; }
int device_count() { return 0; }
Ctx context(int) { fatal_no_cuda("a CUDA context was requested"); }
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }
void check_device_errors(const Ctx&) { fatal_no_cuda("check_device_errors"); }
void copy_bytes(const Ctx&, void*, const void*, size_t) { fatal_no_cuda("copy_bytes"); }
void synchronize_stream(const Ctx&) { fatal_no_cuda("synchronize"); }
std::string pci_bus_id(int) { return ""; }

// ---- the ops' twins ----------------------------------------------------------------------------------
void matmul_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, ops::Accumulate) {
  fatal_no_cuda("matmul_forward");
}
void matmul_residual_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("matmul_residual_forward");
}
void matmul_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("matmul_backward");
}
void swiglu_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&) { fatal_no_cuda("swiglu_forward"); }
void swiglu_fused_forward(const Ctx&, const Tensor&, const Tensor&) { fatal_no_cuda("swiglu_fused_forward"); }
void rmsnorm_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fatal_no_cuda("rmsnorm_forward");
}
void embedding_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&) { fatal_no_cuda("embedding_forward"); }
void head_norm_rope_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            ops::RopeSpec, float) {
  fatal_no_cuda("head_norm_rope_forward");
}
void qkv_norm_rope_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, const Tensor&, ops::RopeSpec, float) {
  fatal_no_cuda("qkv_norm_rope_forward");
}
AttentionKernel attention_varlen_causal_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&,
                                                const Tensor&, const Tensor&, float, AttentionKernel, int64_t) {
  fatal_no_cuda("attention_varlen_causal_forward");
}
void block_attention_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ops::BlockAttnSpec&) {
  fatal_no_cuda("block_attention_forward");
}
void block_attention_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ops::BlockAttnSpec&) {
  fatal_no_cuda("block_attention_backward");
}
void lm_loss_forward(const Ctx&, const ops::LmLossRowsOut&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                     const Tensor&, int64_t, const Tensor&, const Tensor&, ops::LossObjective, const ops::LogitSpec&) {
  fatal_no_cuda("lm_loss_forward");
}
void lm_loss_backward(const Ctx&, const Tensor&, const Tensor&, ops::LossObjective, const Tensor&, const Tensor&,
                      const Tensor&, const Tensor&, const Tensor&, int64_t, const ops::LogitSpec&, const Tensor&,
                      const Tensor&) {
  fatal_no_cuda("lm_loss_backward");
}
void lm_loss_sparse_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const ops::LogitSpec&, const Tensor&) {
  fatal_no_cuda("lm_loss_sparse_backward");
}
void grouped_conv_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, int, const Tensor&,
                          const ops::GroupedConvSpec&) {
  fatal_no_cuda("grouped_conv_forward");
}
void grouped_conv_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                           const Tensor&, int, const Tensor&, const ops::GroupedConvSpec&) {
  fatal_no_cuda("grouped_conv_backward");
}
void selector_candidates(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("selector_candidates");
}
void selector_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("selector_forward");
}
void selector_backward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) {
  fatal_no_cuda("selector_backward");
}
void gated_delta_rule_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, ops::GdnHeads, const Tensor&) {
  fatal_no_cuda("gated_delta_rule_forward");
}
void gated_rmsnorm_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  fatal_no_cuda("gated_rmsnorm_forward");
}
void gdn_gates_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&) {
  fatal_no_cuda("gdn_gates_forward");
}
void causal_conv1d_silu_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("causal_conv1d_silu_forward");
}
void sigmoid_gate_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&) {
  fatal_no_cuda("sigmoid_gate_forward");
}
void adamw_step(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const ops::AdamWHyper&,
                int64_t) {
  fatal_no_cuda("adamw_step");
}
void adamw_step_bf16state(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const ops::AdamWHyper&, int64_t, uint64_t) {
  fatal_no_cuda("adamw_step_bf16state");
}
double grad_sumsq(const Ctx&, const Tensor&) { fatal_no_cuda("grad_sumsq"); }
void scale_inplace(const Ctx&, const Tensor&, float) { fatal_no_cuda("scale_inplace"); }
void grad_accumulate(const Ctx&, const Tensor&, const Tensor&, float, ops::AccumInto) {
  fatal_no_cuda("grad_accumulate");
}
void grad_fold(const Ctx&, const Tensor&, const Tensor&, float) { fatal_no_cuda("grad_fold"); }

}  // namespace dflash::cuda
