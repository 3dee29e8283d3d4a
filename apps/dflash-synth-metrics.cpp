// dflash-synth-metrics: synthetic metrics.h5 files for dflash-report's tests, written THROUGH the project's
// MetricsWriter (so the report is tested against the writer's real layout), and the C++ what-if model on
// the command line (so tests can compare it with the report's Python model).
//
//   dflash-synth-metrics SCENARIO.json OUT.h5     write a run described by a scenario (tests/report/*.json)
//   dflash-synth-metrics --predict FILE.json       FILE holds {"measurements": {...}} (dflash-report --json
//                                                 output works) [+ "power_budget_w"]; prints the what-if JSON
//
// Scenario keys (docs/report.md "Synthetic scenarios"): topology, gpus_per_node, nodes, backend, seed,
// interval_s, intervals, startup_s, tokens_per_batch, hs_queue_depth, prefetch_depth, epochs, max_steps,
// target {observed_bps, busy_frac, data_wait_frac, jitter, power_w}, drafter {observed_bps, busy_frac,
// optimizer_frac, allreduce_s_per_batch, jitter, power_w}, idle_power_w, idle_power_attribute, power,
// power_samples_per_interval, q_hs {full_frac, empty_frac}, q_pre {empty_frac}, queue_samples_per_interval,
// attributes {name: number|string}.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "dflash/auto_topology.h"
#include "dflash/error.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"
#include "dflash/metrics.h"
#include "io/json_file.h"

using dflash::ExitCode;
using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  return dflash::read_json_file(path, "give a JSON object: a scenario (tests/report/*.json) or measurements");
}

double num(const json& j, const char* key, double def) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : def; }
std::optional<double> opt_num(const json& j, const char* key) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return std::nullopt;
}

// A low-discrepancy position in [0, 1) for sample s (golden-ratio sequence): shares of samples below a
// threshold match the scenario's fractions closely even over a few dozen samples.
double spread(int64_t s) { return std::fmod(static_cast<double>(s) * 0.6180339887498949, 1.0); }

struct RoleSpec {
  double rate_per_rank = 0;  // observed batches/s of one rank
  double busy_per_batch = 0; // busy seconds per batch
  double jitter = 0;
};

