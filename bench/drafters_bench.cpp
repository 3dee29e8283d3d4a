// dflash-drafters-bench: the drafter ranks alone (no target, no data plane), one GPU each, training the
// real DrafterTrainer on batches every rank regenerates from a seed, and summing gradients the way the
// job does (grad_reducer.h: buckets launched during the backward, prescaled by the local weight sum,
// divided by the global one). It checks and measures what issue "Two-GPU measurements" asks of the
// drafters:
//   - identical weights on every rank after every summed step (a 64-bit hash of the fp32 master weights);
//   - the summed step equals one rank's step over the union of the ranks' batches (--union-check: rank 0
//     regenerates every rank's batch, packs them into one and steps a second trainer from the same init);
//   - the exposed cost of the gradient sum: step time with one bucket summed after the backward and with
//     --bucket-mb buckets launched during it, against the same step with no sum (each rank alone), and
//     the sum of the whole gradient alone.
// The bench writer of bench_common.h: `# ` metadata, a fixed-width row per mode with units, --json for JSON
// lines; exit 1 when a check fails.
//
//   mpirun -np 2 dflash-drafters-bench --target DIR [--draft-layers 5] [--tokens 16384 --seq-len 4096]
//          [--anchors 512] [--warmup 2 --steps 6] [--bucket-mb 25] [--union-check] [--seed 1] [--json]
// DIR: a target checkpoint (its embedding and lm_head; dflash-make-random --preset qwen3-8b writes one).
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dflash/anchors.h"
#include "dflash/backend.h"
#include "dflash/device_async.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/grad_reducer.h"
#include "dflash/mpi_typed.h"
#include "dflash/topology.h"
#include "bench_common.h"
#include "random_fill.cuh"

using namespace dflash;

namespace {

struct Args {
  std::string target;
  int draft_layers = 5;
  int64_t tokens = 16384, seq_len = 4096;
  int anchors = 512, warmup = 2, steps = 6;
  double bucket_mb = 25;
  bool union_check = false;
  uint64_t seed = 1;
  double timeout_s = 300;
  double max_grad_rel = 2e-2, min_update_cos = 0.95;  // union check tolerances (bf16 compute)
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--union-check") {
      a.union_check = true;
      continue;
    }
    DF_CHECK_HINT(i + 1 < argc, BadOptions, k << " needs a value", "see the usage at the top of bench/drafters_bench.cpp");
    const std::string v = argv[++i];
    if (k == "--target") a.target = v;
    else if (k == "--draft-layers") a.draft_layers = std::stoi(v);
    else if (k == "--tokens") a.tokens = std::stoll(v);
    else if (k == "--seq-len") a.seq_len = std::stoll(v);
    else if (k == "--anchors") a.anchors = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--steps") a.steps = std::stoi(v);
    else if (k == "--bucket-mb") a.bucket_mb = std::stod(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--timeout") a.timeout_s = std::stod(v);
    else if (k == "--max-grad-rel") a.max_grad_rel = std::stod(v);
    else if (k == "--min-update-cos") a.min_update_cos = std::stod(v);
    else DF_FAIL(BadOptions, "unknown option " << k, "see the usage at the top of bench/drafters_bench.cpp");
  }
  DF_CHECK_HINT(!a.target.empty(), BadOptions, "--target DIR is required", "a target checkpoint directory");
  DF_CHECK(a.tokens >= 2 && a.seq_len >= 2 && a.steps >= 1 && a.warmup >= 0 && a.anchors >= 1 && a.bucket_mb > 0,
           BadOptions, "bad sizes");
  return a;
}

using bench::median;

// One rank's batch of one step, a pure function of (seed, rank, step): random tokens in sequences of
// seq_len (the last one shorter), every token with loss, features and final norm uniform noise.
uint64_t batch_seed(const Args& a, int rank, int64_t step) { return a.seed * 1000003ull + 7919ull * rank + step; }

