// dflash-make-random: writes a random-weight Qwen3 target at a real model's shape (HF layout: config.json +
// BF16 safetensors shards + index) and a dataset of uniform random tokens, for benchmarks: the numbers a
// model of that shape costs, not anything learnable. A dense Qwen3 (qwen3-8b, qwen3-0.6b, tiny) or a
// Qwen3.5/3.6 hybrid (qwen36-27b, tiny-hybrid: Qwen3_5ForCausalLM, Gated DeltaNet layers with every 4th layer
// gated full attention; --layers 16 of the 27B is every per-layer shape of it at a quarter of the disk).
//
//   dflash-make-random OUTDIR --preset qwen3-8b|qwen3-0.6b|tiny|qwen36-27b|tiny-hybrid [--hidden H --layers L
//                      --heads N --kv-heads N --head-dim D --intermediate I --vocab V] [--gdn-key-heads N
//                      --gdn-value-heads N --gdn-head-dim D --conv-kernel K (hybrid presets)] [--seed S]
//                      [--records R] [--min-len A] [--max-len B] [--shard-gb 4] [--threads N]
//   -> OUTDIR/target/{config.json, model-0000i-of-0000n.safetensors, model.safetensors.index.json}
//      OUTDIR/data.h5
//
// Weights are BF16, written straight from a counter-based generator (splitmix64 of the element index, so
// threads fill disjoint ranges and the bytes do not depend on --threads); memory is one shard of BF16
// (--shard-gb) at a time, so the 8B shape needs ~4 GB of RAM. The tensors and their scales are
// dflash-make-tiny's (make_target_common.h's target_tensors; uniform instead of Gaussian, same std):
// embeddings 1, projections 1/sqrt(fan_in), o_proj / out_proj 0.3x and down_proj 0.5x of that, norms
// 1 +- 0.1 (model.norm included; the hybrid's stored zero-centred, as 0 +- 0.1), the hybrid's A_log and
// dt_bias as HF initialises them: a forward over many layers stays finite.
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/clock.h"
#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"
#include "dflash/safetensors.h"
#include "dflash/tensor.h"
#include "make_target_common.h"

using namespace dflash;

