// The dry run's plan of the world and of each role's memory: src/runtime/dry_run_plan.h.
#include "dry_run_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/h5_util.h"
#include "dflash/backend.h"        // cuda_device_count, compute_dtype
#include "dflash/drafter_model.h"  // drafter_param_count
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/fp8.h"          // fp8::kBlock
#include "dflash/hs_wire.h"        // HsCodec::staging_bytes
#include "dflash/mpi_typed.h"
#include "dflash/nvml.h"
#include "core/cuda_entry.h"       // cuda::in_build
#include "drafter/loss_chunk.h"
#include "drafter/step_buffers.h"
#include "model/fp8_weights.h"  // fp8_gemm_scaling
#include "model/qwen35_config.h"
#include "plan/gpu_calibration.h"
#include "plan/layout_plan.h"  // memory_fit

namespace dflash {

std::string gib_text(double bytes) {
  char b[32];
  if (bytes >= double(1ull << 30)) std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1ull << 30));
  else std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1ull << 20));
  return b;
}

namespace {
std::string gib(double bytes) { return gib_text(bytes); }
// What the job needs that this build lacks, said beside the plan (the plan itself needs no CUDA).
const char* kNoCudaBuild = "; this build has no CUDA backend: the job needs one (DFLASH_CUDA=ON)";
}  // namespace

