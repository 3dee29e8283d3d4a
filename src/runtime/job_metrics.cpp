#include "job_metrics.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/nvml.h"
#include "dry_run_plan.h"  // plan_role_memory
#include "layout_forecast.h"

#if __has_include("dflash_git_commit.h")
#include "dflash_git_commit.h"  // generated at build time (cmake/git_commit.cmake)
#endif
#ifndef DFLASH_GIT_COMMIT
#define DFLASH_GIT_COMMIT "unknown"
#endif

namespace dflash {

namespace {

// The layout plan of the GPU this run is on (or --gpu names, --topology plan): what metrics.h5 keeps so
// dflash-report can set it beside what the run measured (src/runtime/layout_forecast.h). GPUs per node: the
// distinct GPUs of the first node's ranks; the roles share GPUs where a target and a drafter sit on one (a
// one-GPU 1-1). nullopt where no GPU kind is known (the CPU backend without --gpu).
std::optional<nlohmann::json> layout_prediction(const JobContext& job) {
  const Topology& t = job.topo;
  double gpu_bytes = 0;
  for (const RankCard& c : job.cards)
    if (c.startup_gpu.valid && c.startup_gpu.mem_total_mib > 0) gpu_bytes = static_cast<double>(c.startup_gpu.mem_total_mib) * 1048576.0;
  int gpus = 0;
  bool shared = false;
  if (job.opt.backend == Device::CUDA) {
    for (int r = 0; r < t.world_size; ++r) {
      const RankPlace& p = t.places[static_cast<size_t>(r)];
      if (p.gpu < 0 || std::strcmp(p.host, t.places.front().host) != 0) continue;  // the first node's GPUs
      bool seen = false;
      for (int q = 0; q < r; ++q) seen = seen || t.same_gpu(q, r);
      gpus += seen ? 0 : 1;
    }
    for (int a : t.targets)
      for (int b : t.drafters) shared = shared || (a != b && t.same_gpu(a, b));  // a colocated rank is its own pair
  }
  if (gpus <= 0) gpus = t.ranks_per_node;
  const std::optional<LayoutForecast> f = forecast_layouts(job.opt, job.plan, plan_role_memory(job.opt, job.plan),
                                                           gpu_bytes, t.num_nodes, gpus);
  if (!f) return std::nullopt;
  return forecast_record(*f, job.plan.split(), shared, job.opt.topology_choice);
}

// "2026-12-01T10:05:00Z"
std::string utc_now_iso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Each target's newer report of the two (a target's counters only grow).
std::vector<TargetReport> newest_reports(const std::vector<TargetReport>& a, const std::vector<TargetReport>& b) {
  std::vector<TargetReport> out = a;
  for (size_t i = 0; i < out.size() && i < b.size(); ++i)
    if (b[i].rank >= 0 && b[i].batches >= out[i].batches) out[i] = b[i];
  return out;
}

// Fractional epochs done: the mean of the targets' loaders' progress (the status line's epoch~).
double mean_epoch(const std::vector<TargetReport>& targets) {
  double epoch = 0;
  for (const TargetReport& a : targets) epoch += a.epoch_progress / static_cast<double>(targets.size());
  return epoch;
}

// metrics.h5's /options: one attribute per option, typed as the parser holds it (Options::to_json): an
// integer as int64, a real as float64, a flag as int64 0/1 (netCDF has no boolean), a text as a string.
void write_typed_options(MetricsWriter& w, const std::string& options_json) {
  const nlohmann::json j = nlohmann::json::parse(options_json);
  for (const auto& [name, v] : j.items()) {
    if (v.is_number_integer()) w.set_group_attribute("options", name, v.get<int64_t>());
    else if (v.is_number()) w.set_group_attribute("options", name, v.get<double>());
    else if (v.is_boolean()) w.set_group_attribute("options", name, static_cast<int64_t>(v.get<bool>() ? 1 : 0));
    else w.set_group_attribute("options", name, v.is_string() ? v.get<std::string>() : v.dump());
  }
}

}  // namespace

