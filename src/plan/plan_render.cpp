// The plan as the dry run prints it and as JSON: src/plan/layout_plan.h.
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "plan/layout_plan.h"

namespace dflash::plan {

namespace {

// 12.3 K, 181 K, 1.23 M: three significant digits where they matter.
std::string si(double v) {
  char b[32];
  if (!std::isfinite(v)) return "-";
  const double a = std::abs(v);
  if (a >= 1e6) std::snprintf(b, sizeof b, "%.2f M", v / 1e6);
  else if (a >= 1e5) std::snprintf(b, sizeof b, "%.0f K", v / 1e3);
  else if (a >= 1e3) std::snprintf(b, sizeof b, "%.1f K", v / 1e3);
  else std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

std::string rate(double v) {
  char b[32];
  if (!std::isfinite(v)) return "-";
  std::snprintf(b, sizeof b, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  return b;
}

std::string power(const LayoutPrediction& lp) {
  if (lp.power_w < 0) return "?";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f kW%s", lp.power_w / 1e3, lp.within_power_budget ? "" : "!");
  return b;
}

const LayoutPrediction* colocated_row(const Plan& p) {
  for (const LayoutPrediction& lp : p.layouts)
    if (lp.layout.kind == LayoutKind::Colocated) return &lp;
  return nullptr;
}

}  // namespace

std::string render_plan_table(const Plan& p) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line,
                "[dflash] plan: %d node(s) x %d GPU(s) %s (%s), link %s; target forward %.1f ms, drafter step %.1f ms, "
                "transport %.1f ms per batch (%.2f GB)\n",
                p.nodes, p.gpus_per_node, p.gpu_name.c_str(), p.gpu_source.c_str(), p.link.c_str(), p.target_forward_s * 1e3,
                p.drafter_step_s * 1e3, p.transport_s * 1e3, p.batch_bytes / 1e9);
  out += line;
  std::snprintf(line, sizeof line, "  %-10s %8s %8s %9s %10s %5s %-9s %4s %9s\n", "layout", "tgt b/s", "dft b/s", "tok/s",
                "anchors/s", "accum", "binds", "fits", "power");
  out += line;
  for (size_t i = 0; i < p.layouts.size(); ++i) {
    const LayoutPrediction& lp = p.layouts[i];
    const bool rec = static_cast<int>(i) == p.recommended, chosen = static_cast<int>(i) == p.chosen;
    const char mark0 = rec ? '*' : ' ', mark1 = chosen ? '>' : ' ';
    std::snprintf(line, sizeof line, "%c%c%-10s %8s %8s %9s %10s %5d %-9s %4s %9s\n", mark0, mark1, lp.layout.name().c_str(),
                  rate(lp.target_batches_per_s).c_str(), rate(lp.drafter_batches_per_s).c_str(), si(lp.tokens_per_s).c_str(),
                  si(lp.anchors_per_s).c_str(), lp.grad_accum, binding_role_name(lp.binds), memory_fit_name(lp.fit),
                  power(lp).c_str());
    out += line;
  }
  if (p.recommended >= 0) {
    const LayoutPrediction& r = p.layouts[static_cast<size_t>(p.recommended)];
    out += "[dflash] plan: recommended (*) " + r.layout.name() + ": " + si(r.tokens_per_s) + " tok/s";
    if (p.chosen >= 0 && p.chosen != p.recommended) {
      // A chosen layout faster than the recommendation is one the recommendation passed over: it does not fit
      // the memory or the power budget ("-20 % slower" said that badly).
      const LayoutPrediction& c = p.layouts[static_cast<size_t>(p.chosen)];
      char b[160];
      if (p.chosen_shortfall_pct >= 0.5)
        std::snprintf(b, sizeof b, "; chosen (>) %s is %.0f %% slower", c.layout.name().c_str(), p.chosen_shortfall_pct);
      else if (p.chosen_shortfall_pct > -0.5)
        std::snprintf(b, sizeof b, "; chosen (>) %s is as fast", c.layout.name().c_str());
      else
        std::snprintf(b, sizeof b, "; chosen (>) %s would be %.0f %% faster but %s", c.layout.name().c_str(),
                      -p.chosen_shortfall_pct,
                      c.fit == MemoryFit::DoesNotFit ? "does not fit the GPU's memory" : "is over --power-budget-w");
      out += b;
    } else if (p.chosen == p.recommended) {
      out += "; the chosen layout";
    }
    out += "\n";
  } else {
    out += "[dflash] plan: no layout fits the GPU's memory and the power budget\n";
  }
  char note[400];
  std::snprintf(note, sizeof note, "[dflash] plan: predictions from the %s calibration of %s (docs/cost_model.md)\n",
                p.gpu_source.c_str(), p.gpu_name.c_str());
  out += note;
  if (const LayoutPrediction* c = colocated_row(p)) {
    if (p.colocated_regime == ColocatedRegime::MemoryFull)
      std::snprintf(note, sizeof note, "[dflash] plan: colocated holds %.0f %% of the GPU's memory fixed: priced at %.2fx "
                    "its roles back to back, as measured where both roles filled an H100 (docs/cost_model.md)\n",
                    100 * p.colocated_fill, kColocatedMemoryFullRate);
    else
      std::snprintf(note, sizeof note, "[dflash] plan: colocated overlaps %.2f of the shorter role (the %s calibration's "
                    "colocated_overlap, docs/cost_model.md)%s\n", p.colocated_overlap, p.gpu_name.c_str(),
                    c->fit == MemoryFit::Unknown      ? "; its memory is not known"
                    : c->fit == MemoryFit::DoesNotFit ? "; it does not fit (both roles' fixed memory)"
                                                      : "");
    out += note;
  }
  return out;
}

nlohmann::json plan_to_json(const Plan& p) {
  nlohmann::json rows = nlohmann::json::array();
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const LayoutPrediction& lp : p.layouts)
    rows.push_back({{"layout", lp.layout.name()},
                    {"kind", lp.layout.kind == LayoutKind::Colocated ? "colocated" : "split"},
                    {"targets_per_node", lp.layout.targets},
                    {"drafters_per_node", lp.layout.drafters},
                    {"grad_accum", lp.grad_accum},
                    {"target_batches_per_s", num(lp.target_batches_per_s)},
                    {"drafter_batches_per_s", num(lp.drafter_batches_per_s)},
                    {"transport_batches_per_s", num(lp.transport_batches_per_s)},
                    {"batches_per_s", num(lp.batches_per_s)},
                    {"tokens_per_s", num(lp.tokens_per_s)},
                    {"anchors_per_s", num(lp.anchors_per_s)},
                    {"drafter_step_s", lp.drafter_step_s},
                    {"allreduce_s", lp.allreduce_s},
                    {"binds", binding_role_name(lp.binds)},
                    {"fits", lp.fit == MemoryFit::Fits ? "yes" : lp.fit == MemoryFit::DoesNotFit ? "no" : "unknown"},
                    {"largest_role_bytes", lp.largest_role_bytes},
                    {"power_w", lp.power_w >= 0 ? nlohmann::json(lp.power_w) : nlohmann::json(nullptr)},
                    {"within_power_budget", lp.within_power_budget}});
  auto name_at = [&](int i) {
    return i >= 0 ? nlohmann::json(p.layouts[static_cast<size_t>(i)].layout.name()) : nlohmann::json(nullptr);
  };
  return {{"gpu", p.gpu_name},
          {"gpu_calibration", p.gpu_source},
          {"link", p.link},
          {"nodes", p.nodes},
          {"gpus_per_node", p.gpus_per_node},
          {"target_forward_s", p.target_forward_s},
          {"drafter_step_s", p.drafter_step_s},
          {"transport_s", p.transport_s},
          {"batch_bytes", p.batch_bytes},
          {"colocated_overlap", p.colocated_overlap},
          {"colocated_regime", p.colocated_regime == ColocatedRegime::MemoryFull ? "memory full" : "overlapped"},
          {"colocated_fill", p.colocated_fill},
          {"recommended", name_at(p.recommended)},
          {"chosen", name_at(p.chosen)},
          {"chosen_shortfall_pct", p.chosen >= 0 && p.recommended >= 0 ? nlohmann::json(p.chosen_shortfall_pct) : nlohmann::json(nullptr)},
          {"layouts", rows}};
}

}  // namespace dflash::plan
