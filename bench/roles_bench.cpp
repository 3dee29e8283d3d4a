// Times the job's own two roles on the job's own batches, one after the other on one GPU: the target
// forward (make_target_model, the checkpoint --target names) and the drafter's step (DrafterTrainer:
// forward + backward, then the optimizer step), over the batches the job's loader packs from --data. The
// cost model's calibration (src/plan/) comes from the kernel drivers (bench_target_forward, drafter_bench)
// on fixed shapes; this driver is what lies between them and a job (docs/cost_model.md, "Learning from a
// run"): each batch is timed twice in a row, so a first-time cost of its shape (a cuDNN graph, a cuBLASLt
// heuristic, a scratch growth) shows as first - again, and the roles' medians set beside the kernels'.
//
//   dflash-roles-bench [--batches N] [--target-ctx main|colocated] -- DFLASH-TRAIN OPTIONS
//   e.g. dflash-roles-bench --batches 12 -- --backend cuda --target T --data D --token-budget 16384
//        --max-anchors 512 --draft-layers 5 --loss ce
//
// The options after `--` are dflash-train's (parse_options): the same target, data, budget, anchors and
// drafter recipe a job would run. --target-ctx colocated runs the target on the second context a colocated
// rank's target uses (include/dflash/backend.h colocated_target_ctx), as --topology auto's measurement does.
// Wall clock around each role with the device synchronized after it (what the job's roles wait for), no
// MPI: one process, the GPU alone.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/data.h"
#include "dflash/drafter.h"
#include "dflash/error.h"
#include "dflash/hs_batch.h"
#include "dflash/options.h"
#include "dflash/target.h"
#include "bench_common.h"
#include "runtime/run_plan.h"

using namespace dflash;

namespace {

enum class TargetCtx { Main, Colocated };

struct Args {
  int batches = 12;
  TargetCtx target_ctx = TargetCtx::Main;
  std::vector<const char*> train_argv{"dflash-train"};
};

Args parse(int argc, char** argv) {
  Args a;
  int i = 1;
  for (; i < argc && std::strcmp(argv[i], "--") != 0; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      DF_CHECK(i + 1 < argc, BadOptions, "dflash-roles-bench: " << k << " needs a value");
      return argv[++i];
    };
    if (k == "--batches") a.batches = std::stoi(value());
    else if (k == "--target-ctx") {
      const std::string v = value();
      DF_CHECK(v == "main" || v == "colocated", BadOptions, "--target-ctx main|colocated, not " << v);
      a.target_ctx = v == "main" ? TargetCtx::Main : TargetCtx::Colocated;
    } else {
      DF_FAIL(BadOptions, "dflash-roles-bench: unknown option " << k, "usage: dflash-roles-bench [--batches N] [--target-ctx main|colocated] -- DFLASH-TRAIN OPTIONS");
    }
  }
  DF_CHECK(a.batches >= 1, BadOptions, "--batches must be >= 1");
  for (++i; i < argc; ++i) a.train_argv.push_back(argv[i]);
  return a;
}