namespace {

const char* kUsage =
    "usage: dflash-make-random OUTDIR --preset qwen3-8b|qwen3-0.6b|tiny|qwen36-27b|tiny-hybrid\n"
    "         [--hidden H] [--layers L] [--heads N] [--kv-heads N] [--head-dim D] [--intermediate I] [--vocab V]\n"
    "         [--gdn-key-heads N] [--gdn-value-heads N] [--gdn-head-dim D] [--conv-kernel K] (hybrid presets)\n"
    "         [--seed S] [--records R (2000)] [--min-len A (512)] [--max-len B (4096)] [--shard-gb G (4)]\n"
    "         [--threads N (all cores)]\n"
    "       dflash-make-random --help | --version\n"
    "  Writes OUTDIR/target (random BF16 checkpoint at the preset's shape; explicit shape flags override\n"
    "  the preset) and OUTDIR/data.h5 (R records of uniform random tokens, lengths uniform in [A, B],\n"
    "  loss_mask 0 on the first 16 tokens of each record).\n"
    "  presets (dense Qwen3, Qwen3ForCausalLM):\n"
    "    qwen3-8b    vocab 151936, hidden 4096, 36 layers, 32/8 heads x 128, intermediate 12288, untied\n"
    "    qwen3-0.6b  vocab 151936, hidden 1024, 28 layers, 16/8 heads x 128, intermediate 3072, tied\n"
    "    tiny        vocab 512, hidden 64, 4 layers, 4/2 heads x 32, intermediate 192, untied\n"
    "  presets (Qwen3.5/3.6 hybrid, Qwen3_5ForCausalLM: Gated DeltaNet layers, every 4th layer gated full\n"
    "  attention with partial rotary 1/4 of head_dim; --layers L keeps the pattern: 16 = 12 GDN + 4 attention):\n"
    "    qwen36-27b  Qwen3.6-27B: vocab 248320, hidden 5120, 64 layers (48 GDN + 16 attention), attention\n"
    "                24/4 heads x 256, GDN 16 key / 48 value heads x 128, conv 4, intermediate 17408, untied\n"
    "    tiny-hybrid dflash-make-tiny --hybrid's shape: vocab 512, hidden 64, 4 layers (3 GDN + 1 attention),\n"
    "                attention 4/2 heads x 32, GDN 2 key / 4 value heads x 16, conv 4, intermediate 192, untied\n";

constexpr int kPromptTokens = 16;  // loss_mask 0 at the start of every record

struct Spec : Qwen3Shape {  // the shape from --preset, then the shape flags
  Spec() { max_position_embeddings = 40960; }
  std::string preset;
  uint64_t seed = 1;
  int records = 2000, min_len = 512, max_len = 4096;
  double shard_gb = 4;
  int threads = 0;
};

void apply_preset(Spec& s) {
  if (s.preset == "qwen3-8b") {
    s.vocab = 151936, s.hidden = 4096, s.layers = 36, s.heads = 32, s.kv_heads = 8, s.head_dim = 128;
    s.intermediate = 12288, s.max_position_embeddings = 40960, s.tied = false;
  } else if (s.preset == "qwen3-0.6b") {
    s.vocab = 151936, s.hidden = 1024, s.layers = 28, s.heads = 16, s.kv_heads = 8, s.head_dim = 128;
    s.intermediate = 3072, s.max_position_embeddings = 40960, s.tied = true;
  } else if (s.preset == "tiny") {  // dflash-make-tiny's defaults
    s.vocab = 512, s.hidden = 64, s.layers = 4, s.heads = 4, s.kv_heads = 2, s.head_dim = 32;
    s.intermediate = 192, s.max_position_embeddings = 4096, s.tied = false;
  } else if (s.preset == "qwen36-27b") {  // the text model of Qwen3.6-27B (bench_hybrid_forward --model 27b)
    s.vocab = 248320, s.hidden = 5120, s.layers = 64, s.heads = 24, s.kv_heads = 4, s.head_dim = 256;
    s.intermediate = 17408, s.max_position_embeddings = 262144, s.tied = false;
    s.hybrid = true, s.gdn_key_heads = 16, s.gdn_value_heads = 48, s.gdn_head_dim = 128, s.conv_kernel = 4;
  } else if (s.preset == "tiny-hybrid") {  // dflash-make-tiny --hybrid's defaults
    s.vocab = 512, s.hidden = 64, s.layers = 4, s.heads = 4, s.kv_heads = 2, s.head_dim = 32;
    s.intermediate = 192, s.max_position_embeddings = 4096, s.tied = false;
    s.hybrid = true, s.gdn_key_heads = 2, s.gdn_value_heads = 4, s.gdn_head_dim = 16, s.conv_kernel = 4;
  } else {
    DF_FAIL(BadOptions,
            "--preset must be qwen3-8b, qwen3-0.6b, tiny, qwen36-27b or tiny-hybrid, got '" << s.preset << "'",
            kUsage);
  }
}

// ---- the generator -----------------------------------------------------------------------------------

inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Round to nearest even; the values here are finite and small.
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// A sequential generator for the dataset (same bytes for a seed on every machine).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(splitmix64(seed ^ 0xDA7A5EEDull)) {}
  uint64_t next() { return splitmix64(s += 0x9E3779B97F4A7C15ull); }
  int below(int n) { return static_cast<int>(((next() >> 32) * static_cast<uint64_t>(n)) >> 32); }
};