PackedBatch make_batch(const Args& a, int rank, int64_t step, int vocab) {
  PackedBatch b;
  Rng rng(batch_seed(a, rank, step));
  b.tokens.resize(static_cast<size_t>(a.tokens));
  for (auto& t : b.tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  for (int64_t s = 0; s < a.tokens; s += a.seq_len) b.cu_seqlens.push_back(static_cast<int32_t>(s));
  b.cu_seqlens.push_back(static_cast<int32_t>(a.tokens));
  b.loss_mask.assign(static_cast<size_t>(a.tokens), 1);
  return b;
}

// features [K, T_all, H] and final_norm [T_all, H]: rows [row0, row0 + tokens) get rank's batch of step.
void fill_features(const Ctx& ctx, const Tensor& features, const Tensor& final_norm, int64_t row0, const Args& a, int rank,
                   int64_t step) {
  const int64_t K = features.shape[0], T = features.shape[1], H = features.shape[2];
  const uint64_t s = batch_seed(a, rank, step) * 64;
  auto rows = [&](void* base, int64_t first) {
    return Tensor(static_cast<char*>(base) + static_cast<size_t>(first * H) * 2, DType::BF16, Device::CUDA, {a.tokens, H});
  };
  for (int64_t k = 0; k < K; ++k) cuda::fill_random(ctx, rows(features.data, k * T + row0), s + static_cast<uint64_t>(k), 0.f, 1.f);
  cuda::fill_random(ctx, rows(final_norm.data, row0), s + 63, 0.f, 1.f);
}

std::vector<int64_t> anchors_of(const Args& a, const PackedBatch& b, int rank, int64_t step) {
  AnchorSampler sampler(batch_seed(a, rank, step) ^ 0x5eedull);
  return sampler.sample(b, a.anchors);
}

uint64_t hash_of(const Tensor& host_f32) {
  const uint64_t* w = static_cast<const uint64_t*>(host_f32.data);
  const size_t n = host_f32.nbytes() / 8;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ w[i]) * 1099511628211ull;
  return h;
}

// True when every rank's master weights hash the same.
bool same_weights_everywhere(DrafterTrainer& tr) {
  uint64_t h[2] = {hash_of(tr.master_weights()), 0};
  h[1] = ~h[0];
  mpi::allreduce(h, 2, MPI_MAX, MPI_COMM_WORLD);  // max of h and max of ~h = ~min(h)
  return h[0] == ~h[1];
}

struct Batch {
  PackedBatch packed;
  std::vector<int64_t> anchors;
  Buffer features, final_norm;
  FeatureBatch fb() const {
    FeatureBatch f;
    f.batch = &packed;
    f.features = features.t();
    f.final_norm = final_norm.t();
    return f;
  }
};

enum class SumMode { None, OneBucket, Buckets };
// The case names: the whole gradient summed in one bucket after the backward, in buckets launched during it,
// not summed (each rank alone: the baseline of exposed_ms).
const char* mode_name(SumMode m) {
  return m == SumMode::None ? "no_sum" : m == SumMode::OneBucket ? "one_bucket_after" : "buckets_during";
}

class Harness {
 public:
  Harness(const Args& a, const Ctx& ctx, GradReduceKind kind)
      : a_(a), ctx_(ctx), kind_(kind), rank_(mpi_rank()), size_(mpi_size()), tr_(make_trainer(a.anchors, a.tokens)) {
    const DrafterConfig& c = tr_->config();
    K_ = static_cast<int64_t>(c.target_layer_ids.size());
    H_ = c.layers.hidden_size;
    vocab_ = c.layers.vocab_size;
    for (const ParamSpec& p : tr_->param_layout()) params_.push_back({p.offset, p.offset + p.numel()});
    batch_.features = Buffer(Device::CUDA, DType::BF16, {K_, a.tokens, H_});
    batch_.final_norm = Buffer(Device::CUDA, DType::BF16, {a.tokens, H_});
  }
  DrafterTrainer& trainer() { return *tr_; }
  size_t params() const { return tr_->grads().numel(); }

  std::unique_ptr<DrafterTrainer> make_trainer(int max_anchors, int64_t max_tokens) const {
    TrainOptions opt;
    opt.max_anchors = max_anchors;
    opt.seed = a_.seed;  // every rank starts from the same weights
    return std::make_unique<DrafterTrainer>(a_.target, "", a_.draft_layers, opt, ctx_, max_tokens);
  }