double seconds_of(const std::function<void()>& f, const Ctx& ctx) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  synchronize(ctx);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int64_t longest_record(const PackedBatch& b) {
  int64_t m = 0;
  for (size_t s = 1; s < b.cu_seqlens.size(); ++s) m = std::max<int64_t>(m, b.cu_seqlens[s] - b.cu_seqlens[s - 1]);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  bench::Writer out("dflash-roles-bench", argc, argv);
  const Args a = parse(argc, argv);
  const ParseResult pr = parse_options(static_cast<int>(a.train_argv.size()), a.train_argv.data());
  const Options& o = pr.options;
  check_input_paths(o);
  const ModelPlan plan = plan_job(o);
  set_deterministic_kernels(o.deterministic);
  const Ctx ctx = make_ctx(o.backend, 0);
  const Ctx target_ctx = a.target_ctx == TargetCtx::Main ? ctx : colocated_target_ctx(o.backend, 0);

  auto dataset = std::make_shared<DatasetMix>(o.data, o.train.seed, plan.target.text.vocab_size);
  LoaderOptions lo = plan.loader;
  lo.max_epochs = 0;  // epochs repeat: a small dataset still gives the batches asked for
  Loader loader(dataset, lo);
  std::vector<std::unique_ptr<HsBatch>> batches;
  for (int i = 0; i < a.batches; ++i) {
    LoadedBatch lb;
    DF_CHECK(loader.pop(lb, std::chrono::seconds(60)) == PopResult::Batch, BadInput, "no batch from " << o.data.front().path);
    batches.push_back(std::make_unique<HsBatch>(plan.slot_shape));
    batches.back()->fill_from(lb.batch);
  }
  loader.stop();

  out.begin(o.backend == Device::CUDA ? bench::device_line(0) : std::string("CPU backend"),
            "wall clock around each role, the device synchronized after it; each batch twice in a row (first, again)");
  out.meta("job", bench::format("target %s, %zu captured layers, %lld-token budget, %d batches; drafter %d layers, "
                                "loss %s, max anchors %d; target on the %s context",
                                o.target_dir.c_str(), plan.capture_layers.size(), static_cast<long long>(o.token_budget),
                                a.batches, plan.drafter.layers.num_hidden_layers,
                                o.train.loss == LossKind::KL ? "kl" : "ce", o.train.max_anchors,
                                a.target_ctx == TargetCtx::Main ? "main" : "colocated target's"));

  std::vector<double> t_first(a.batches), t_again(a.batches), d_first(a.batches), d_again(a.batches),
      fb_again(a.batches);
  {
    std::unique_ptr<TargetModel> model =
        make_target_model(plan.target, o.target_dir, target_ctx, plan.capture_layers, o.token_budget);
    for (int i = 0; i < a.batches; ++i) {
      HsBatch& b = *batches[static_cast<size_t>(i)];
      CaptureOut co;
      co.features = b.features_view();
      co.final_norm = b.final_norm_view();
      t_first[i] = seconds_of([&] { model->forward(b.batch, co); }, target_ctx);
      t_again[i] = seconds_of([&] { model->forward(b.batch, co); }, target_ctx);
    }
  }  // the target's weights are released before the drafter is built, as the measurement does
  {
    DrafterTrainer trainer(plan.drafter_source(o), o.train, ctx, o.token_budget);
    for (int i = 0; i < a.batches; ++i) {
      const HsBatch& b = *batches[static_cast<size_t>(i)];
      FeatureBatch fb;
      fb.batch = &b.batch;
      fb.features = b.features_view();
      fb.final_norm = b.final_norm_view();
      d_first[i] = seconds_of([&] { trainer.forward_backward(fb); trainer.optimizer_step(); }, ctx);
      fb_again[i] = seconds_of([&] { trainer.forward_backward(fb); }, ctx);
      d_again[i] = fb_again[i] + seconds_of([&] { trainer.optimizer_step(); }, ctx);
    }
  }

  out.columns({bench::num("batch", "", 0, 5), bench::num("tokens", "", 0, 7), bench::num("records", "", 0, 7),
               bench::num("longest", "", 0, 7), bench::num("target_first", "ms", 1, 12),
               bench::num("target_again", "ms", 1, 12), bench::num("drafter_first", "ms", 1, 13),
               bench::num("drafter_again", "ms", 1, 13), bench::num("fwd_bwd_again", "ms", 1, 13)});
  for (int i = 0; i < a.batches; ++i) {
    const PackedBatch& pb = batches[static_cast<size_t>(i)]->batch;
    out.row({static_cast<double>(i), static_cast<double>(pb.num_tokens()),
             static_cast<double>(pb.cu_seqlens.size() - 1), static_cast<double>(longest_record(pb)),
             t_first[i] * 1e3, t_again[i] * 1e3, d_first[i] * 1e3, d_again[i] * 1e3, fb_again[i] * 1e3});
  }
  // The medians past the first batch (the first carries the process's own warm-up).
  auto med = [&](const std::vector<double>& v) {
    return bench::median(std::vector<double>(v.begin() + (v.size() > 1 ? 1 : 0), v.end())) * 1e3;
  };
  out.note(bench::format("median over batches 1..%d: target %.1f ms first, %.1f ms again; drafter %.1f ms first, "
                         "%.1f ms again (forward+backward %.1f ms)",
                         a.batches - 1, med(t_first), med(t_again), med(d_first), med(d_again), med(fb_again)));
  return 0;
}