std::string rank_ranges(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(ranks[i]);
    if (j > i) s += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

std::vector<RankSlot> PlannedWorld::slots() const {
  std::vector<RankSlot> s;
  for (const PlannedSeat& seat : seats) s.push_back(RankSlot{seat.node, seat.local_rank});
  return s;
}

PlannedWorld planned_world(int nodes, int ranks_per_node, Device backend) {
  DF_ASSERT(nodes >= 1 && ranks_per_node >= 1);
  PlannedWorld w;
  w.source = WorldSource::Planned;
  w.num_nodes = nodes;
  w.ranks_per_node = ranks_per_node;
  for (int r = 0; r < nodes * ranks_per_node; ++r) {
    PlannedSeat s;
    s.node = r / ranks_per_node;
    s.local_rank = r % ranks_per_node;
    s.gpu = backend == Device::CUDA ? s.local_rank : -1;
    w.seats.push_back(s);
  }
  if (backend == Device::CUDA)
    w.device_note = std::string("planned: one GPU per rank, the node-local rank's (as the job binds them where a node "
                                "shows each rank all its GPUs)") + (cuda::in_build() ? "" : kNoCudaBuild);
  return w;
}

PlannedWorld mpi_world(MPI_Comm world, Device backend) {
  const std::vector<RankSlot> slots = gather_rank_slots(world);
  int rank = 0;
  DF_MPI(MPI_Comm_rank(world, &rank));
  struct Seat {
    int32_t gpu = -1, sees = 0;
    char host[64] = {0};
  } mine;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::snprintf(mine.host, sizeof(mine.host), "%s", host);
  if (backend == Device::CUDA) {
    // What create_topology binds, without its refusals: a dry run plans the GPU job anywhere (a login node
    // without a GPU, a build without CUDA) and says what it assumed.
    mine.sees = cuda::in_build() ? cuda_device_count() : 0;
    mine.gpu = bind_gpu(slots[static_cast<size_t>(rank)].local_rank);
  }
  std::vector<Seat> all(slots.size());
  mpi::allgather(&mine, 1, all.data(), world);
  PlannedWorld w;
  w.source = WorldSource::Mpi;
  int blind = 0;
  for (size_t r = 0; r < slots.size(); ++r) {
    PlannedSeat s;
    s.node = slots[r].node;
    s.local_rank = slots[r].local_rank;
    s.host = all[r].host;
    s.gpu = all[r].gpu;
    if (backend == Device::CUDA && all[r].sees == 0) ++blind;
    w.num_nodes = std::max(w.num_nodes, s.node + 1);
    w.seats.push_back(s);
  }
  w.ranks_per_node = static_cast<int>(w.seats.size()) / std::max(1, w.num_nodes);
  if (blind > 0)
    w.device_note = std::to_string(blind) + " rank(s) see no CUDA device: their GPU is assumed to be the node-local "
                    "rank's" + std::string(cuda::in_build() ? "" : kNoCudaBuild);
  return w;
}

// Bytes of the drafter step's block activations per anchor: the buffers of the step's one list
// (drafter/step_buffers.h, which the CUDA step allocates) that grow with --max-anchors, bf16 on CUDA; the
// CPU net keeps about the same tensors in float32. The term that decides whether a cap fits the GPU.
double drafter_bytes_per_anchor(const DrafterConfig& d, bool cuda) {
  return train::drafter_step_bytes_per_anchor(d, cuda ? 2 : 4);
}

double target_param_count(const TargetConfig& tc) { return target_params(tc).total; }

TargetParams target_params(const TargetConfig& tc) {
  const Qwen3Config& t = tc.text;
  const double H = t.hidden_size, I = t.intermediate_size, V = t.vocab_size, hd = t.head_dim;
  const double QD = double(t.num_attention_heads) * hd, KV = double(t.num_key_value_heads) * hd;
  const double mlp = 3 * H * I, norms = 2 * H;
  double layers = 0, fp8 = 0;
  // The largest linear as the forward runs it (fused: Qwen3's q|k|v, the MLP's gate|up; split: the hybrid's
  // query and gate halves of q_proj): the size of an Fp8Dequant target's one weight scratch.
  double largest = std::max(2 * I * H, H * I);
  for (int l = 0; l < t.num_hidden_layers; ++l) {
    const bool linear = tc.qwen35 && tc.qwen35->kinds.at(static_cast<size_t>(l)) == Qwen35LayerKind::LinearAttention;
    if (linear) {  // Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b/a, the conv, dt_bias, A_log, norm, out_proj
      const Qwen35Config& q = *tc.qwen35;
      const double K = double(q.linear_num_key_heads) * q.linear_key_head_dim,
                   Vd = double(q.linear_num_value_heads) * q.linear_value_head_dim, nv = q.linear_num_value_heads;
      layers += H * (2 * K + Vd) + H * Vd + 2 * H * nv + (2 * K + Vd) * q.linear_conv_kernel_dim + 2 * nv +
                q.linear_value_head_dim + Vd * H;
      fp8 += H * (2 * K + Vd) + H * Vd + Vd * H;  // in_proj_a/b stay bf16 (docs/fp8.md)
      largest = std::max({largest, H * (2 * K + Vd), H * Vd});
    } else {  // q (doubled by the output gate in the hybrid's attention), k, v, o, q/k norms
      layers += H * QD * (tc.qwen35 ? 2 : 1) + 2 * H * KV + QD * H + 2 * hd;
      fp8 += H * QD * (tc.qwen35 ? 2 : 1) + 2 * H * KV + QD * H;
      largest = std::max(largest, tc.qwen35 ? H * QD : H * (QD + 2 * KV));
    }
    layers += mlp + norms;
    fp8 += mlp;
  }
  return TargetParams{V * H * (t.tie_word_embeddings ? 1 : 2) + layers + H, fp8, largest};
}

TargetWeights target_weights(const Options& o, const TargetConfig& t) {
  namespace fs = std::filesystem;
  TargetWeights w;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o.target_dir, ec))
    if (e.path().extension() == ".safetensors") w.file_bytes += static_cast<double>(e.file_size(ec));
  if (w.file_bytes > 0) {
    w.source = gib(w.file_bytes) + " of safetensors";
  } else {
    // A login node may hold the index without the shards: its total_size is the weights' bytes.
    std::ifstream in(o.target_dir + "/model.safetensors.index.json");
    const nlohmann::json j = in ? nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
    if (j.is_object() && j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("total_size") &&
        j["metadata"]["total_size"].is_number()) {
      w.file_bytes = j["metadata"]["total_size"].get<double>();
      w.source = gib(w.file_bytes) + " by model.safetensors.index.json (no shards in " + o.target_dir + ")";
    } else {
      const double P = target_param_count(t);
      const double element = t.text.dtype_label == "float32" ? 4 : 2;  // as stored
      w.file_bytes = P * element;
      char p[32];
      std::snprintf(p, sizeof p, "%.2f B", P / 1e9);
      w.source = std::string("config.json's ") + p + " parameters x " + (element == 4 ? "4" : "2") +
                 " B (no safetensors in " + o.target_dir + ")";
    }
  }
  // The target holds its weights in the backend's compute dtype (bf16 on CUDA, float32 on the CPU), whatever
  // the checkpoint's (config.json's dtype label; bf16 when it has none).
  const double element = static_cast<double>(dtype_size(compute_dtype(o.backend)));
  if (t.quant.precision != TargetPrecision::Fp8) {
    const double stored = t.text.dtype_label == "float32" ? 4 : 2;
    w.bytes = w.file_bytes / stored * element;
    return w;
  }
  // An FP8 target (docs/fp8.md "How a target's FP8 linears run"): counted from config.json (an FP8
  // checkpoint's files mix 1- and 2-byte tensors). On every CUDA GPU its linears stay e4m3 codes (1 byte)
  // plus a float32 scale per output row per 128 input channels (the scale layout every format this build
  // loads has but blocks of another width, which run dequantized at load); where the kind has no FP8 GEMM
  // for the format (the sm_90 kinds have both: the block-scaled one for activations in groups of 128, the
  // per-token one for per-token activations over channel scales; per-token activations over block scales
  // have none), each linear is dequantized per call into one scratch of the largest linear in the compute
  // dtype. The CPU backend dequantizes the weights at load.
  const TargetParams p = target_params(t);
  const bool codes = o.backend == Device::CUDA && t.quant.scales_per_128_channels();
  if (!codes) {
    w.bytes = p.total * element;
    w.source += std::string("; FP8 linears dequantized to ") + dtype_name(compute_dtype(o.backend)) +
                (o.backend == Device::CUDA ? " (their scales are not per 128 input channels)"
                                           : " (the CPU backend's emulation)");
    return w;
  }
  const std::optional<ops::Fp8Scaling> scaling = fp8_gemm_scaling(t.quant);
  const bool gemm = fp8_gemm_gpu(o) && scaling.has_value();
  const double stored = p.fp8_linear * (1.0 + 4.0 / 128), scratch = gemm ? 0.0 : p.fp8_largest_linear * element;
  w.bytes = (p.total - p.fp8_linear) * element + stored + scratch;
  w.source += "; FP8 linears as e4m3 codes + scales (" + gib(stored) +
              (gemm ? (*scaling == ops::Fp8Scaling::TokenChannel ? ": the per-token FP8 GEMM of this GPU kind)"
                                                                  : ": the block-scaled FP8 GEMM of this GPU kind)")
                    : ", dequantized per GEMM into one " + std::string(dtype_name(compute_dtype(o.backend))) +
                          " scratch of the largest linear, " + gib(scratch) + ")");
  return w;
}

