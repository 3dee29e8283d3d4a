// --topology auto (auto_measure.h): measurement on every rank, then the shared what-if model.
#include "auto_measure.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "dflash/auto_topology.h"
#include "dflash/backend.h"
#include "dflash/hs_batch.h"
#include "dflash/hs_wire.h"
#include "dflash/nvml.h"
#include "dflash/data_mix.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/hf_config.h"
#include "dflash/mpi_typed.h"
#include "dflash/target.h"
#include "dflash/topology.h"  // node_seat, bind_gpu
#include "dry_run_plan.h"  // check_colocated_fit
#include "run_plan.h"

namespace dflash {
namespace {

constexpr int kMeasuredBatches = 3;  // after one warm-up batch (first-touch allocation, caches)
constexpr int kAllreduceRepeats = 3;

double median(std::vector<double> v) {
  DF_ASSERT(!v.empty());
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What one rank measured (summed over ranks, then averaged).
struct RankSample {
  double target_s = 0;     // median target forward seconds per batch
  double drafter_s = 0;    // median drafter fwd + bwd + optimizer seconds per batch
  double both_s = 0;       // median seconds of a forward and a step at once (the colocated phase; 0: not run)
  double tokens = 0;       // mean tokens per batch
  double allreduce_s = 0;  // fastest gradient allreduce over all ranks
  double idle_w = 0, target_w = 0, drafter_w = 0;  // mean GPU power (0 = not measured: no NVML)
  double power_known = 0;  // 1 when this rank read its GPU's power
};

// Mean power of the readings taken while a role ran (NVML's reading trails by up to a second, so one
// is taken after each timed batch; the first, warm-up batch is not counted).
struct PowerMean {
  double sum = 0;
  int n = 0;
  void add(const GpuReading& g) {
    if (!g.valid) return;
    sum += g.power_w;
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
};

// Whether the rank times its two roles at once, as a colocated rank runs them.
enum class ColocatedPhase : uint8_t { Skip, Run };

void sleep_ms(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// One drafter step (fwd + bwd + AdamW) on a captured batch; returns once it has finished on the device
// (optimizer_step returns the gradient norm).
// The codecs are the roles' own (hs_wire.h): --hs-dtype fp8's quantize and dequantize are measured with them.
void drafter_step(DrafterTrainer& trainer, HsCodec& codec, const Ctx& ctx, const HsBatch& b, const Options& o) {
  FeatureBatch fb;
  fb.batch = &b.batch;
  const HsValues values = codec.decode(ctx, b);
  fb.features = values.features;
  fb.final_norm = values.final_norm;
  trainer.forward_backward(fb);
  trainer.optimizer_step();
  // The test hooks slow a role down in the run; they must in the measurement too (tests pick splits with them).
  sleep_ms(o.inject_delay_drafter_ms);
}

void target_forward(TargetModel& model, HsCodec& codec, HsBatch& b, const Ctx& ctx, const Options& o) {
  CaptureOut out;
  const HsValues into = codec.forward_into(b);
  out.features = into.features;
  out.final_norm = into.final_norm;
  model.forward(b.batch, out);
  codec.encode(ctx, b);
  synchronize(ctx);
  sleep_ms(o.inject_delay_target_ms);
}

// The roles are measured one after the other. Without the colocated phase the target model is released
// before the drafter is built, so a rank never holds both (on a GPU they may not fit together); with it
// (the colocated rank's memory fits: check_colocated_fit) the target stays, on the context a colocated
// rank's target computes on (colocated_target_ctx: on CUDA a second stream), and after the standalone
// timings each measured batch is a target forward (on a thread of its own, into a spare batch) and a
// drafter step at once, timed together: s_both (auto_topology.h). The target's captured features of each
// measured batch are kept (on the device) for the drafter's steps.
RankSample measure_rank(const Options& o, const ModelPlan& plan, MPI_Comm world, int world_size, const Ctx& ctx,
                        int gpu_index, ColocatedPhase colocated, PowerSampler* gpu) {
  auto dataset = std::make_shared<DatasetMix>(o.data, o.train.seed, plan.target.text.vocab_size);
  RankSample s;
  const GpuReading idle = gpu ? gpu->sample() : GpuReading{};
  s.idle_w = idle.valid ? idle.power_w : 0;
  s.power_known = idle.valid ? 1 : 0;

  // Every rank times the same first batches (epochs repeat, so a small dataset still gives enough).
  LoaderOptions lo = plan.loader;
  lo.prefetch_depth = 2;
  lo.max_epochs = 0;
  Loader loader(dataset, lo);

  const SlotShape& shape = plan.slot_shape;
  HsCodec target_codec(shape), drafter_codec(shape);
  std::vector<std::unique_ptr<HsBatch>> batches;
  std::vector<double> target_s, drafter_s, both_s;
  PowerMean target_w, drafter_w;
  double tokens = 0;
  const Ctx target_ctx = colocated == ColocatedPhase::Run ? colocated_target_ctx(o.backend, gpu_index) : ctx;
  std::unique_ptr<TargetModel> model = make_target_model(plan.target, o.target_dir, target_ctx, plan.capture_layers, o.token_budget);
  for (int i = 0; i <= kMeasuredBatches; ++i) {
    LoadedBatch lb;
    const PopResult got = loader.pop(lb, std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout_s * 1000)));
    DF_CHECK_HINT(got == PopResult::Batch, BadInput, "--topology auto: no batch from " << dataset->path() << " to measure on",
                  "check the dataset (dflash-prep), or give --topology T-D");
    batches.push_back(std::make_unique<HsBatch>(shape));
    HsBatch& b = *batches.back();
    b.fill_from(lb.batch);
    const auto t0 = mpi::Clock::now();
    target_forward(*model, target_codec, b, target_ctx, o);
    const double t = mpi::seconds_since(t0);
    if (i == 0) continue;  // warm-up
    target_s.push_back(t);
    target_w.add(gpu ? gpu->sample() : GpuReading{});
    tokens += static_cast<double>(b.num_tokens());
  }
  loader.stop();
  if (colocated == ColocatedPhase::Skip) model.reset();  // the target's weights are released here

  DrafterTrainer trainer(plan.drafter_source(o), o.train, ctx, o.token_budget);
  for (int i = 0; i <= kMeasuredBatches; ++i) {
    const auto t0 = mpi::Clock::now();
    drafter_step(trainer, drafter_codec, ctx, *batches[static_cast<size_t>(i)], o);
    const double t = mpi::seconds_since(t0);
    if (i == 0) continue;  // warm-up
    drafter_s.push_back(t);
    drafter_w.add(gpu ? gpu->sample() : GpuReading{});
  }
  if (colocated == ColocatedPhase::Run) {
    // Batch i's step while the next batch's forward runs, as on a colocated rank (its queue holds the
    // forward's output apart from the batch the step reads: here a spare batch).
    HsBatch spare(shape);
    for (int i = 0; i <= kMeasuredBatches; ++i) {
      spare.fill_from(batches[static_cast<size_t>((i + 1) % (kMeasuredBatches + 1))]->batch);
      const auto t0 = mpi::Clock::now();
      std::thread forward([&] {
        // Made on this thread: on CUDA it also makes the rank's GPU this thread's current device.
        const Ctx tctx = colocated_target_ctx(o.backend, gpu_index);
        target_forward(*model, target_codec, spare, tctx, o);
      });
      drafter_step(trainer, drafter_codec, ctx, *batches[static_cast<size_t>(i)], o);
      forward.join();
      sleep_ms(o.inject_delay_colocated_ms);
      const double t = mpi::seconds_since(t0);
      if (i == 0) continue;  // warm-up
      both_s.push_back(t);
    }
    model.reset();
  }
  batches.clear();

  s.target_s = median(target_s);
  s.drafter_s = median(drafter_s);
  s.both_s = both_s.empty() ? 0 : median(both_s);
  s.tokens = tokens / kMeasuredBatches;
  s.target_w = target_w.mean();
  s.drafter_w = drafter_w.mean();
  if (target_w.n == 0 || drafter_w.n == 0) s.power_known = 0;
  // The gradient allreduce (host MPI, the fallback reducer), over every rank at once: the largest drafter
  // group this job could form.
  Tensor grads = trainer.grads();
  std::vector<float> buf(grads.numel());
  copy_tensor(ctx, cpu_view(buf.data(), {static_cast<int64_t>(buf.size())}), grads);
  s.allreduce_s = 1e30;
  for (int i = 0; i < kAllreduceRepeats && world_size > 1; ++i) {
    DF_MPI(MPI_Barrier(world));
    const auto t0 = mpi::Clock::now();
    mpi::allreduce(buf.data(), buf.size(), MPI_SUM, world);
    s.allreduce_s = std::min(s.allreduce_s, mpi::seconds_since(t0));
  }
  if (world_size <= 1) s.allreduce_s = 0;
  return s;
}

}  // namespace

TopologySpec choose_topology_auto(const Options& o, MPI_Comm world, PowerSampler* gpu, std::string* record_json,
                                  std::optional<ModelPlan>* planned) {
  int rank = 0, size = 1;
  DF_MPI(MPI_Comm_rank(world, &rank));
  DF_MPI(MPI_Comm_size(world, &size));
  const NodeSeat seat = node_seat(world);
  const int per_node = seat.ranks_on_node;
  int range[2] = {per_node, -per_node};
  mpi::allreduce(range, 2, MPI_MIN, world);
  DF_CHECK_HINT(range[0] == -range[1], TopologyMismatch,
                "--topology auto: nodes run different numbers of ranks (" << range[0] << " to " << -range[1] << ")",
                "start the same number of ranks on every node");
  DF_CHECK_HINT(per_node >= 2 || o.measure_only, TopologyMismatch,
                "--topology auto needs at least 2 ranks per node (a target and a drafter); this node has " << per_node,
                "start more ranks per node (mpirun -np), or give --topology 1-1");
  check_input_paths(o);
  const ModelPlan& plan = planned->emplace(plan_job(o));
  if (rank == 0) {
    std::printf("[dflash] --topology auto: timing %d target forwards and %d drafter steps on each of %d rank(s)\n",
                kMeasuredBatches, kMeasuredBatches, size);
    std::fflush(stdout);
  }

  // The GPU this rank will bind (create_topology's).
  set_deterministic_kernels(o.deterministic);
  const int gpu_index = o.backend == Device::CUDA ? bind_gpu(seat.local_rank) : seat.local_rank;
  const Ctx ctx = o.backend == Device::CUDA ? make_ctx(Device::CUDA, gpu_index) : cpu_ctx();
  // The colocated phase holds both models: only where a colocated rank is known to fit its GPU, or in host
  // memory (the CPU backend). Every rank agrees (a node's NVML may differ).
  const ColocatedFitCheck fit = check_colocated_fit(o, plan);
  int run_phase = fit.fit == ColocatedFit::Fits || (fit.fit == ColocatedFit::Unknown && o.backend == Device::CPU) ? 1 : 0;
  mpi::allreduce(&run_phase, 1, MPI_MIN, world);
  const ColocatedPhase phase = run_phase ? ColocatedPhase::Run : ColocatedPhase::Skip;
  const RankSample mine = measure_rank(o, plan, world, size, ctx, gpu_index, phase, gpu);
  double sums[9] = {mine.target_s, mine.drafter_s, mine.tokens, mine.allreduce_s,
                    mine.idle_w, mine.target_w, mine.drafter_w, mine.power_known, mine.both_s};
  mpi::allreduce(sums, 9, MPI_SUM, world);
  RoleMeasurements m;
  m.gpus_per_node = per_node;
  m.nodes = size / per_node;
  m.target_s_per_batch = sums[0] / size;
  m.drafter_s_per_batch = sums[1] / size;
  m.tokens_per_batch = sums[2] / size;
  if (size > 1) m.allreduce_coeff_s = (sums[3] / size) / ring_allreduce_factor(size);
  // Power only when every rank read its GPU (NVML); never invented (the CPU backend has none).
  if (sums[7] == size) {
    m.power_idle_w = sums[4] / size;
    m.power_target_w = sums[5] / size;
    m.power_drafter_w = sums[6] / size;
  }
  m.colocated_fit = fit.fit;
  if (phase == ColocatedPhase::Run)
    m.colocated_overlap = colocated_overlap(m.target_s_per_batch, m.drafter_s_per_batch, sums[8] / size);
  if (o.epochs > 0 && o.max_steps == 0) {
    m.remaining_tokens = static_cast<double>(DatasetMix(o.data, o.train.seed, plan.target.text.vocab_size).num_tokens()) * o.epochs;
  }
  auto measured_line = [&] {
    char head[400];
    std::snprintf(head, sizeof(head),
                  "[dflash] --topology auto: target %.4f s/batch, drafter %.4f s/batch (fwd+bwd+AdamW), gradient "
                  "allreduce %.4f s x 2(D-1)/D, %.0f tokens/batch, %d node(s) x %d ranks\n",
                  m.target_s_per_batch, m.drafter_s_per_batch, m.allreduce_coeff_s.value_or(0.0), m.tokens_per_batch,
                  m.nodes, m.gpus_per_node);
    std::string line = head;
    if (phase == ColocatedPhase::Run)
      line += "[dflash] --topology auto: colocated (a forward and a step at once) " +
              std::to_string(sums[8] / size).substr(0, 6) + " s/batch: overlap " +
              std::to_string(*m.colocated_overlap).substr(0, 5) + " of the shorter role; memory " +
              colocated_fit_name(fit.fit) + " (" + fit.why + ")\n";
    else
      line += std::string("[dflash] --topology auto: colocated not timed: a colocated rank's memory ") +
              (fit.fit == ColocatedFit::DoesNotFit ? "does not fit (" : "fit is unknown (") + fit.why +
              "), so it is not a candidate\n";
    if (m.power_target_w)
      line += "[dflash] --topology auto: power (NVML, mean over ranks) idle " + std::to_string(static_cast<int>(*m.power_idle_w)) +
              " W, target " + std::to_string(static_cast<int>(*m.power_target_w)) + " W, drafter " +
              std::to_string(static_cast<int>(*m.power_drafter_w)) + " W\n";
    return line;
  };
  if (per_node < 2) {  // --measure-only on one rank per node: the roles' numbers, no split to predict
    if (rank == 0) {
      std::fputs((measured_line() + "[dflash] --measure-only: one rank per node, so no split to predict\n").c_str(), stdout);
      std::fflush(stdout);
    }
    if (record_json) *record_json = "{}";
    return TopologySpec{};
  }
  const std::vector<SplitPrediction> preds = predict_all_layouts(m);
  const bool power_known = preds.front().power_w.has_value();
  std::optional<double> budget;
  if (o.power_budget_w > 0 && power_known) budget = o.power_budget_w;
  std::optional<SplitPrediction> best = best_split(preds, budget);
  std::string note;
  if (o.power_budget_w > 0 && !power_known) note = "--power-budget-w ignored: no power readings on this backend";
  if (!best) {
    note = "no layout fits --power-budget-w " + std::to_string(static_cast<int64_t>(o.power_budget_w)) + " W; the fastest is used";
    best = best_split(preds);
  }
  DF_ASSERT(best.has_value());
  // Every rank computed the same table from the same sums; rank 0's choice is the job's all the same.
  int chosen[3] = {best->targets, best->drafters, best->layout == Layout::Colocated ? 1 : 0};
  mpi::bcast(chosen, 3, 0, world);
  const TopologySpec spec = chosen[2] ? colocated_spec() : TopologySpec{chosen[0], chosen[1]};

  nlohmann::json rec = nlohmann::json::parse(whatif_json(m, preds, best));
  rec["chosen"] = spec.to_string();
  rec["measured_batches_per_rank"] = kMeasuredBatches;
  rec["measured_ranks"] = size;
  rec["power_budget_w"] = o.power_budget_w > 0 ? nlohmann::json(o.power_budget_w) : nlohmann::json(nullptr);
  rec["note"] = note;
  if (record_json) *record_json = rec.dump();
  if (rank == 0) {
    std::string out = measured_line() + format_whatif_table(m, preds, spec.to_string());
    out += "[dflash] --topology auto chose " + spec.to_string() + " (predicted " +
           std::to_string(best->batches_per_s).substr(0, 6) + " b/s, " + split_limit_name(best->limit) + "-bound)" +
           (note.empty() ? "" : "; " + note) + "\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  return spec;
}

}  // namespace dflash
