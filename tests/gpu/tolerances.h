// Every numeric tolerance of the GPU tests in one table: what is compared, the bound, and why it is that
// wide. A test names its entry instead of writing the number, so a change of precision (a kernel that keeps
// fp32 where it rounded to bf16, a looser kernel) is made, and reviewed, here.
//
// "rel" is the relative L2 error ||got - want|| / ||want|| (test::rel_err); "x want" a bound relative to the
// reference value (EXPECT_NEAR(got, want, tol * want)). The reference is the float32 CPU twin of the same
// computation unless the entry names the float64 golden case. Not here: the guards that keep a comparison
// from being vacuous (a run must have learned, D-PACE must have changed the gradient) and the plausibility
// bounds of NVML readings; they are not precision.
#pragma once

namespace dflash::test::tol {

// ---- one op against its float32 CPU twin ------------------------------------------------------------
// A bf16 op (rel): inputs and outputs in bf16, each rounding at most 2^-8 = 3.9e-3 relative, fp32
// accumulation in another order; 1e-2 leaves 2.5x headroom over one rounding. Also the whole-tensor check
// of the per-element tests below, and the bf16 outputs of two summation orders of the same sums
// (deterministic vs atomic block attention dK/dV: each rounds its own fp32 sum to bf16).
constexpr double kOp = 1e-2;
// Per-token e4m3 rows, dequantized (rel): the GPU quantizes the bf16-rounded output of its norm or SwiGLU,
// the CPU twin its float32 one, so the codes of the ~2% of elements within a bf16 rounding (2^-9) of an
// e4m3 rounding boundary sit one step (2^-3 relative) apart: ~1.2e-2 expected; 3e-2 leaves 2.5x, and a
// wrong scale (a power of two off) or a wrong row gives 1e-1 or more.
constexpr double kFp8Requantized = 3e-2;
// Outputs kept in fp32 from the same bf16 inputs (rel): RMSNorm's and QK-norm's rstd, the attention's
// log-sum-exp, norm-weight gradients summed over rows in fp32, per-row cross-entropy. Only the order of
// fp32 sums differs from the CPU, plus the bf16 rounding of the inputs they are computed from.
constexpr double kF32Output = 1e-3;
// Per-row KL of the chunked lm_head loss (rel): KL is a small difference of two log-softmaxes, so the bf16
// rounding of the logits does not cancel in it as it does in CE's larger value.
constexpr double kKlRows = 2e-2;
// Rows whose argmax (drafter or teacher) may differ from the CPU's: a near-tie of two logits within bf16
// rounding flips one; more than one means a wrong row.
constexpr int kArgmaxMismatches = 1;
// The target attention at head dim 256, max |error| per element: outputs are convex mixtures of N(0, 1)
// values, |out| < 5, and bf16 keeps 8 bits (bf16 probabilities in the P V product on top).
constexpr double kAttentionMaxAbs = 4e-2;
// The Qwen3.5 hybrid's small ops (test_gdn_ops_gpu.cpp), per element |got - want| <= rtol |want| + atol so
// one wrong row cannot hide in a norm. bf16 outputs: the GPU rounds its fp32 result to bf16 once (2^-8
// relative at most: 2.5x headroom); the absolute part covers results near zero.
constexpr double kBf16ElementRtol = 1e-2, kBf16ElementAtol = 1e-3;
// ... and the fp32 gates (g, beta): fp32 on both sides, a few ulp of exp/log1p.
constexpr double kF32ElementRtol = 1e-5, kF32ElementAtol = 1e-7;
// The chunked gated delta rule vs the CPU recurrence, output and final state: max |err| <= kMax x max|want|
// and mean |err| <= kMean x mean|want|. The GPU multiplies bf16 operands (q/k, the bf16 copy of the
// state, the inverse X, R, v_new, the masked Q K^T) with fp32 accumulation and writes bf16.
constexpr double kDeltaRuleMax = 2e-2, kDeltaRuleMean = 1e-2;

// DFlash2's lm_loss top-K against the CPU's (test_dflash2_ops_gpu.cpp): both sides take fp32 logits of the
// same bf16 inputs (sums in another order, a few ulp of tanh), so a value may differ by far less than this
// bound, |got - want| <= kTopKValue x max(1, |want|). Slots agree in value within it; an id in one list and
// not in the other must sit within it of the CPU's K-th value (a near-tie at the cut); nothing else may differ.
constexpr double kTopKValue = 1e-4;

// ---- fp32 arithmetic on both sides ------------------------------------------------------------------
// DFlash2's candidate selector (rel): u, P, S, unary in fp32 on both sides; the scores' sums of r products
// and the codebook gradients' atomics run in another order, expf/logf are a few ulp from std::exp/log.
// 1e-4 leaves headroom over the ~1e-6 seen for such sums (CE rows near 0 inflate relative errors).
constexpr double kSelectorF32 = 1e-4;
// The same fp32 sums in another order (rel): deterministic vs atomic weight-gradient sums (RMSNorm,
// QK-norm + RoPE), and AdamW's fp32 params, m and v after a step (op-by-op and fused, vs the CPU).
constexpr double kF32SumOrder = 1e-5;
// One fp32 multiply and add per element on both sides (gradient accumulation, ops::grad_accumulate /
// grad_fold): the GPU rounds the product before the add as the CPU does; the tolerance (rel) only allows a
// host compiler that contracts the CPU's into an FMA.
constexpr double kF32Axpy = 1e-6;
// The gradient's sum of squares (x want): accumulated in double on both sides; only the order differs.
constexpr double kGradSumsq = 1e-9;
// The global gradient norm used for clipping (x want): the square root of that sum, returned through fp32.
constexpr double kGradNorm = 1e-6;
// The fused AdamW's bf16 copy of the weights (rel): one rounding of the fp32 master to bf16 (<= 2^-8 = 3.9e-3).
constexpr double kBf16Copy = 4e-3;
// The mma.sync block-scaled FP8 GEMM against its CPU twin (rel L2, tests/gpu/test_fp8_block_gemm_mma_gpu.cpp):
// the same codes and scales, fp32 sums in another order (~1e-6), the output rounded once to bf16 (<= 2^-9
// relative per element, ~1.1e-3 RMS).
constexpr double kFp8BlockGemmMma = 4e-3;
// --optimizer-state bf16: the CUDA kernel's new p, m, v against the CPU op's from the same bf16 state (bf16
// ulps, per element). Both run sr::adamw_bf16_update (include/dflash/stochastic_round.h) with the same
// random bits and no FMA contraction, so they are normally equal; an fp32 difference of one ulp (the clip
// coefficient from a sum of squares in another order, a libm rounding) can flip one rounding decision,
// which moves that value by one bf16 ulp. More than one ulp is a wrong value.
constexpr int kBf16StateUlps = 1;
// The same GPU computation twice (rel or x want): a restored trainer's losses and gradient norms, the step
// again without the gradient hooks, the noise replayed from a saved rng state, D-PACE's unchanged
// StepStats::loss. Nothing but fp32 atomics' order may differ.
constexpr double kSameComputation = 1e-6;

// ---- whole models -------------------------------------------------------------------------------------
// The Qwen3 target forward, every layer's output and the final features/norm (rel), vs the CPU and the
// float64 golden case: six bf16-rounded layers, each rounding of the residual stream adds ~2^-9.
constexpr double kTargetForward = 2e-2;
// The same for an eight-layer hybrid (qwen38-tiny-a): the error grows ~3e-3 per layer (H200 2026-12-02: 0.0084
// after layer 0, 0.0297 after layer 7, 0.030 at the final norm); dflash-selftest's per-layer rule,
// 1e-2 + 2 x 2^-8 per layer passed (src/selftest/selftest.cpp forward_tolerance), gives 0.045 at the final norm.
constexpr double kTargetForwardEightLayers = 4e-2;
// Batched speculative decoding against one prompt at a time on CUDA (test_spec_decode_batch_gpu.cpp): a row's
// bf16 values may depend on how many rows a packed target forward and the lm_head GEMM hold (cuBLAS picks
// its kernel and split by the row count), so a greedy choice may flip at a near-tie and the two outputs part
// there. At a prompt's first differing token, the two candidates' logits for that prefix (the target run on
// it alone) must be within kBatchedNearTie x the row's largest |logit|: a few bf16 roundings (2^-8 each) of
// the final norm carried through lm_head, with headroom. A real fault (a row of another prompt, a wrong
// offset) picks a token far below the best.
constexpr double kBatchedNearTie = 3e-2;
// The drafter step's final-normed hidden states (rel): bf16 activations through its layers, as the target.
constexpr double kDrafterHidden = 2e-2;
// One drafter step's loss (x want), vs the float32 CPU path or the float64 golden case: bf16 activations
// and weights; also the trainer's loss on fixed anchors before training and one D-PACE step's loss.
constexpr double kStepLoss = 1e-2;
// One drafter step's gradients (rel): all parameters together, and each parameter tensor alone (a small
// tensor, e.g. a norm weight, sums many rows' bf16 errors without the averaging of the whole).
constexpr double kStepGrads = 3e-2;
constexpr double kStepGradsPerTensor = 6e-2;
// 50 AdamW steps of the drafter step on one batch, per-step loss: 5% x the CPU's loss plus 1% of the first
// loss. Near convergence the bf16 and fp32 trajectories wobble independently (seen on an H200: 0.079 vs
// 0.150 at step 29 of 50, from 9.0), hence the floor.
constexpr double kTrajectoryRel = 0.05, kTrajectoryFloor = 0.01;
// The DrafterTrainer over 20 steps vs the CPU trainer on the same anchors: per-step loss and the loss on
// fixed anchors after training (x want): the bf16 forward and the diverging weights both add up.
constexpr double kTrainerLoss = 3e-2;
// ... per-step accuracy (absolute): a share of few rows in the tiny golden case, so one argmax flip moves it
// by a lot.
constexpr double kTrainerAcc = 0.25;
// ... per-step pre-clip gradient norm (x want): the gradients of diverging weights.
constexpr double kTrainerGradNorm = 1e-1;

// ---- statistics and devices ---------------------------------------------------------------------------
// Feature noise over 2^18 draws: the mean within 5 standard errors of 0 (a false alarm ~6e-7), the standard
// deviation within 2% of sigma (its standard error is ~0.14%; bf16 rounding of the draws adds a little).
constexpr double kNoiseMeanStdErrs = 5.0, kNoiseStd = 0.02;
// NVML's memory total vs CUDA's for the same board (x want): each reports it less its own reservations.
constexpr double kNvmlMemTotal = 0.05;

}  // namespace dflash::test::tol