MetricsHub::MetricsHub(const JobContext& job, int block_size, bool selector_metrics) : job_(job) {
  const Topology& t = job.topo;
  prev_targets_.resize(t.targets.size());
  prev_drafters_.resize(t.drafters.size());
  if (!t.is_metrics_writer()) return;
  MetricsLayout layout;
  layout.num_targets = static_cast<int>(t.targets.size());
  layout.num_drafters = static_cast<int>(t.drafters.size());
  // /gpus: one column per rank that reports (targets, drafters), when every one of them read its GPU
  // at startup; otherwise available = 0 with the reason (nothing is invented).
  std::vector<GpuReading> startup;
  std::vector<std::string> notes;
  std::vector<bool> reports;
  for (const RankCard& c : job.cards) {
    startup.push_back(c.startup_gpu);
    notes.emplace_back(c.gpu_note);
    reports.push_back(t.roles[c.rank] != Role::Idle);
  }
  const GpuColumns cols = plan_gpu_columns(startup, notes, reports);
  if (cols.available) gpu_ranks_ = cols.ranks;
  layout.num_gpus = static_cast<int>(gpu_ranks_.size());
  layout.gpu_available = cols.available;
  layout.gpu_unavailable_reason = cols.reason;
  layout.flush_every = job.opt.metrics_flush_every;
  layout.block_size = block_size;
  layout.selector_metrics = selector_metrics;
  std::error_code ec;
  std::filesystem::create_directories(job.opt.out_dir, ec);
  DF_CHECK_HINT(!ec, SystemFailure, "cannot create --out " << job.opt.out_dir << ": " << ec.message(),
                "give a writable directory");
  // Resuming: continue the run's file; rows after the checkpoint's step are written again.
  const bool resuming = !job.plan.resume.fresh();
  const std::string path = job.opt.out_dir + "/metrics.h5";
  const bool same_split = job.plan.resume.split == ResumeSplit::Same;
  if (resuming && same_split && std::filesystem::exists(path)) {
    // The file's /gpus series (made by the split's first segment) stay as they are: this segment appends to
    // them only when it has readings for the same number of columns; otherwise /gpus gets no new rows.
    // (On another split the writer moves the earlier split's /queues and /gpus aside and starts anew.)
    int64_t file_cols = 0;
    {
      const MetricsReader existing(path);
      if (existing.has("gpus/power_w")) existing.matrix("gpus/power_w", &file_cols);
    }
    if (file_cols != layout.num_gpus) gpu_ranks_.clear();
    layout.num_gpus = static_cast<int>(file_cols);
  }
  writer_ = std::make_unique<MetricsWriter>(path, layout, resuming ? MetricsOpen::Append : MetricsOpen::Create);
  if (resuming) writer_->drop_steps_after(job.plan.resume.step);
  if (resuming) writer_->drop_eval_after(job.plan.resume.step);  // evaluated after the checkpoint: again on schedule
  SegmentInfo seg;
  seg.first_step = job.plan.resume.step;
  seg.kind = !resuming      ? SegmentKind::Start
             : job.plan.segment.in_place ? SegmentKind::Rebalance
             : same_split   ? SegmentKind::Resume
                            : SegmentKind::Resplit;
  seg.nodes = t.num_nodes;
  seg.targets_per_node = static_cast<int64_t>(t.targets.size()) / std::max(1, t.num_nodes);
  seg.drafters_per_node = static_cast<int64_t>(t.drafters.size()) / std::max(1, t.num_nodes);
  seg.world_size = t.world_size;
  seg.grad_accum = job.plan.grad_accum;
  seg.unix_time_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  segment_ = writer_->begin_segment(seg);
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankCard& c : job.cards) {
    ranks.push_back({{"rank", c.rank}, {"role", role_name(static_cast<Role>(c.role))}, {"host", c.host},
                     {"gpu", c.gpu}, {"pid", c.pid}});
    // The GPU's PCI bus id (Topology::same_gpu's key; busy ranks on CUDA): the CUDA ordinal alone does not
    // say which ranks share a GPU (each rank of --gpus-per-task 1 sees its own as 0), and dflash-report
    // groups ranks by this (one board's power counted once, ranks taking turns on a GPU flagged).
    const size_t at = static_cast<size_t>(c.rank);
    if (at < t.places.size() && t.places[at].gpu_bus[0]) ranks.back()["gpu_bus"] = t.places[at].gpu_bus;
    if (c.startup_gpu.valid) {
      ranks.back()["startup_power_w"] = c.startup_gpu.power_w;
      ranks.back()["gpu_mem_total_mib"] = c.startup_gpu.mem_total_mib;
    }
  }
  writer_->set_attribute("options", job.plan.resolved_json(job.opt));
  write_typed_options(*writer_, job.plan.resolved_json(job.opt));
  writer_->set_attribute("topology", job.plan.split().to_string());
  writer_->set_attribute("num_nodes", static_cast<int64_t>(t.num_nodes));
  writer_->set_attribute("gpus_per_node", static_cast<int64_t>(t.ranks_per_node));  // what dflash-report splits
  if (!job.plan.segment.auto_record.empty()) {
    writer_->set_attribute("auto_topology", job.plan.segment.auto_record);
    const nlohmann::json rec = nlohmann::json::parse(job.plan.segment.auto_record, nullptr, false);
    if (rec.is_object() && rec.contains("measurements") && rec["measurements"].value("colocated_overlap", nlohmann::json()).is_number())
      auto_overlap_ = rec["measurements"]["colocated_overlap"].get<double>();
  }
  // Whether a colocated rank fits this job's GPU: --rebalance auto's and dflash-report's (docs/report.md).
  const ColocatedFitCheck fit = check_colocated_fit(job.opt, job.plan);
  colocated_fit_ = fit.fit;
  writer_->set_attribute("colocated_fit", nlohmann::json({{"fit", colocated_fit_name(fit.fit)}, {"why", fit.why}}).dump());
  if (const std::optional<nlohmann::json> f = layout_prediction(job)) writer_->set_attribute("layout_plan", f->dump());
  writer_->set_attribute("ranks", ranks.dump());
  writer_->set_attribute("backend", std::string(device_name(job.opt.backend)));
  writer_->set_attribute("version", std::string(DFLASH_VERSION));
  if (!gpu_ranks_.empty()) writer_->set_attribute("gpu_ranks", json_int_list(gpu_ranks_));
  idle_power_w_ = mean_startup_power_w(startup);
  if (idle_power_w_) writer_->set_attribute("gpu_idle_power_w", *idle_power_w_);
  // Tokens of one epoch of --data (a mix: of its slots), counted by the first target with the lr plan:
  // dflash-report's remaining-tokens ETA.
  if (job.plan.dataset.tokens > 0) writer_->set_attribute("dataset_tokens", job.plan.dataset.tokens);
  writer_->set_attribute("long_records_per_epoch", job.plan.dataset.long_records_per_epoch);
  writer_->set_attribute("long_record_tokens_dropped_per_epoch", job.plan.dataset.long_tokens_dropped_per_epoch);
  // Run metadata: when (UTC) the run and this segment started, the build's commit, the command line.
  const std::string now_utc = utc_now_iso8601();
  if (!resuming) writer_->set_attribute("start_utc", now_utc);
  writer_->set_attribute("segment_start_utc", now_utc);
  writer_->set_attribute("git_commit", std::string(DFLASH_GIT_COMMIT));
  writer_->set_attribute("command_line", job.opt.command_line);
  // The writer's host's cores (nodes are alike): on the CPU backend, more busy ranks than cores share them,
  // and dflash-report says the timings are distorted instead of recommending a split from them.
  if (const unsigned cores = std::thread::hardware_concurrency(); cores > 0)
    writer_->set_attribute("host_cpu_cores", static_cast<int64_t>(cores));
}

