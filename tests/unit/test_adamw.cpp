// AdamW (torch.optim.AdamW semantics), global-norm clipping and the lr schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dflash/optim.h"

namespace {

using dflash::cpu_ctx;
using dflash::cpu_view;

TEST(AdamW, ThreeStepsMatchTorchFormulaInDouble) {
  const int n = 5;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.0f, 3.0f}, m(n, 0.f), v(n, 0.f);
  std::vector<double> pd(p.begin(), p.end()), md(n, 0), vd(n, 0);
  dflash::ops::AdamWHyper hp;
  hp.lr = 1e-2f;
  hp.beta1 = 0.9f;
  hp.beta2 = 0.95f;
  hp.eps = 1e-8f;
  hp.weight_decay = 0.1f;
  for (int t = 1; t <= 3; ++t) {
    std::vector<float> g = {0.1f * t, -0.2f, 0.3f / t, 1e-3f, -0.5f};
    dflash::ops::adamw_step(cpu_ctx(), cpu_view(p.data(), {n}), cpu_view(g.data(), {n}), cpu_view(m.data(), {n}),
                            cpu_view(v.data(), {n}), hp, t);
    // torch: p *= 1 - lr wd; m = lerp; v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
    const double lr = hp.lr, b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps, wd = hp.weight_decay;
    for (int i = 0; i < n; ++i) {
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * g[i] * g[i];
      const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
      pd[i] -= lr / bc1 * md[i] / (std::sqrt(vd[i]) / std::sqrt(bc2) + eps);
    }
    for (int i = 0; i < n; ++i) EXPECT_NEAR(p[i], pd[i], 1e-6 * (1 + std::fabs(pd[i]))) << "step " << t << " i " << i;
  }
}

TEST(AdamW, ClipScalesToTheLimitOnlyWhenAbove) {
  std::vector<float> g = {3.f, 4.f};  // norm 5
  const double norm = dflash::ops::clip_grad_global_norm(cpu_ctx(), cpu_view(g.data(), {2}), 1.0f);
  EXPECT_DOUBLE_EQ(norm, 5.0);
  EXPECT_NEAR(std::hypot(g[0], g[1]), 1.0, 1e-6);  // 1/(5+1e-6) * 5
  EXPECT_NEAR(g[0] / g[1], 0.75, 1e-7);
  std::vector<float> small = {0.3f, 0.4f};
  EXPECT_NEAR(dflash::ops::clip_grad_global_norm(cpu_ctx(), cpu_view(small.data(), {2}), 1.0f), 0.5, 1e-7);
  EXPECT_EQ(small[0], 0.3f);
  EXPECT_EQ(small[1], 0.4f);
  std::vector<float> off = {30.f, 40.f};  // clip <= 0 disables
  dflash::ops::clip_grad_global_norm(cpu_ctx(), cpu_view(off.data(), {2}), 0.0f);
  EXPECT_EQ(off[0], 30.f);
}

TEST(AdamW, WarmupThenCosineSchedule) {
  using dflash::lr_schedule;
  EXPECT_DOUBLE_EQ(lr_schedule(0, 1.0, 4, 0, 0.1), 0.25);
  EXPECT_DOUBLE_EQ(lr_schedule(3, 1.0, 4, 0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(lr_schedule(100, 1.0, 4, 0, 0.1), 1.0);  // no total: constant after warmup
  EXPECT_DOUBLE_EQ(lr_schedule(4, 1.0, 4, 14, 0.1), 1.0);   // cosine starts at lr
  EXPECT_NEAR(lr_schedule(9, 1.0, 4, 14, 0.1), 0.55, 1e-12);  // halfway: min + (1-min)/2
  EXPECT_NEAR(lr_schedule(14, 1.0, 4, 14, 0.1), 0.1, 1e-12);
  EXPECT_NEAR(lr_schedule(50, 1.0, 4, 14, 0.1), 0.1, 1e-12);  // stays at the floor
  EXPECT_DOUBLE_EQ(lr_schedule(0, 2e-4, 0, 0, 0.1), 2e-4);
  // The default floor 0 (SpecForge's CosineAnnealingLR, eta_min 0): the last step of 14 is just above 0.
  EXPECT_NEAR(lr_schedule(9, 1.0, 4, 14, 0.0), 0.5, 1e-12);
  EXPECT_NEAR(lr_schedule(13, 1.0, 4, 14, 0.0), 0.5 * (1.0 + std::cos(M_PI * 0.9)), 1e-12);
  EXPECT_NEAR(lr_schedule(14, 1.0, 4, 14, 0.0), 0.0, 1e-12);
}

}  // namespace

// DFlash2's selector weight over the run (issue 47), SpecForge's rule: W = int(total * warmup_ratio) steps of
// 0, then Rp = int(total * ramp_ratio) steps rising by alpha / Rp from alpha / Rp (the step after the last
// zero already has alpha / Rp), then alpha. SpecForge's own test case: alpha 0.75, warmup 0, ramp 0.5,
// total 100: 0.015 at the first step.
TEST(SelectorSchedule, WarmupRampConstantAsSpecForge) {
  using dflash::selector_alpha_schedule;
  EXPECT_NEAR(selector_alpha_schedule(0, 0.75, 0.0, 0.5, 100), 0.015, 1e-15);
  EXPECT_NEAR(selector_alpha_schedule(49, 0.75, 0.0, 0.5, 100), 0.75, 1e-15);
  // total 1000, warmup 0.01 (10 steps), ramp 0.02 (20 steps), alpha 2
  for (int64_t s = 0; s < 10; ++s) EXPECT_EQ(selector_alpha_schedule(s, 2.0, 0.01, 0.02, 1000), 0.0) << s;
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(10, 2.0, 0.01, 0.02, 1000), 0.1);
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(19, 2.0, 0.01, 0.02, 1000), 1.0);
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(29, 2.0, 0.01, 0.02, 1000), 2.0);
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(500, 2.0, 0.01, 0.02, 1000), 2.0);
  // int() of the products: the Qwen3.8 recipe's 0.0005 over 1999 steps is 0 warmup and 0 ramp steps
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(0, 1.0, 0.0005, 0.0005, 1999), 1.0);
  // 4000 steps: 2 steps of 0, a ramp of 2 (0.5, 1.0)
  EXPECT_EQ(selector_alpha_schedule(1, 1.0, 0.0005, 0.0005, 4000), 0.0);
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(2, 1.0, 0.0005, 0.0005, 4000), 0.5);
  EXPECT_DOUBLE_EQ(selector_alpha_schedule(3, 1.0, 0.0005, 0.0005, 4000), 1.0);
  // the product in double as Python computes it (10 x 0.7 = 7.0): 7 steps of warmup; a float ratio would give 6
  EXPECT_EQ(selector_alpha_schedule(6, 1.0, 0.7, 0.0, 10), 0.0);
  EXPECT_EQ(selector_alpha_schedule(7, 1.0, 0.7, 0.0, 10), 1.0);
  // no horizon, or no selector term: alpha as given
  EXPECT_EQ(selector_alpha_schedule(0, 0.5, 0.5, 0.5, 0), 0.5);
  EXPECT_EQ(selector_alpha_schedule(0, 0.0, 0.5, 0.5, 100), 0.0);
}
