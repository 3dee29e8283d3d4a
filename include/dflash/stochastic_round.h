// Stochastic rounding to bf16 and the AdamW update of the bf16 optimizer state (--optimizer-state bf16,
// docs/pipeline.md "Optimizer state"), shared by the CPU op (src/ops/optim.cpp) and its CUDA twin
// (kernels/adamw.cu): the same source compiles for the host and the device, so both draw the same random
// bits and do the same fp32 arithmetic.
//
// Why stochastic: an update smaller than half a bf16 ulp of the weight (lr 6e-4 against a weight of 0.02
// with 8 bits of mantissa) is lost every step under round-to-nearest, so a bf16 weight stops moving.
// Rounding up with probability (the dropped fraction of an ulp) keeps the expected value of every rounding
// equal to the fp32 value, so small updates still add up on average.
//
// The bits are a counter-based hash of (seed, optimizer step, element index, which of p/m/v): no generator
// state to checkpoint, the same bits on every device and in any thread order, and a resumed run draws what
// the straight run drew at that step.
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DF_SR_FN __host__ __device__ __forceinline__
#else
#define DF_SR_FN inline
#endif

namespace dflash::sr {

// Which state tensor a rounding is for: each gets its own 16 of the element's 64 hash bits.
enum class Slot : uint32_t { Param = 0, M = 1, V = 2 };

// splitmix64's finaliser: a bijective 64-bit hash.
DF_SR_FN uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The hash of one optimizer step (seed, 1-based step) and of one element of it: the element's bits are
// splitmix64's output at position `index` of the stream the step's key starts (one mix64 per element: the
// update kernel is bound by it, 7.6 -> 5.x ms per 8B drafter step with two).
DF_SR_FN uint64_t step_key(uint64_t seed, uint64_t step) { return mix64(seed ^ mix64(step)); }
DF_SR_FN uint64_t element_bits(uint64_t key, uint64_t index) { return mix64(key + index * 0xd1b54a32d192ed03ull); }
// The 16 random bits of one slot out of an element's hash.
DF_SR_FN uint32_t slot_bits(uint64_t bits, Slot s) {
  return static_cast<uint32_t>(bits >> (16u * static_cast<uint32_t>(s))) & 0xffffu;
}
// All in one: the 16 bits for (seed, step, index, slot).
DF_SR_FN uint32_t random16(uint64_t seed, uint64_t step, uint64_t index, Slot s) {
  return slot_bits(element_bits(step_key(seed, step), index), s);
}

DF_SR_FN uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
DF_SR_FN float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
DF_SR_FN float bf16_bits_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// The bf16 bits of x rounded stochastically with 16 random bits r: r added to the low 16 bits of x's
// pattern, then truncated, so x rounds away from zero with probability (low 16 bits) / 2^16 -- exactly
// the dropped fraction of an ulp: unbiased. Non-finite x rounds to nearest (inf stays inf, NaN a quiet
// NaN); a finite x within an ulp of the largest bf16 may round to inf, as round-to-nearest can.
DF_SR_FN uint16_t round_bf16(float x, uint32_t r) {
  const uint32_t u = f32_bits(x);
  if ((u & 0x7f800000u) == 0x7f800000u)
    return static_cast<uint16_t>((u & 0x007fffffu) ? ((u >> 16) | 0x40u) : (u >> 16));
  return static_cast<uint16_t>((u + (r & 0xffffu)) >> 16);
}

// fp32 arithmetic that the device must not contract into FMAs (nvcc does by default; the host build has
// none): the CPU and the GPU then compute bit-identical fp32 values, and only a differently rounded libm
// could make them differ.
DF_SR_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
DF_SR_FN float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
DF_SR_FN float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
DF_SR_FN float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}

// The step's scalars (torch.optim.AdamW's, as ops::adamw_step computes them).
struct AdamScalars {
  float b1, b2, eps, decay, step_size, inv_bc2_sqrt;
};

// One element's AdamW update from its bf16 state, in fp32: g (already clipped) and the state as fp32
// values in, the new state out as bf16 bits, each stochastically rounded with its slot's bits. The weight
// update uses the new m and v before they are rounded (the fp32 values a fused step has at hand).
struct Bf16State {
  uint16_t p, m, v;
};
DF_SR_FN Bf16State adamw_bf16_update(float p, float m, float v, float g, const AdamScalars& a, uint64_t bits) {
  m = add(mul(a.b1, m), mul(add(1.f, -a.b1), g));
  v = add(mul(a.b2, v), mul(mul(add(1.f, -a.b2), g), g));
  const float denom = add(mul(sqrt_rn(v), a.inv_bc2_sqrt), a.eps);
  p = add(mul(p, a.decay), -div(mul(a.step_size, m), denom));
  return Bf16State{round_bf16(p, slot_bits(bits, Slot::Param)), round_bf16(m, slot_bits(bits, Slot::M)),
                   round_bf16(v, slot_bits(bits, Slot::V))};
}

}  // namespace dflash::sr

#undef DF_SR_FN