  void load_batch(int64_t step) {
    batch_.packed = make_batch(a_, rank_, step, vocab_);
    batch_.anchors = anchors_of(a_, batch_.packed, rank_, step);
    fill_features(ctx_, batch_.features.t(), batch_.final_norm.t(), 0, a_, rank_, step);
    synchronize(ctx_);
  }

  // One training step as the job's drafter takes it; returns its wall time (ms), data ready beforehand.
  // summed_grad (optional): the gradient AdamW is given, copied out (not timed then).
  double step(SumMode mode, GradientReducer* reducer, std::vector<float>* summed_grad = nullptr) {
    MPI_Barrier(MPI_COMM_WORLD);  // the ranks start together; not timed
    const auto t0 = mpi::Clock::now();
    GradHooks hooks;
    if (mode != SumMode::None) {
      hooks.begin = [&](double w) { reducer->begin_step(tr_->grads(), static_cast<float>(w)); };
      hooks.ready = [&](size_t b, size_t e) { reducer->ready(b, e); };
    }
    const StepStats st = tr_->forward_backward(batch_.fb(), hooks, batch_.anchors);
    if (mode != SumMode::None) {
      double w = st.weight_sum;
      MPI_Request r = mpi::iallreduce(&w, 1, MPI_SUM, MPI_COMM_WORLD);
      mpi::Deadline d(a_.timeout_s);
      bool grads_done = false, sums_done = false;
      while (!(grads_done && sums_done)) {
        grads_done = grads_done || reducer->done();
        sums_done = sums_done || mpi::test(r);
        DF_CHECK(!d.expired(), LostPeer, "the gradient sum stalled for " << a_.timeout_s << " s");
      }
      tr_->scale_grads(w > 0 ? static_cast<float>(1.0 / w) : 0.f);
    }
    if (summed_grad) {
      summed_grad->resize(params());
      copy_tensor(ctx_, cpu_view(summed_grad->data(), {static_cast<int64_t>(params())}), tr_->grads());
    }
    tr_->optimizer_step();
    synchronize(ctx_);
    return std::chrono::duration<double, std::milli>(mpi::Clock::now() - t0).count();
  }

  // The whole gradient summed with nothing else running (one bucket), ms.
  double sum_alone(GradientReducer& reducer) {
    synchronize(ctx_);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = mpi::Clock::now();
    reducer.start(tr_->grads(), 1.0f);
    mpi::Deadline d(a_.timeout_s);
    while (!reducer.done()) DF_CHECK(!d.expired(), LostPeer, "the gradient sum stalled");
    synchronize(ctx_);
    return std::chrono::duration<double, std::milli>(mpi::Clock::now() - t0).count();
  }

  std::unique_ptr<GradientReducer> reducer(double cap_mb) {
    return make_gradient_reducer(kind_, MPI_COMM_WORLD, ctx_, plan_grad_buckets(params_, grad_bucket_elements(cap_mb)),
                                 a_.timeout_s);
  }