void MetricsHub::set_attribute(const std::string& name, int64_t value) {
  if (writer_) writer_->set_attribute(name, value);
}

MetricsHub::~MetricsHub() { close(); }

void MetricsHub::flush() {
  if (writer_) writer_->flush();
}

void MetricsHub::training_started() { last_time_s_ = train_start_s_ = job_.elapsed(); }

void MetricsHub::record_step(StepMetrics s, const std::vector<TargetReport>& targets_seen) {
  if (!writer_) return;
  s.epoch = mean_epoch(newest_reports(prev_targets_, targets_seen));
  last_step_ = s;
  writer_->append_step(s);
  interval_sums_.loss += s.loss;
  interval_sums_.acc += s.acc;
  interval_sums_.streak += s.streak;
  ++interval_sums_.steps;
}

void MetricsHub::record_eval(const EvalMetrics& m) {
  if (!writer_) return;
  ++evals_.count;
  evals_.seconds += m.seconds;
  writer_->append_eval(m);
  writer_->flush();  // an evaluation is rare and worth keeping at once
  std::string line = format_eval_line(m) + "\n";
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
}

void MetricsHub::report(const DrafterReport& mine, const std::vector<TargetReport>& targets_seen, Rates rates,
                        const std::function<void()>& progress) {
  const Topology& t = job_.topo;
  const size_t D = t.drafters.size(), T = t.targets.size();
  DF_ASSERT(targets_seen.size() == T);
  std::vector<DrafterReport> drafters(D);
  std::vector<TargetReport> seen(D * T);
  DrafterReport me = mine;
  me.gpu = sample_gpu(job_);
  const int root = 0;  // the writer is drafter 0 of drafter_comm
  MPI_Request r1 = mpi::igather(&me, 1, drafters.data(), root, t.drafter_comm);
  MPI_Request r2 = mpi::igather(targets_seen.data(), T, seen.data(), root, t.drafter_comm);
  auto why = [&] { return std::string("gathering metrics from the drafter ranks stalled (one of them is lost)"); };
  mpi::wait(r1, job_.opt.peer_timeout_s, why, progress);
  mpi::wait(r2, job_.opt.peer_timeout_s, why, progress);
  if (!writer_) return;

  // Each target's newest report, whichever drafter saw it.
  std::vector<TargetReport> targets(T);
  for (size_t i = 0; i < T; ++i) {
    targets[i] = prev_targets_[i];
    targets[i].rank = t.targets[i];
    for (size_t d = 0; d < D; ++d)
      if (seen[d * T + i].rank >= 0 && seen[d * T + i].batches >= targets[i].batches) targets[i] = seen[d * T + i];
  }
  const double now = job_.elapsed();
  const double dt = std::max(now - last_time_s_, 1e-9);
  double target_batches = 0, drafter_batches = 0, drafter_tokens = 0, epoch = 0;
  std::vector<int> q_pre(T), q_hs(D);
  // A /ranks row of this interval for `rank`; the caller adds what the rank reported.
  auto timing_row = [&](int rank, MetricsRole role) {
    RankTiming rt;
    rt.interval = interval_;
    rt.segment = segment_;
    rt.time_s = now;
    rt.rank = rank;
    rt.role = role;
    return rt;
  };
  for (size_t i = 0; i < T; ++i) {
    const TargetReport &a = targets[i], &p = prev_targets_[i];
    RankTiming rt = timing_row(a.rank, MetricsRole::Target);
    rt.batches = a.batches - p.batches;
    rt.compute_s = a.compute_s - p.compute_s;
    rt.credit_wait_s = a.credit_wait_s - p.credit_wait_s;
    rt.data_wait_s = a.data_wait_s - p.data_wait_s;
    rt.busy_s = rt.compute_s;
    rt.wait_s = rt.credit_wait_s + rt.data_wait_s + (a.send_wait_s - p.send_wait_s);
    writer_->append_rank_timing(rt);
    target_batches += static_cast<double>(rt.batches);
    q_pre[i] = a.q_pre;
    if (interval_ > 0) {  // interval 0 holds the start-up
      service_.target_busy_s += rt.busy_s;
      service_.target_batches += rt.batches;
    }
  }
  epoch = mean_epoch(targets);
  for (size_t d = 0; d < D; ++d) {
    const DrafterReport &a = drafters[d], &p = prev_drafters_[d];
    RankTiming rt = timing_row(a.rank, MetricsRole::Drafter);
    rt.batches = a.batches - p.batches;
    rt.data_wait_s = a.data_wait_s - p.data_wait_s;
    rt.compute_s = a.compute_s - p.compute_s;
    rt.allreduce_s = a.allreduce_s - p.allreduce_s;
    rt.optimizer_s = a.optimizer_s - p.optimizer_s;
    rt.eval_s = a.eval_s - p.eval_s;
    rt.busy_s = rt.compute_s + rt.optimizer_s;
    rt.wait_s = rt.data_wait_s + rt.allreduce_s;
    writer_->append_rank_timing(rt);
    drafter_batches += static_cast<double>(rt.batches);
    drafter_tokens += static_cast<double>(a.tokens - p.tokens);
    q_hs[d] = a.q_hs;
    if (interval_ > 0) {
      service_.drafter_busy_s += rt.busy_s;
      service_.allreduce_s += rt.allreduce_s;
      service_.drafter_batches += rt.batches;
      service_.tokens += static_cast<double>(a.tokens - p.tokens);
    }
  }
  for (int r = 0; r < t.world_size; ++r) {
    if (t.roles[r] != Role::Idle) continue;
    RankTiming rt = timing_row(r, MetricsRole::Idle);
    rt.wait_s = dt;  // an idle rank only waits for the end of the run
    writer_->append_rank_timing(rt);
  }
  writer_->append_queues(now, q_pre, q_hs);
  // Each GPU's newest reading (a target's rides on its last batch, at most 1 s older than that batch).
  std::optional<GpuRow> gpu_row;
  if (!gpu_ranks_.empty()) {
    std::vector<GpuReading> readings;
    for (int r : gpu_ranks_) {
      const int ti = t.target_index_of(r), di = t.drafter_index_of(r);
      readings.push_back(ti >= 0 ? targets[ti].gpu : di >= 0 ? drafters[di].gpu : GpuReading{});
    }
    gpu_row = assemble_gpu_row(readings);  // none when a GPU has no reading yet: the row is skipped
    if (gpu_row) writer_->append_gpus(now, gpu_row->power_w, gpu_row->util_pct, gpu_row->mem_used_mib);
    if (gpu_row && interval_ > 0)
      for (size_t g = 0; g < gpu_ranks_.size(); ++g) {
        const bool is_target = t.target_index_of(gpu_ranks_[g]) >= 0;
        (is_target ? service_.target_power_w : service_.drafter_power_w) += gpu_row->power_w[g];
        (is_target ? service_.target_power_n : service_.drafter_power_n) += 1;
      }
  }

  if (rates == Rates::WholeRun) {
    target_batches = drafter_batches = drafter_tokens = 0;
    for (const TargetReport& a : targets) target_batches += static_cast<double>(a.batches);
    for (const DrafterReport& a : drafters) {
      drafter_batches += static_cast<double>(a.batches);
      drafter_tokens += static_cast<double>(a.tokens);
    }
  }
  const double rate_s = rates == Rates::WholeRun ? std::max(now - train_start_s_, 1e-9) : dt;
  {
    StatusInputs in;
    in.elapsed_s = now;
    in.step = last_step_.step;
    const IntervalMeans& m = interval_sums_;
    const double n = static_cast<double>(std::max<int64_t>(m.steps, 1));
    in.loss = m.steps ? m.loss / n : last_step_.loss;
    in.acc = m.steps ? m.acc / n : last_step_.acc;
    in.streak = m.steps ? m.streak / n : last_step_.streak;
    in.lr = last_step_.lr;
    in.noise = last_step_.noise;
    in.candidate_recall = last_step_.candidate_recall;
    in.selector_acc = last_step_.selector_acc;
    in.target_batches_per_s = target_batches / rate_s;
    in.drafter_batches_per_s = drafter_batches / rate_s;
    in.tokens_per_s = drafter_tokens / rate_s;
    in.q_pre = q_pre;
    in.q_hs = q_hs;
    in.q_pre_capacity = job_.opt.prefetch_depth;
    in.q_hs_capacity = job_.opt.hs_queue_depth;
    in.grad_accum = job_.plan.grad_accum;
    in.colocated = job_.topo.spec.colocated();
    if (gpu_row) {
      // Ranks that share a GPU read the same device: count each GPU once (a rank without a bound GPU,
      // e.g. the NVML test hook on the CPU backend, is its own device).
      double total = 0;
      for (size_t i = 0; i < gpu_ranks_.size(); ++i) {
        bool counted = false;
        for (size_t j = 0; j < i && !counted; ++j) counted = job_.topo.same_gpu(gpu_ranks_[i], gpu_ranks_[j]);
        if (!counted) total += gpu_row->power_w[i];
      }
      in.power_w = total;
    }
    in.epoch = epoch;
    EtaInputs eta;
    eta.step = last_step_.step;
    eta.segment_first_step = job_.plan.resume.step;
    eta.segment_train_s = now - train_start_s_;
    eta.max_steps = job_.opt.max_steps;
    eta.epochs = job_.opt.epochs;
    eta.epoch = epoch;
    eta.evals_done = evals_.count;
    eta.eval_s = evals_.seconds;
    eta.eval_every = job_.eval ? job_.plan.eval_every : -1;
    in.eta_s = estimate_eta_s(eta);
    EtaInputs no_evals_due = eta;  // the same rate, without the evaluations still due: the part they are
    no_evals_due.eval_every = -1;
    if (in.eta_s) in.eta_eval_s = *in.eta_s - estimate_eta_s(no_evals_due).value_or(*in.eta_s);
    std::string line = format_status_line(in) + "\n";
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  }
  if (interval_ > 0) {
    service_.intervals++;
    service_.wall_s += dt;
  }
  interval_sums_ = IntervalMeans{};
  prev_targets_ = targets;
  prev_drafters_ = drafters;
  last_time_s_ = now;
  ++interval_;
}