bool fp8_gemm_gpu(const Options& o) {
  if (!o.plan_gpu.empty()) {
    const PlannedGpu g = parse_planned_gpu(o.plan_gpu);
    return plan::has_fp8_block_gemm(plan::calibration_for(g.model.empty() ? o.plan_gpu : g.name));
  }
  const PlannedGpu g = gpu_to_check(o);
  return g.bytes > 0 && plan::has_fp8_block_gemm(plan::calibration_for_memory(g.bytes));
}

// The fixed memory of each role: what is allocated once at startup, sized by the model, --token-budget,
// --max-anchors and the queue depths, the drafter's block activations included (drafter_bytes_per_anchor);
// the target's layer activations, the drafter's context-side (per token) tensors and library workspaces
// come on top. From config.json and the sizes of the checkpoint's files only: nothing is loaded.
RoleMemory plan_role_memory(const Options& o, const ModelPlan& plan) {
  const Qwen3Config& t = plan.target.text;
  const bool cuda = o.backend == Device::CUDA;
  const double act = static_cast<double>(dtype_size(plan.slot_shape.dtype));  // per activation / weight element
  const TargetWeights tw = target_weights(o, plan.target);
  const double weights = tw.bytes;
  // One batch as it travels (features + final norm; --hs-dtype fp8: e4m3 codes + a scale per row), and with
  // fp8 the backend-dtype batch each end quantizes from or dequantizes into (hs_wire.h).
  const SlotShape& shape = plan.slot_shape;
  const double batch = static_cast<double>(shape.slot_bytes());
  const double staging = static_cast<double>(HsCodec::staging_bytes(shape));
  RoleMemory m;
  m.target = weights + 2 * batch + staging;  // two send buffers: the next forward fills one while one moves
  const DrafterConfig& d = plan.drafter;
  const double P = static_cast<double>(drafter_param_count(d));
  // Weights, gradients and AdamW m and v as --optimizer-state keeps them on this backend (fp32 masters +
  // the CUDA step's bf16 copy, or bf16 weights and moments; optimizer_state_bytes_per_param), frozen
  // embedding + lm_head
  const int state_bytes = optimizer_state_bytes_per_param(o.train.optimizer_state, o.backend);
  const double state = P * state_bytes, frozen = 2.0 * t.vocab_size * t.hidden_size * act;
  const double slots = o.hs_queue_depth * batch;
  // The lm_head loss's float32 logits workspace: a chunk of rows, twice (the KL teacher's half is kept either
  // way), sized by the same rule as the trainer (drafter/loss_chunk.h).
  const int64_t loss_rows = train::loss_chunk_rows(o.backend, t.vocab_size,
                                                   static_cast<int64_t>(o.train.max_anchors) * (d.block_size - 1));
  const double loss_ws = 2.0 * static_cast<double>(loss_rows) * t.vocab_size * 4;
  const double blocks = static_cast<double>(o.train.max_anchors) * drafter_bytes_per_anchor(d, cuda);
  // --eval-tau-every: each drafter rank also holds a copy of the target's weights (src/runtime/drafter_tau.h)
  const double tau_target = o.eval_tau_every > 0 && !o.eval_data.empty() ? weights : 0.0;
  // --grad-accum K > 1: the accumulator, P fp32 (--global-batch-tokens under --topology auto: K is not known
  // before the job measures its split, so it is counted)
  const double accum = o.grad_accum > 1 || o.global_batch_tokens > 0 ? P * 4 : 0;
  // --eval-data on CUDA: one device buffer of an eval batch's features, uploaded from the host at each
  // evaluation (src/runtime/drafter_eval.cpp); the kept features themselves are in host memory.
  const double eval_buffer = cuda && !o.eval_data.empty() ? static_cast<double>(shape.value_bytes(o.token_budget)) : 0.0;
  m.drafter = state + frozen + slots + staging + loss_ws + blocks + accum + tau_target + eval_buffer;
  m.drafter_bf16_saving = P * (state_bytes - optimizer_state_bytes_per_param(OptimizerState::Bf16, o.backend));
  std::ostringstream os;
  os << "[dflash] memory per rank, fixed part (" << (cuda ? "bf16 on the GPU" : "float32 in host memory")
     << "; the target's activations come on top): target " << gib(m.target) << " (weights " << gib(weights) << " from "
     << tw.source << ", 2 send buffers of " << gib(batch) << " (" << shape.wire_name() << " on the wire)"
     << (staging > 0 ? ", the fp8 wire's quantize staging " + gib(staging) : std::string()) << "); drafter " << gib(m.drafter) << " ("
     << static_cast<long long>(P) << " parameters x " << state_bytes << " B of state"
     << (o.train.optimizer_state == OptimizerState::Bf16 ? " (--optimizer-state bf16)" : "") << " " << gib(state)
     << ", frozen embedding + lm_head " << gib(frozen) << ", " << o.hs_queue_depth << " slots " << gib(slots)
     << (staging > 0 ? ", the fp8 wire's dequantize staging " + gib(staging) : std::string())
     << ", loss logits for " << loss_rows << " rows " << gib(loss_ws) << ", block activations for --max-anchors "
     << o.train.max_anchors << " x " << d.block_size << " rows " << gib(blocks) << " = "
     << gib(drafter_bytes_per_anchor(d, cuda)) << " per anchor"
     << (accum > 0 ? ", gradient accumulator " + gib(accum) : std::string())
     << (eval_buffer > 0 ? ", an eval batch's buffer " + gib(eval_buffer) : std::string())
     << (tau_target > 0 ? ", the target's weights for --eval-tau-every " + gib(tau_target) : std::string()) << ")";
  m.line = os.str();
  return m;
}