int write_scenario(const std::string& spec_path, const std::string& out_path) {
  const json sc = read_json(spec_path);
  const std::string topo = sc.value("topology", std::string("7-1"));
  const int T = std::stoi(topo.substr(0, topo.find('-'))), D = std::stoi(topo.substr(topo.find('-') + 1));
  const int G = sc.value("gpus_per_node", T + D), N = sc.value("nodes", 1);
  DF_CHECK(T >= 1 && D >= 1 && T + D <= G && N >= 1, BadInput, spec_path << ": topology " << topo << " on " << G << " GPUs");
  const int world = G * N;
  const double L = num(sc, "interval_s", 60), startup = num(sc, "startup_s", 30);
  const int K = sc.value("intervals", 20);
  const double tokens_per_batch = num(sc, "tokens_per_batch", 32768);
  const int hs_depth = sc.value("hs_queue_depth", 4), pre_depth = sc.value("prefetch_depth", 4);
  const json tj = sc.value("target", json::object()), dj = sc.value("drafter", json::object());
  RoleSpec ts, ds;
  ts.rate_per_rank = num(tj, "observed_bps", 1.0) / (T * N);
  ts.busy_per_batch = num(tj, "busy_frac", 1.0) / ts.rate_per_rank;
  ts.jitter = num(tj, "jitter", 0.02);
  ds.rate_per_rank = num(dj, "observed_bps", 1.0) / (D * N);
  ds.busy_per_batch = num(dj, "busy_frac", 1.0) / ds.rate_per_rank;
  ds.jitter = num(dj, "jitter", 0.02);
  const double opt_frac = num(dj, "optimizer_frac", 0.1), allreduce_per_batch = num(dj, "allreduce_s_per_batch", 0);
  const double data_wait_frac = num(tj, "data_wait_frac", 0);
  const bool power = sc.value("power", false);
  const double p_t = num(tj, "power_w", 0), p_d = num(dj, "power_w", 0), p_idle = num(sc, "idle_power_w", 0);

  std::vector<dflash::MetricsRole> roles(world);
  for (int r = 0; r < world; ++r) {
    const int local = r % G;
    roles[r] = local < T ? dflash::MetricsRole::Target : local < T + D ? dflash::MetricsRole::Drafter : dflash::MetricsRole::Idle;
  }
  dflash::MetricsLayout layout;
  layout.num_targets = T * N;
  layout.num_drafters = D * N;
  layout.num_gpus = power ? world : 0;
  layout.gpu_available = power;
  layout.gpu_unavailable_reason = "CPU backend: no NVML";
  layout.flush_every = 50;
  dflash::MetricsWriter w(out_path, layout, dflash::MetricsOpen::Create);

  json ranks = json::array();
  for (int r = 0; r < world; ++r)
    ranks.push_back({{"rank", r}, {"role", dflash::metrics_role_name(roles[r])}, {"host", "node" + std::to_string(r / G)},
                     {"gpu", power ? r % G : -1}, {"pid", 1000 + r}});
  json options = {{"topology", topo},
                  {"hs-queue-depth", std::to_string(hs_depth)},
                  {"prefetch-depth", std::to_string(pre_depth)},
                  {"token-budget", std::to_string(static_cast<int64_t>(tokens_per_batch))},
                  {"epochs", std::to_string(sc.value("epochs", 1))},
                  {"max-steps", std::to_string(sc.value("max_steps", 0))}};
  w.set_attribute("options", options.dump());
  w.set_attribute("topology", topo);
  w.set_attribute("num_nodes", static_cast<int64_t>(N));
  w.set_attribute("ranks", ranks.dump());
  w.set_attribute("backend", sc.value("backend", std::string(power ? "cuda" : "cpu")));
  w.set_attribute("version", std::string("synthetic (dflash-synth-metrics ") + spec_path + ")");
  if (power && sc.value("idle_power_attribute", false)) w.set_attribute("gpu_idle_power_w", p_idle);
  const json extra = sc.value("attributes", json::object());
  for (const auto& [k, v] : extra.items()) {
    if (v.is_string()) w.set_attribute(k, v.get<std::string>());
    else if (v.is_number_integer()) w.set_attribute(k, v.get<int64_t>());
    else w.set_attribute(k, v.get<double>());
  }

  std::mt19937_64 rng(sc.value("seed", 1));
  std::normal_distribution<double> gauss(0.0, 1.0);
  std::vector<double> carry(world, 0.0);
  const json qhs = sc.value("q_hs", json::object()), qpre = sc.value("q_pre", json::object());
  const double full_frac = num(qhs, "full_frac", 0), empty_frac = num(qhs, "empty_frac", 0);
  const double pre_empty = num(qpre, "empty_frac", 0);
  const int q_samples = sc.value("queue_samples_per_interval", 10), p_samples = sc.value("power_samples_per_interval", 6);
  const double loss0 = 8.0, loss1 = 2.5, tau = 200.0;
  int64_t step = 0, qs = 0, ps = 0;
  for (int k = 0; k < K; ++k) {
    const double t_begin = k == 0 ? 0.0 : startup + k * L, t_end = startup + (k + 1) * L, len = t_end - t_begin;
    int64_t drafter0_batches = 0;
    for (int r = 0; r < world; ++r) {
      dflash::RankTiming rt;
      rt.interval = k;
      rt.time_s = t_end;
      rt.rank = r;
      rt.role = roles[r];
      if (roles[r] == dflash::MetricsRole::Idle) {
        rt.wait_s = len;
        w.append_rank_timing(rt);
        continue;
      }
      const RoleSpec& s = roles[r] == dflash::MetricsRole::Target ? ts : ds;
      carry[r] += s.rate_per_rank * L;  // batches only after the start-up
      rt.batches = static_cast<int64_t>(std::floor(carry[r] + 1e-9));
      carry[r] -= static_cast<double>(rt.batches);
      // Busy for the role's share of the working part of the interval; the finished batches are whole, so
      // batches / busy_s scatters around the service rate while the sums keep it exactly.
      rt.busy_s = std::min(len, s.busy_per_batch * s.rate_per_rank * L * std::max(0.5, 1.0 + s.jitter * gauss(rng)));
      if (roles[r] == dflash::MetricsRole::Target) {
        rt.compute_s = rt.busy_s;
        rt.data_wait_s = std::min(len - rt.busy_s, data_wait_frac * L);
        rt.credit_wait_s = std::max(0.0, len - rt.busy_s - rt.data_wait_s);
        rt.wait_s = rt.data_wait_s + rt.credit_wait_s;
      } else {
        rt.compute_s = rt.busy_s * (1 - opt_frac);
        rt.optimizer_s = rt.busy_s * opt_frac;
        rt.allreduce_s = std::min(len - rt.busy_s, rt.batches * allreduce_per_batch);
        rt.data_wait_s = std::max(0.0, len - rt.busy_s - rt.allreduce_s);
        rt.wait_s = rt.data_wait_s + rt.allreduce_s;
        if (r % G == T && r / G == 0) drafter0_batches = rt.batches;
      }
      w.append_rank_timing(rt);
    }
    // One step per batch of each drafter (lockstep): the step's tokens are all drafters' batches.
    for (int64_t j = 0; j < drafter0_batches; ++j) {
      ++step;
      dflash::StepMetrics m;
      m.step = step;
      m.time_s = t_end - L + (j + 1) * L / static_cast<double>(drafter0_batches);
      const double progress = 1.0 - std::exp(-static_cast<double>(step) / tau);
      m.loss = loss1 + (loss0 - loss1) * (1 - progress) + 0.05 * gauss(rng);
      m.acc = 0.6 * progress;
      m.agree = 0.65 * progress;
      m.streak = 4.0 * progress;
      m.lr = 6e-4;
      m.noise = 0.0;
      m.grad_norm = 1.0;
      m.tokens = static_cast<int64_t>(tokens_per_batch) * D * N;
      m.anchors = 512 * D * N;
      // Accuracy falls along the block (a later position needs every earlier guess right to matter).
      for (int k = 1; k < layout.block_size; ++k) m.acc_by_pos.push_back(m.acc * std::pow(0.85, k - 1));
      w.append_step(m);
    }
    for (int i = 0; i < q_samples; ++i, ++qs) {
      std::vector<int> pre(T * N), hs(D * N);
      for (int d = 0; d < D * N; ++d) {
        const int64_t sidx = qs * D * N + d;
        const double x = spread(sidx);
        hs[d] = x < full_frac ? hs_depth : x < full_frac + empty_frac ? 0 : 1 + static_cast<int>(sidx % std::max(1, hs_depth - 1));
      }
      for (int t = 0; t < T * N; ++t) {
        const int64_t sidx = qs * T * N + t;
        pre[t] = spread(sidx) < pre_empty ? 0 : 1 + static_cast<int>(sidx % pre_depth);
      }
      w.append_queues(t_begin + (i + 1) * len / q_samples, pre, hs);
    }
    if (power) {
      for (int i = 0; i < p_samples; ++i, ++ps) {
        std::vector<double> pw(world), util(world), mem(world);
        for (int r = 0; r < world; ++r) {
          const double base = roles[r] == dflash::MetricsRole::Target ? p_t : roles[r] == dflash::MetricsRole::Drafter ? p_d : p_idle;
          pw[r] = base * (1.0 + 0.01 * gauss(rng));
          util[r] = roles[r] == dflash::MetricsRole::Idle ? 0 : 95;
          mem[r] = roles[r] == dflash::MetricsRole::Idle ? 500 : 60000;
        }
        w.append_gpus(t_begin + (i + 1) * len / p_samples, pw, util, mem);
      }
    }
  }
  w.close();
  std::printf("%s: %d intervals, %lld steps, %d ranks (%s on %d node(s) x %d GPUs)\n", out_path.c_str(), K,
              static_cast<long long>(step), world, topo.c_str(), N, G);
  return 0;
}

