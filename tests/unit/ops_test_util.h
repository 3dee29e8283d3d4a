// Helpers for the op tests: random data, double-precision reference ops, error measures.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dflash/tensor.h"

namespace dflash::test {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// ||a - b|| / ||b||
template <class A, class B>
double rel_err(const A& a, const B& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

// ---- double-precision reference ops (the definitions, written the naive way) ------------------------
namespace ref {

inline std::vector<double> matmul(const std::vector<double>& in, const std::vector<double>& W, int64_t N, int64_t I,
                                  int64_t O) {
  std::vector<double> out(N * O, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t i = 0; i < I; ++i) out[n * O + o] += in[n * I + i] * W[o * I + i];
  return out;
}

inline std::vector<double> rmsnorm(const std::vector<double>& in, const std::vector<double>& w, int64_t N, int64_t C,
                                   double eps) {
  std::vector<double> out(N * C);
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += in[n * C + c] * in[n * C + c];
    const double r = 1.0 / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) out[n * C + c] = in[n * C + c] * r * w[c];
  }
  return out;
}

// RMSNorm over each head (shared weight), then neox RoPE on the first `rot` dims.
inline std::vector<double> head_norm_rope(const std::vector<double>& in, const std::vector<double>& w,
                                          const std::vector<int32_t>& pos, int64_t N, int64_t nh, int64_t hd,
                                          int rot, double theta, double eps) {
  std::vector<double> y = rmsnorm(in, w, N * nh, hd, eps);
  std::vector<double> out = y;
  const int half = rot / 2;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t h = 0; h < nh; ++h) {
      const double* yy = &y[(n * nh + h) * hd];
      double* o = &out[(n * nh + h) * hd];
      for (int i = 0; i < half; ++i) {
        const double a = pos[n] * std::pow(theta, -2.0 * i / rot);
        o[i] = yy[i] * std::cos(a) - yy[i + half] * std::sin(a);
        o[i + half] = yy[i + half] * std::cos(a) + yy[i] * std::sin(a);
      }
    }
  return out;
}

inline std::vector<double> swiglu(const std::vector<double>& gate, const std::vector<double>& up) {
  std::vector<double> out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) out[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  return out;
}

// Causal attention inside each sequence of cu, GQA (head h reads kv head h / (nh / nkv)).
inline std::vector<double> attention(const std::vector<double>& q, const std::vector<double>& k,
                                     const std::vector<double>& v, const std::vector<int32_t>& cu, int64_t nh,
                                     int64_t nkv, int64_t hd, double scale) {
  const int64_t T = cu.back();
  std::vector<double> out(T * nh * hd, 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int64_t t = cu[s]; t < cu[s + 1]; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t g = h / (nh / nkv);
        std::vector<double> sc;
        double mx = -1e300;
        for (int64_t j = cu[s]; j <= t; ++j) {
          double d = 0.0;
          for (int64_t c = 0; c < hd; ++c) d += q[(t * nh + h) * hd + c] * k[(j * nkv + g) * hd + c];
          sc.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        double sum = 0.0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t j = cu[s]; j <= t; ++j)
          for (int64_t c = 0; c < hd; ++c)
            out[(t * nh + h) * hd + c] += sc[j - cu[s]] / sum * v[(j * nkv + g) * hd + c];
      }
  return out;
}

}  // namespace ref
}  // namespace dflash::test