std::optional<RoleMeasurements> MetricsHub::measurements() const {
  const ServiceSums& s = service_;
  if (!writer_ || s.intervals < 2 || s.target_batches <= 0 || s.drafter_batches <= 0 || s.target_busy_s <= 0 ||
      s.drafter_busy_s <= 0)
    return std::nullopt;
  const Topology& t = job_.topo;
  RoleMeasurements m;
  m.gpus_per_node = t.ranks_per_node;
  m.nodes = t.num_nodes;
  m.target_s_per_batch = s.target_busy_s / static_cast<double>(s.target_batches);
  m.drafter_s_per_batch = s.drafter_busy_s / static_cast<double>(s.drafter_batches);
  // The allreduce's seconds per batch as measured at this many drafters, as the coefficient of the ring
  // model (one drafter: not measured, modelled as 0). It includes waiting for slower drafters, as
  // dflash-report's does.
  const int drafters_total = static_cast<int>(t.drafters.size());
  if (drafters_total > 1)
    m.allreduce_coeff_s = s.allreduce_s / static_cast<double>(s.drafter_batches) / ring_allreduce_factor(drafters_total);
  m.tokens_per_batch = s.tokens / static_cast<double>(s.drafter_batches);
  if (s.target_power_n > 0) m.power_target_w = s.target_power_w / static_cast<double>(s.target_power_n);
  if (s.drafter_power_n > 0) m.power_drafter_w = s.drafter_power_w / static_cast<double>(s.drafter_power_n);
  m.power_idle_w = idle_power_w_;
  m.colocated_fit = colocated_fit_;
  if (t.spec.colocated() && s.wall_s > 0) {
    // Each rank's wall seconds per batch against its roles' busy seconds and its allreduce (the model's
    // per-batch time, s_t + s_d + a - o min(s_t, s_d)), as dflash-report's analysis computes it.
    const double wall_per_batch = s.wall_s * static_cast<double>(drafters_total) / static_cast<double>(s.drafter_batches);
    const double a = s.allreduce_s / static_cast<double>(s.drafter_batches);
    m.colocated_overlap = colocated_overlap(m.target_s_per_batch, m.drafter_s_per_batch, wall_per_batch - a);
  } else {
    m.colocated_overlap = auto_overlap_;
  }
  return m;
}

void MetricsHub::close() {
  if (writer_) writer_->close();
}

}  // namespace dflash