MemoryVerdict check_memory(const Options& o, const PlannedGpu& gpu, const RoleMemory& memory,
                           const std::vector<int>& target_ranks, const std::vector<int>& drafter_ranks, Layout layout) {
  MemoryVerdict v;
  if (o.backend != Device::CUDA) {
    v.line = "[dflash] memory check: none (--backend cpu: host memory)";
    return v;
  }
  if (gpu.bytes <= 0) {
    v.line = "[dflash] memory check: none (no --gpu, and NVML sees no GPU here): give --gpu h100|h200|b200|rtx-pro-6000 "
             "or its memory in GiB to check each rank against it";
    return v;
  }
  const std::string label = !o.plan_gpu.empty() && !gpu.model.empty()
                                ? "--gpu " + o.plan_gpu + " (" + gpu.model + ", " + gib(gpu.bytes) + " as its driver reports it)"
                                : o.plan_gpu.empty() ? gpu.name : "--gpu " + o.plan_gpu + " (" + gib(gpu.bytes) + ")";
  std::ostringstream line, what;
  line << "[dflash] memory check against " << label << ":";
  const bool roles_known = !target_ranks.empty();
  struct RoleCheck {
    const char* name;
    double need;
    const std::vector<int>* ranks;
  };
  const bool colocated = layout == Layout::Colocated;
  std::vector<RoleCheck> checks = {{"target", memory.target, &target_ranks}, {"drafter", memory.drafter, &drafter_ranks}};
  if (colocated) checks = {{"colocated", memory.colocated(), &target_ranks}};
  bool target_misfit = false, drafter_misfit = false;
  for (const RoleCheck& c : checks) {
    const std::string who = roles_known ? std::string(c.name) + " rank(s) " + rank_ranges(*c.ranks)
                                        : std::string("a ") + c.name + " rank";
    line << (&c == &checks.front() ? " " : "; ") << who << ": " << gib(c.need) << " fixed";
    if (c.need <= gpu.bytes) {
      line << ", " << gib(gpu.bytes - c.need) << " left for the activations";
      continue;
    }
    line << ": does NOT fit";
    if (colocated) target_misfit = drafter_misfit = true;  // either part may give way
    else (c.name[0] == 't' ? target_misfit : drafter_misfit) = true;
    if (!v.what.empty()) what << "; ";
    what << who << " need " << gib(c.need) << " of fixed memory, more than the GPU's " << gib(gpu.bytes);
    v.what = what.str();
  }
  if (target_misfit || drafter_misfit) {
    v.fits = false;
    v.what = "the plan does not fit " + label + ": " + v.what;
    std::string hint;
    if (drafter_misfit) {
      // The cheapest fix where it is enough: the bf16 optimizer state (docs/pipeline.md "Optimizer state").
      const double bf16 = (colocated ? memory.colocated() : memory.drafter) - memory.drafter_bf16_saving;
      if (memory.drafter_bf16_saving > 0 && bf16 <= gpu.bytes)
        hint = "the drafter: --optimizer-state bf16 makes it fit (" + gib(bf16) + " fixed, " +
               gib(memory.drafter_bf16_saving) + " less); or ";
      else
        hint = "the drafter: ";
      hint += "lower --max-anchors (its block activations grow with it) or --hs-queue-depth / --token-budget "
              "(its slots)";
    }
    if (target_misfit && !colocated)
      hint += std::string(hint.empty() ? "" : "; ") +
              "the target: its weights alone need a GPU with more memory (or a smaller --token-budget for its send buffers)";
    if (colocated) hint += "; or a split (--topology T-D): a colocated rank holds the target's weights and the drafter both";
    v.hint = hint + "; or plan for a larger GPU (--gpu)";
  }
  v.line = line.str();
  return v;
}