// One tensor of the checkpoint: element i = center + half_width * u(key, i), u uniform in [-1, 1) (Normal
// and NearOne: the same std as dflash-make-tiny's Gaussian); the GDN's A_log and dt_bias map u's [0, 1)
// through HF's initialisation instead.
struct WeightSpec {
  std::string name;
  std::vector<int64_t> shape;
  TensorInit init = TensorInit::Normal;
  double center = 0, half_width = 0;
  uint64_t key = 0;
  uint64_t numel() const {
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};

void fill(const WeightSpec& w, uint64_t from, uint64_t to, uint16_t* dst) {
  const float c = static_cast<float>(w.center), a = static_cast<float>(w.half_width);
  const auto u = [&w](uint64_t i) {  // [-1, 1)
    const uint64_t r = splitmix64(w.key + i * 0x9E3779B97F4A7C15ull);
    return static_cast<float>(static_cast<int32_t>(r >> 32)) * (1.0f / 2147483648.0f);
  };
  if (w.init == TensorInit::ALog || w.init == TensorInit::DtBias) {  // [nv] each: a few values
    for (uint64_t i = from; i < to; ++i) {
      const double u01 = 0.5 * (u(i) + 1.0);
      dst[i - from] = to_bf16(static_cast<float>(w.init == TensorInit::ALog ? gdn_a_log(u01) : gdn_dt_bias(u01)));
    }
    return;
  }
  for (uint64_t i = from; i < to; ++i) dst[i - from] = to_bf16(c + a * u(i));
}

std::vector<WeightSpec> make_weight_specs(const Spec& s) {
  const double sqrt3 = std::sqrt(3.0);  // uniform [-a, a] has std a / sqrt(3)
  std::vector<WeightSpec> w;
  for (const TargetTensor& t : target_tensors(s)) {
    WeightSpec x{t.name, t.shape, t.init, 0.0, 0.0, 0};
    if (t.init == TensorInit::Normal) x.half_width = t.scale * sqrt3;
    if (t.init == TensorInit::NearOne) {  // scale x (1 + 0.1 N), minus one when zero-centred
      x.center = t.zero_centred ? t.scale - 1.0 : t.scale;
      x.half_width = t.scale * (0.1 * sqrt3);
    }
    w.push_back(std::move(x));
  }
  for (size_t i = 0; i < w.size(); ++i) w[i].key = splitmix64(splitmix64(s.seed) ^ (0xC0FFEEull + i));
  return w;
}

nlohmann::ordered_json make_config(const Spec& s) {
  nlohmann::ordered_json c = target_config_json(s);
  c["torch_dtype"] = "bfloat16";
  c["dflash_random"] = {{"seed", s.seed}, {"preset", s.preset}, {"generator", "dflash-make-random"}};
  return c;
}

// Writes the shards one at a time: fill one BF16 buffer (all threads over the shard's elements), write it.
uint64_t write_target(const std::string& dir, const Spec& s, std::chrono::steady_clock::time_point t0) {
  write_file_atomic(dir + "/config.json", make_config(s).dump(2) + "\n");
  const std::vector<WeightSpec> w = make_weight_specs(s);
  uint64_t total_bytes = 0;
  for (const WeightSpec& t : w) total_bytes += t.numel() * 2;

  // Greedy shards of at most shard_bytes (a tensor larger than that gets a shard of its own).
  const uint64_t shard_bytes = static_cast<uint64_t>(std::max(1.0, s.shard_gb * 1e9));
  std::vector<std::pair<size_t, size_t>> shards;  // [begin, end) into w
  uint64_t max_shard = 0;
  for (size_t i = 0, cur = 0; i < w.size(); ++i) {
    const uint64_t b = w[i].numel() * 2;
    if (shards.empty() || (cur > 0 && cur + b > shard_bytes)) {
      shards.push_back({i, i});
      cur = 0;
    }
    shards.back().second = i + 1;
    cur += b;
    max_shard = std::max<uint64_t>(max_shard, cur);
  }

  struct statvfs fs {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    DF_CHECK_HINT(free_bytes >= total_bytes, SystemFailure,
                  dir << ": " << free_bytes / 1e9 << " GB free, the checkpoint needs " << total_bytes / 1e9 << " GB",
                  "free disk space or write somewhere else");
  }
  std::printf("dflash-make-random: %zu tensors, %.2f GB of BF16 in %zu shards (largest %.2f GB, held in RAM), "
              "%d threads\n",
              w.size(), total_bytes / 1e9, shards.size(), max_shard / 1e9, s.threads);
  std::fflush(stdout);

  // Not value-initialised: the fill threads touch (and fault in) the pages in parallel.
  std::unique_ptr<uint16_t[]> buf(new uint16_t[static_cast<size_t>(max_shard / 2)]);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t written = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    const auto [b, e] = shards[k];
    std::vector<uint64_t> start(e - b + 1, 0);  // element offset of each tensor in the shard
    for (size_t i = b; i < e; ++i) start[i - b + 1] = start[i - b] + w[i].numel();
    const uint64_t n = start.back();
    const auto tf = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < s.threads; ++t) {
      pool.emplace_back([&, t] {
        const uint64_t lo = n * t / s.threads, hi = n * (t + 1) / s.threads;
        for (size_t i = b; i < e; ++i) {
          const uint64_t ts = start[i - b], te = start[i - b + 1];
          const uint64_t f = std::max(lo, ts), g = std::min(hi, te);
          if (f < g) fill(w[i], f - ts, g - ts, buf.get() + f);
        }
      });
    }
    for (std::thread& th : pool) th.join();
    const double fill_s = seconds_since(tf);
    std::vector<TensorToWrite> part;
    for (size_t i = b; i < e; ++i) {
      part.push_back(TensorToWrite{w[i].name, DType::BF16, w[i].shape, nullptr, buf.get() + start[i - b]});
      weight_map[w[i].name] = name;
    }
    const auto tw = std::chrono::steady_clock::now();
    write_safetensors(dir + "/" + name, part, {{"format", "pt"}});
    written += n * 2;
    std::printf("  %s: tensors %zu/%zu, %.2f/%.2f GB written (fill %.1f s, write %.1f s; %.1f s total)\n", name, e,
                w.size(), written / 1e9, total_bytes / 1e9, fill_s, seconds_since(tw), seconds_since(t0));
    std::fflush(stdout);
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total_bytes}};
  index["weight_map"] = weight_map;
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
  return total_bytes;
}