int predict(const std::string& path) {
  const json j = read_json(path);
  const json m = j.contains("measurements") ? j["measurements"] : j;
  dflash::RoleMeasurements rm;
  rm.gpus_per_node = m.value("gpus_per_node", 1);
  rm.nodes = m.value("nodes", 1);
  rm.target_s_per_batch = num(m, "target_s_per_batch", 0);
  rm.drafter_s_per_batch = num(m, "drafter_s_per_batch", 0);
  rm.allreduce_coeff_s = opt_num(m, "allreduce_coeff_s");
  rm.tokens_per_batch = num(m, "tokens_per_batch", 0);
  rm.power_target_w = opt_num(m, "power_target_w");
  rm.power_drafter_w = opt_num(m, "power_drafter_w");
  rm.power_idle_w = opt_num(m, "power_idle_w");
  rm.remaining_tokens = opt_num(m, "remaining_tokens");
  rm.colocated_overlap = opt_num(m, "colocated_overlap");
  rm.colocated_fit = dflash::parse_colocated_fit(m.value("colocated_fit", std::string("unknown")));
  const auto preds = dflash::predict_all_layouts(rm);
  json out = json::parse(dflash::whatif_json(rm, preds, dflash::best_split(preds)));
  if (auto budget = opt_num(j, "power_budget_w")) {
    auto b = dflash::best_split(preds, budget);
    out["best_within_budget"] = b ? json(b->split()) : json(nullptr);
  }
  std::printf("%s\n", out.dump(1).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-synth-metrics")) return 0;
  const char* usage = "usage: dflash-synth-metrics SCENARIO.json OUT.h5 | dflash-synth-metrics --predict FILE.json\n"
                      "  (docs/report.md: a scenario's metrics.h5 for the report tests, or the C++ what-if prediction)\n";
  std::string predict_file;
  std::vector<std::string> positional;
  dflash::ToolArgs args(argc, argv, usage);
  while (args.next()) {
    if (args.help()) {
      std::fputs(usage, stdout);
      return 0;
    } else if (args.is("--predict")) {
      predict_file = args.value();
    } else if (args.positional()) {
      positional.push_back(args.arg());
    } else {
      args.unknown();
    }
  }
  if (!predict_file.empty() && positional.empty()) return predict(predict_file);
  if (predict_file.empty() && positional.size() == 2) return write_scenario(positional[0], positional[1]);
  dflash::fatal(ExitCode::BadOptions, "give SCENARIO.json OUT.h5, or --predict FILE.json", usage);
}