PlannedGpu gpu_to_check(const Options& o) {
  if (!o.plan_gpu.empty()) return parse_planned_gpu(o.plan_gpu);
  if (o.backend != Device::CUDA) return PlannedGpu{};
  // This node's GPU 0, through NVML only (dlopen'd; no CUDA context, works in a CPU-only build).
  const std::unique_ptr<PowerSampler> nvml = PowerSampler::for_rank(Device::CUDA, 0);
  const GpuReading r = nvml->available() ? nvml->sample() : GpuReading{};
  if (!r.valid || r.mem_total_mib <= 0) return PlannedGpu{};
  char name[64];
  std::snprintf(name, sizeof name, "this node's GPU 0 (NVML: %.0f MiB)", static_cast<double>(r.mem_total_mib));
  return PlannedGpu{name, "", static_cast<double>(r.mem_total_mib) * 1048576.0};
}

ColocatedFitCheck check_colocated_fit(const Options& o, const ModelPlan& plan) {
  ColocatedFitCheck c;
  if (o.backend != Device::CUDA) {
    c.why = "host memory (--backend cpu): not checked";
    return c;
  }
  const PlannedGpu gpu = gpu_to_check(o);
  if (gpu.bytes <= 0) {
    c.why = "no GPU size known (NVML sees no GPU here)";
    return c;
  }
  const double need = plan_role_memory(o, plan).colocated();
  // The layout plan's rule (its colocated row gets the same bytes: layout_plan_inputs.cpp).
  c.fit = plan::memory_fit(need, gpu.bytes) == plan::MemoryFit::Fits ? ColocatedFit::Fits : ColocatedFit::DoesNotFit;
  c.why = gib(need) + " fixed (target + drafter) " + (c.fit == ColocatedFit::Fits ? "within" : "over") + " the GPU's " +
          gib(gpu.bytes);
  return c;
}

// Records and tokens of --data from the shapes of /offsets and /tokens (no data read); {-1, -1} when the
// file does not have them (the job itself reports what is wrong with it).
std::pair<int64_t, int64_t> dataset_shape(const std::string& path) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  h5::quiet_errors();
  h5::Handle fapl(h5::fapl_no_locking(), h5::Handle::Kind::PropList);
  h5::Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), h5::Handle::Kind::File);
  if (!file.valid() || !h5::link_exists(file, "tokens") || !h5::link_exists(file, "offsets")) return {-1, -1};
  h5::Handle tokens(H5Dopen2(file, "tokens", H5P_DEFAULT), h5::Handle::Kind::Dataset);
  h5::Handle offsets(H5Dopen2(file, "offsets", H5P_DEFAULT), h5::Handle::Kind::Dataset);
  if (!tokens.valid() || !offsets.valid()) return {-1, -1};
  const std::vector<hsize_t> t = h5::dims(tokens), o = h5::dims(offsets);
  if (t.size() != 1 || o.size() != 1 || o[0] < 1) return {-1, -1};
  return {static_cast<int64_t>(o[0]) - 1, static_cast<int64_t>(t[0])};
}

}  // namespace dflash