TokenRecords make_records(const Spec& s) {
  Rng rng(s.seed);
  TokenRecords rec;
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (int r = 0; r < s.records; ++r) {
    const int len = s.min_len + rng.below(s.max_len - s.min_len + 1);
    ids.resize(static_cast<size_t>(len));
    for (int32_t& t : ids) t = rng.below(s.vocab);
    mask.assign(static_cast<size_t>(len), 1);
    std::fill(mask.begin(), mask.begin() + std::min(len, kPromptTokens), uint8_t{0});
    rec.add(ids, mask);
  }
  return rec;
}

}  // namespace

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-make-random")) return 0;
  process_identity().role = "tool";
  Spec s;
  std::string out;
  // Two passes: the preset first (the last --preset wins), then every other flag over it, in order.
  for (ToolArgs args(argc, argv, kUsage); args.next();) {
    if (args.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.positional()) {
      DF_CHECK_HINT(out.empty(), BadOptions, "unexpected argument " << args.arg(), kUsage);
      out = args.arg();
    } else if (args.is("--preset")) {
      s.preset = args.value();
    } else {
      args.value();  // every other flag takes a value: read in the second pass
    }
  }
  DF_CHECK_HINT(!out.empty(), BadOptions, "missing OUTDIR", kUsage);
  DF_CHECK_HINT(!s.preset.empty(), BadOptions, "missing --preset", kUsage);
  apply_preset(s);
  // The Gated DeltaNet's shape flags: a hybrid preset's only.
  const auto hybrid_flag = [&s](ToolArgs& args, int lo, int hi) {
    DF_CHECK_HINT(s.hybrid, BadOptions, args.arg() << " shapes a hybrid's Gated DeltaNet layers; --preset " << s.preset
                                                   << " is a dense Qwen3",
                  "use --preset qwen36-27b or tiny-hybrid");
    return static_cast<int>(args.integer(lo, hi));
  };
  for (ToolArgs args(argc, argv, kUsage); args.next();) {
    if (args.positional()) continue;
    if (args.is("--preset")) args.value();
    else if (args.is("--seed")) s.seed = static_cast<uint64_t>(args.integer(0, 1LL << 62));
    else if (args.is("--vocab")) s.vocab = static_cast<int>(args.integer(16, 1 << 22));
    else if (args.is("--hidden")) s.hidden = static_cast<int>(args.integer(8, 1 << 16));
    else if (args.is("--layers")) s.layers = static_cast<int>(args.integer(1, 512));
    else if (args.is("--heads")) s.heads = static_cast<int>(args.integer(1, 1024));
    else if (args.is("--kv-heads")) s.kv_heads = static_cast<int>(args.integer(1, 1024));
    else if (args.is("--head-dim")) s.head_dim = static_cast<int>(args.integer(2, 1024));
    else if (args.is("--intermediate")) s.intermediate = static_cast<int>(args.integer(1, 1 << 18));
    else if (args.is("--gdn-key-heads")) s.gdn_key_heads = hybrid_flag(args, 1, 1024);
    else if (args.is("--gdn-value-heads")) s.gdn_value_heads = hybrid_flag(args, 1, 1024);
    else if (args.is("--gdn-head-dim")) s.gdn_head_dim = hybrid_flag(args, 1, 1024);
    else if (args.is("--conv-kernel")) s.conv_kernel = hybrid_flag(args, 1, 64);
    else if (args.is("--records")) s.records = static_cast<int>(args.integer(1, 1 << 24));
    else if (args.is("--min-len")) s.min_len = static_cast<int>(args.integer(kPromptTokens + 1, 1 << 22));
    else if (args.is("--max-len")) s.max_len = static_cast<int>(args.integer(kPromptTokens + 1, 1 << 22));
    else if (args.is("--threads")) s.threads = static_cast<int>(args.integer(1, 4096));
    else if (args.is("--shard-gb")) s.shard_gb = args.real(0.001, 1000);
    else args.unknown();
  }
  if (s.threads == 0) s.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  check_qwen3_shape(s, kUsage);
  DF_CHECK_HINT(s.min_len <= s.max_len, BadOptions,
                "--min-len " << s.min_len << " must be <= --max-len " << s.max_len, kUsage);
  DF_CHECK_HINT(static_cast<double>(s.records) * s.max_len < 2e9, BadOptions,
                "--records x --max-len must stay below 2e9 tokens (the dataset is built in memory)", kUsage);

  const auto t0 = std::chrono::steady_clock::now();
  make_dir(out);
  make_dir(out + "/target");
  const uint64_t bytes = write_target(out + "/target", s, t0);
  const double target_s = seconds_since(t0);
  const TokenRecords rec = make_records(s);
  write_token_dataset(out + "/data.h5", rec, s.vocab, "dflash-random-" + std::to_string(s.seed));
  char gdn[160] = "";
  if (s.hybrid)
    std::snprintf(gdn, sizeof(gdn), " (%d Gated DeltaNet: %d key / %d value heads x %d, conv %d; %d attention)",
                  s.gdn_layers(), s.gdn_key_heads, s.gdn_value_heads, s.gdn_head_dim, s.conv_kernel,
                  s.layers - s.gdn_layers());
  std::printf("dflash-make-random: %s/target (%s: vocab %d, hidden %d, %d layers%s, %d/%d heads x %d, intermediate "
              "%d, %s; %.2f GB in %.1f s) and %s/data.h5 (%zu records, %lld tokens) in %.1f s total\n",
              out.c_str(), s.preset.c_str(), s.vocab, s.hidden, s.layers, gdn, s.heads, s.kv_heads, s.head_dim,
              s.intermediate, s.tied ? "tied" : "untied", bytes / 1e9, target_s, out.c_str(), rec.num_records(),
              static_cast<long long>(rec.num_tokens()), seconds_since(t0));
  return 0;
}