  // Rank 0: the union of every rank's batch of `step`, stepped by a second trainer from the same init;
  // compared with this (already summed and stepped) trainer: the gradient and the update. Returns pass.
  bool union_check(int64_t step, const std::vector<float>& w0, const std::vector<float>& summed_grad, bench::Writer& out) {
    if (rank_ != 0) return true;
    const int64_t Tu = a_.tokens * size_;
    auto ref = make_trainer(a_.anchors * size_, Tu);
    Batch u;
    u.features = Buffer(Device::CUDA, DType::BF16, {K_, Tu, H_});
    u.final_norm = Buffer(Device::CUDA, DType::BF16, {Tu, H_});
    u.packed.cu_seqlens = {0};
    for (int r = 0; r < size_; ++r) {
      const PackedBatch b = make_batch(a_, r, step, vocab_);
      const int64_t off = u.packed.num_tokens();
      for (int64_t x : anchors_of(a_, b, r, step)) u.anchors.push_back(x + off);
      u.packed.tokens.insert(u.packed.tokens.end(), b.tokens.begin(), b.tokens.end());
      u.packed.loss_mask.insert(u.packed.loss_mask.end(), b.loss_mask.begin(), b.loss_mask.end());
      for (size_t i = 1; i < b.cu_seqlens.size(); ++i) u.packed.cu_seqlens.push_back(static_cast<int32_t>(off + b.cu_seqlens[i]));
      fill_features(ctx_, u.features.t(), u.final_norm.t(), off, a_, r, step);
    }
    synchronize(ctx_);
    ref->forward_backward(u.fb(), u.anchors);
    std::vector<float> g(params());
    copy_tensor(ctx_, cpu_view(g.data(), {static_cast<int64_t>(g.size())}), ref->grads());
    ref->optimizer_step();
    const Tensor wu = ref->master_weights(), ws = tr_->master_weights();
    const float* pu = static_cast<const float*>(wu.data);
    const float* ps = static_cast<const float*>(ws.data);
    double gd = 0, gn = 0, dot = 0, nu = 0, ns = 0, wmax = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      gd += (double(summed_grad[i]) - g[i]) * (double(summed_grad[i]) - g[i]);
      gn += double(g[i]) * g[i];
      const double du = double(pu[i]) - w0[i], dsum = double(ps[i]) - w0[i];
      dot += du * dsum;
      nu += du * du;
      ns += dsum * dsum;
      wmax = std::max(wmax, std::fabs(double(pu[i]) - ps[i]));
    }
    const double grad_rel = std::sqrt(gd / std::max(gn, 1e-300)), cos = dot / std::sqrt(std::max(nu * ns, 1e-300));
    const bool ok = grad_rel <= a_.max_grad_rel && cos >= a_.min_update_cos;
    out.note(bench::format("union check (step %lld, %d ranks x %lld tokens vs one trainer on %lld): summed gradient vs "
                           "the union's rel L2 %.2e (<= %.0e), update cosine %.5f (>= %.2f), max |w diff| %.2e -> %s",
                           static_cast<long long>(step), size_, static_cast<long long>(a_.tokens),
                           static_cast<long long>(Tu), grad_rel, a_.max_grad_rel, cos, a_.min_update_cos, wmax,
                           ok ? "ok" : "FAILED"));
    return ok;
  }

 private:
  static int mpi_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
  }
  static int mpi_size() {
    int s = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    return s;
  }
  const Args& a_;
  Ctx ctx_;
  GradReduceKind kind_;
  int rank_, size_;
  std::unique_ptr<DrafterTrainer> tr_;
  int64_t K_ = 0, H_ = 0;
  int vocab_ = 0;
  std::vector<GradRange> params_;
  Batch batch_;
};

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  bench::Writer out("dflash-drafters-bench", argc, argv);
  const Args a = parse(argc, argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  out.set_enabled(rank == 0);  // rank 0 prints
  const int gpus = cuda_device_count();
  DF_CHECK(gpus > 0, DeviceFailure, "no CUDA device visible");
  // Every rank a drafter: the job's topology rules bind the GPUs and say whether NCCL can sum.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  TopologySpec all_drafters;
  MPI_Comm_size(node, &all_drafters.drafters_per_node);
  MPI_Comm_free(&node);
  Topology topo = create_topology(MPI_COMM_WORLD, all_drafters, Device::CUDA);
  const Ctx ctx = make_ctx(Device::CUDA, topo.gpu);
  const GradReduceKind kind = choose_grad_reducer(topo, ctx);
  Harness h(a, ctx, kind);
  const size_t P = h.params();
  int failures = 0;
  out.begin(bench::device_line(topo.gpu) + " (rank 0's)",
            bench::format("%d warm-up + %d timed steps per mode, wall clock from a barrier to the optimizer step's "
                          "end, median of each rank, slowest rank's", a.warmup, a.steps));
  out.meta("ranks", bench::format("%d drafter rank(s) on %d GPU(s), gradient sum by %s", size, std::min(size, gpus),
                                  grad_reduce_name(kind)));
  out.meta("drafter", bench::format("%d layers of %s, %zu trainable parameters (fp32 gradient %.2f GB); batch %lld "
                                    "tokens (sequences of %lld), %d anchors; buckets of %g MB",
                                    a.draft_layers, a.target.c_str(), P, P * 4 / 1e9, static_cast<long long>(a.tokens),
                                    static_cast<long long>(a.seq_len), a.anchors, a.bucket_mb));
  DrafterTrainer& tr = h.trainer();
  if (!same_weights_everywhere(tr)) {
    out.note("the ranks start from different weights: FAILED");
    ++failures;
  }
  int64_t step = 0;
  // 1. The summed step against one trainer over the union of the batches.
  if (a.union_check && size > 1) {
    auto red = h.reducer(a.bucket_mb);
    std::vector<float> w0(P), g;
    const Tensor w = tr.master_weights();
    std::memcpy(w0.data(), w.data, P * sizeof(float));
    h.load_batch(step);
    h.step(SumMode::Buckets, red.get(), &g);
    failures += h.union_check(step, w0, g, out) ? 0 : 1;
    failures += same_weights_everywhere(tr) ? 0 : 1;
    ++step;
  }
  // 2. Step times: the sum after the backward, the sum during it, no sum; weights compared after every
  // summed step (outside the timing).
  struct Row {
    SumMode mode;
    double ms = 0;
    size_t buckets = 0;
    int same = 0, checked = 0;
  };
  std::vector<Row> rows;
  for (SumMode mode : {SumMode::OneBucket, SumMode::Buckets, SumMode::None}) {  // None last: the ranks diverge
    if (mode != SumMode::None && size == 1) continue;
    std::unique_ptr<GradientReducer> red = mode == SumMode::None ? nullptr : h.reducer(mode == SumMode::OneBucket ? 0 : a.bucket_mb);
    Row row{mode};
    row.buckets = red ? red->buckets().size() : 0;
    std::vector<double> ms;
    for (int i = 0; i < a.warmup + a.steps; ++i, ++step) {
      h.load_batch(step);
      const double t = h.step(mode, red.get());
      if (i >= a.warmup) ms.push_back(t);
      if (mode != SumMode::None) {
        ++row.checked;
        row.same += same_weights_everywhere(tr) ? 1 : 0;
      }
    }
    // The slowest rank's median: the ranks wait for each other in the sum.
    row.ms = median(ms);
    mpi::allreduce(&row.ms, 1, MPI_MAX, MPI_COMM_WORLD);
    failures += row.checked - row.same;
    rows.push_back(row);
  }
  double alone_ms = 0;
  if (size > 1) {
    auto red = h.reducer(0);
    std::vector<double> ms;
    for (int i = 0; i < 2 + a.steps; ++i) {
      const double t = h.sum_alone(*red);
      if (i >= 2) ms.push_back(t);
    }
    alone_ms = median(ms);
    mpi::allreduce(&alone_ms, 1, MPI_MAX, MPI_COMM_WORLD);
  }
  double base = 0;
  for (const Row& r : rows)
    if (r.mode == SumMode::None) base = r.ms;
  using bench::num;
  using bench::text;
  out.meta("cases", "exposed_ms = a mode's step ms - no_sum's; same_weights = steps after which every rank's fp32 "
                    "master weights hashed the same; sum_alone: the whole gradient summed with nothing else running "
                    "(gb_per_s: algorithm bandwidth)");
  out.columns({text("case", 16), num("ranks", "", 0), num("buckets", "", 0), num("ms", "ms", 1, 8),
               num("exposed_ms", "ms", 1), num("gb_per_s", "GB/s", 1), text("same_weights", 12)});
  for (const Row& r : rows)
    out.row({mode_name(r.mode), size, r.buckets, r.ms,
             r.mode != SumMode::None && base > 0 ? bench::Cell(r.ms - base) : bench::none, bench::none,
             r.checked ? bench::format("%d/%d", r.same, r.checked) : std::string("-")});
  if (size > 1) out.row({"sum_alone", size, 1, alone_ms, bench::none, P * 4 / 1e6 / alone_ms, "-"});
  out.note(failures ? "FAILED" : "all checks passed");
  mpi::allreduce(&failures, 1, MPI_MAX, MPI_COMM_WORLD);
  free_topology(topo);
  MPI_Finalize();
  return failures ? 1 : 0;
}
