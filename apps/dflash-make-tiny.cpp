// dflash-make-tiny: writes the default job's tiny Qwen3 target (HF layout: config.json + sharded
// safetensors + index) and a token dataset sampled from that target, so a drafter has something
// learnable to train on. Runs in seconds on the CPU.
//
//   dflash-make-tiny OUTDIR [--seed N] [--vocab 512] [--hidden 64] [--layers 4] [--heads 4] [--kv-heads 2]
//                    [--head-dim 32] [--intermediate 192] [--shards 2] [--records 320] [--min-len 24]
//                    [--max-len 96] [--temperature 0] [--window 16] [--dtype bf16|f32] [--hybrid]
//   --hybrid: a Qwen3.5/3.6-layout target (Qwen3_5ForCausalLM: Gated DeltaNet layers, every 4th layer gated
//             full attention with partial rotary, zero-centred norms) instead of a dense Qwen3
//   -> OUTDIR/target/{config.json, model-0000i-of-0000n.safetensors, model.safetensors.index.json,
//                     tokenizer.json, tokenizer_config.json}
//      OUTDIR/data.h5
// The tokenizer (tiny_tokenizer.h: byte-level BPE with a Qwen3-style chat template, ids below the vocabulary)
// lets dflash-tokenize turn chat JSONL into a dataset for this target (docs/data.md); it is not the tokenizer
// of data.h5, whose tokens the target itself sampled. A --vocab too small for 256 bytes gets none.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/tool_args.h"
#include "dflash/version.h"
#include "dflash/safetensors.h"
#include "dflash/target.h"
#include "dflash/tensor.h"
#include "make_target_common.h"
#include "tiny_tokenizer.h"

using namespace dflash;

namespace {

const char* kUsage =
    "usage: dflash-make-tiny OUTDIR [--seed N] [--vocab V] [--hidden H] [--layers L] [--heads N] [--kv-heads N]\n"
    "         [--head-dim D] [--intermediate I] [--shards S] [--records R] [--min-len A] [--max-len B]\n"
    "         [--temperature T (0 = greedy)] [--window W (context tokens the sampler conditions on)]\n"
    "         [--dtype bf16|f32] [--hybrid (a Qwen3.5/3.6 hybrid: Gated DeltaNet + gated attention)]\n"
    "       dflash-make-tiny --help | --version\n";

struct TinySpec : Qwen3Shape {
  TinySpec() {
    vocab = 512, hidden = 64, layers = 4, heads = 4, kv_heads = 2, head_dim = 32, intermediate = 192;
    // --hybrid (Qwen3Shape::hybrid): the Qwen3.5/3.6 layout with these Gated DeltaNet heads; else dense Qwen3.
    gdn_key_heads = 2, gdn_value_heads = 4, gdn_head_dim = 16, conv_kernel = 4;
  }
  uint64_t seed = 1;
  int shards = 2;
  int records = 320, min_len = 24, max_len = 96;
  int prompt_min = 4, prompt_max = 8;  // random prompt tokens, loss_mask 0
  double temperature = 0;
  int window = 16;
  DType dtype = DType::BF16;
};

// A portable seeded generator (the same files on every machine for a seed).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }
  int below(int n) { return static_cast<int>(uniform() * n); }
  double normal() {  // Box-Muller
    double u1 = std::max(uniform(), 1e-300), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

// ---- the target checkpoint -------------------------------------------------------------------------

struct NamedWeight {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// Draws each tensor of the shared list (make_target_common.h: names, shapes, scales and why) in order from
// one generator: Gaussian where dflash-make-random draws uniform. The scales' purpose here: embeddings of unit
// size so each token's own direction dominates the residual stream (the next token depends mostly on the
// current one and a little on the context: learnable, not trivial); MLP outputs at half, attention outputs
// at 0.3 of the fan-in scale, so the context moves the prediction without dominating it (the sampler sees
// only a window of context, see sample_records); the final norm's weight ~4 so the target's logits have a
// std of ~4 and its distribution is peaked. The peak lives in model.norm, not in lm_head: the drafter shares
// lm_head but has its own final norm (initialised to 1), so it starts from near-uniform predictions and
// learns the scale, instead of starting overconfident (a 4x lm_head put a fresh drafter's loss at ~2x
// uniform for hundreds of steps).
std::vector<NamedWeight> make_weights(const TinySpec& s) {
  Rng rng(s.seed);
  std::vector<NamedWeight> w;
  for (const TargetTensor& t : target_tensors(s, 4.0)) {
    NamedWeight x{t.name, t.shape, std::vector<float>(static_cast<size_t>(t.numel()))};
    for (float& v : x.data) {
      switch (t.init) {
        case TensorInit::Normal: v = static_cast<float>(rng.normal() * t.scale); break;
        case TensorInit::NearOne:
          v = static_cast<float>(t.scale * (1.0 + 0.1 * rng.normal()));
          if (t.zero_centred) v -= 1.0f;
          break;
        case TensorInit::ALog: v = static_cast<float>(gdn_a_log(rng.uniform())); break;
        case TensorInit::DtBias: v = static_cast<float>(gdn_dt_bias(rng.uniform())); break;
      }
    }
    w.push_back(std::move(x));
  }
  return w;
}

nlohmann::ordered_json make_config(const TinySpec& s) {
  nlohmann::ordered_json c = target_config_json(s);
  c["torch_dtype"] = s.dtype == DType::BF16 ? "bfloat16" : "float32";
  c["dflash_tiny"] = {{"seed", s.seed}, {"generator", "dflash-make-tiny"}};
  return c;
}

void write_target(const std::string& dir, const TinySpec& s, const std::vector<NamedWeight>& weights) {
  write_file_atomic(dir + "/config.json", make_config(s).dump(2) + "\n");
  const size_t n = weights.size();
  const int shards = std::max(1, std::min<int>(s.shards, static_cast<int>(n)));
  nlohmann::ordered_json index;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total = 0;
  for (int k = 0; k < shards; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05d-of-%05d.safetensors", k + 1, shards);
    std::vector<TensorToWrite> part;
    for (size_t i = n * k / shards; i < n * (k + 1) / shards; ++i) {
      part.push_back(TensorToWrite{weights[i].name, s.dtype, weights[i].shape, weights[i].data.data(), nullptr});
      weight_map[weights[i].name] = name;
      total += weights[i].data.size() * dtype_size(s.dtype);
    }
    write_safetensors(dir + "/" + name, part, {{"format", "pt"}});
  }
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = weight_map;
  write_file_atomic(dir + "/model.safetensors.index.json", index.dump(2) + "\n");
}

// ---- the dataset: sampled from the target ------------------------------------------------------------

// Every record: a random prompt (loss_mask 0) continued by the target itself, one token per step for all
// records at once (one packed forward per step). The sampler conditions on the last `window` tokens
// (no KV cache: full-context sampling would cost O(len^2) forwards); with a near-Markov target this is
// the target's own continuation in all but rare cases.
TokenRecords sample_records(const std::string& target_dir, const TinySpec& s, double* mean_top_prob) {
  Rng rng(s.seed ^ 0xDA7A5EEDull);
  const int R = s.records;
  std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(R));
  std::vector<int> target_len(static_cast<size_t>(R)), prompt_len(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) {
    target_len[r] = s.min_len + rng.below(s.max_len - s.min_len + 1);
    prompt_len[r] = s.prompt_min + rng.below(s.prompt_max - s.prompt_min + 1);
    for (int p = 0; p < prompt_len[r]; ++p) seqs[r].push_back(rng.below(s.vocab));
  }
  const int64_t max_tokens = int64_t(R) * s.window;
  const std::unique_ptr<TargetModel> target =
      make_target_model(load_target_config(target_dir), target_dir, cpu_ctx(), {}, max_tokens);
  const int64_t H = s.hidden, V = s.vocab;
  std::vector<float> final_norm(static_cast<size_t>(max_tokens * H)), last(static_cast<size_t>(R) * H);
  std::vector<float> logits(static_cast<size_t>(R) * V), probs(static_cast<size_t>(V));
  PackedBatch b;
  double top_sum = 0;
  int64_t top_count = 0;
  while (true) {
    std::vector<int> active;
    for (int r = 0; r < R; ++r)
      if (static_cast<int>(seqs[r].size()) < target_len[r]) active.push_back(r);
    if (active.empty()) break;
    b.tokens.clear();
    b.cu_seqlens.assign(1, 0);
    for (int r : active) {
      const auto& q = seqs[r];
      const size_t from = q.size() > static_cast<size_t>(s.window) ? q.size() - s.window : 0;
      b.tokens.insert(b.tokens.end(), q.begin() + static_cast<long>(from), q.end());
      b.cu_seqlens.push_back(static_cast<int32_t>(b.tokens.size()));
    }
    b.loss_mask.assign(b.tokens.size(), 1);
    const int64_t T = b.num_tokens(), A = static_cast<int64_t>(active.size());
    CaptureOut out;
    out.final_norm = cpu_view(final_norm.data(), {T, H});
    target->forward(b, out);
    for (int64_t a = 0; a < A; ++a)  // the last position of each sequence
      std::copy_n(final_norm.data() + (b.cu_seqlens[a + 1] - 1) * H, H, last.data() + a * H);
    target->lm_head_forward(cpu_view(logits.data(), {A, V}), cpu_view(last.data(), {A, H}));
    for (int64_t a = 0; a < A; ++a) {
      const float* lg = logits.data() + a * V;
      const int argmax = static_cast<int>(std::max_element(lg, lg + V) - lg);
      double z = 0;
      for (int64_t v = 0; v < V; ++v) z += std::exp(double(lg[v] - lg[argmax]));
      top_sum += 1.0 / z;
      top_count++;
      int next = argmax;
      if (s.temperature > 0) {
        double zt = 0;
        for (int64_t v = 0; v < V; ++v) zt += (probs[v] = static_cast<float>(std::exp((lg[v] - lg[argmax]) / s.temperature)));
        double u = rng.uniform() * zt, acc = 0;
        for (int64_t v = 0; v < V; ++v) {
          acc += probs[v];
          if (u < acc) {
            next = static_cast<int>(v);
            break;
          }
        }
      }
      seqs[active[a]].push_back(next);
    }
  }
  *mean_top_prob = top_count ? top_sum / double(top_count) : 0;
  TokenRecords rec;
  for (int r = 0; r < R; ++r) {
    std::vector<uint8_t> mask(seqs[r].size(), 1);
    std::fill(mask.begin(), mask.begin() + prompt_len[r], uint8_t{0});
    rec.add(seqs[r], mask);
  }
  return rec;
}

}  // namespace

int main(int argc, char** argv) {
  if (dflash::print_version_if_asked(argc, argv, "dflash-make-tiny")) return 0;
  process_identity().role = "tool";
  TinySpec s;
  std::string out;
  ToolArgs args(argc, argv, kUsage);
  while (args.next()) {
    if (args.help()) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (args.positional()) {
      DF_CHECK_HINT(out.empty(), BadOptions, "unexpected argument " << args.arg(), kUsage);
      out = args.arg();
    } else if (args.is("--hybrid")) {  // the one switch without a value
      args.no_value();
      s.hybrid = true;
    } else if (args.is("--seed")) s.seed = static_cast<uint64_t>(args.integer(0, 1LL << 62));
    else if (args.is("--vocab")) s.vocab = static_cast<int>(args.integer(16, 1 << 20));
    else if (args.is("--hidden")) s.hidden = static_cast<int>(args.integer(8, 8192));
    else if (args.is("--layers")) s.layers = static_cast<int>(args.integer(1, 256));
    else if (args.is("--heads")) s.heads = static_cast<int>(args.integer(1, 256));
    else if (args.is("--kv-heads")) s.kv_heads = static_cast<int>(args.integer(1, 256));
    else if (args.is("--head-dim")) s.head_dim = static_cast<int>(args.integer(2, 1024));
    else if (args.is("--intermediate")) s.intermediate = static_cast<int>(args.integer(1, 1 << 16));
    else if (args.is("--shards")) s.shards = static_cast<int>(args.integer(1, 1000));
    else if (args.is("--records")) s.records = static_cast<int>(args.integer(1, 1 << 20));
    else if (args.is("--min-len")) s.min_len = static_cast<int>(args.integer(2, 1 << 20));
    else if (args.is("--max-len")) s.max_len = static_cast<int>(args.integer(2, 1 << 20));
    else if (args.is("--window")) s.window = static_cast<int>(args.integer(1, 1 << 16));
    else if (args.is("--temperature")) s.temperature = args.real(0, 10);
    else if (args.is("--dtype")) {
      const std::string v = args.value();
      DF_CHECK_HINT(v == "bf16" || v == "f32", BadOptions, "--dtype must be bf16 or f32, got " << v, kUsage);
      s.dtype = v == "bf16" ? DType::BF16 : DType::F32;
    } else {
      args.unknown();
    }
  }
  DF_CHECK_HINT(!out.empty(), BadOptions, "missing OUTDIR", kUsage);
  check_qwen3_shape(s, kUsage);
  DF_CHECK_HINT(s.min_len <= s.max_len && s.min_len > s.prompt_max, BadOptions,
                "need " << s.prompt_max << " < --min-len <= --max-len", kUsage);

  const auto t0 = std::chrono::steady_clock::now();
  make_dir(out);
  make_dir(out + "/target");
  write_target(out + "/target", s, make_weights(s));
  const bool with_tokenizer = s.vocab >= tiny_tokenizer_min_vocab();
  const int tokenizer_size = with_tokenizer ? write_tiny_tokenizer(out + "/target", s.vocab, s.max_position_embeddings) : 0;
  double top_prob = 0;
  TokenRecords rec = sample_records(out + "/target", s, &top_prob);
  write_token_dataset(out + "/data.h5", rec, s.vocab, "dflash-tiny-" + std::to_string(s.seed));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string tokenizer =
      with_tokenizer ? "tokenizer.json with " + std::to_string(tokenizer_size) + " tokens and a chat template"
                     : "no tokenizer: --vocab below " + std::to_string(tiny_tokenizer_min_vocab());
  std::printf("dflash-make-tiny: %s/target (vocab %d, hidden %d, %d layers, %d/%d heads x %d, %d shards, %s; %s) and "
              "%s/data.h5 (%zu records, %lld tokens; target's mean top-1 probability %.2f) in %.1f s\n",
              out.c_str(), s.vocab, s.hidden, s.layers, s.heads, s.kv_heads, s.head_dim, s.shards,
              dtype_name(s.dtype), tokenizer.c_str(), out.c_str(), rec.num_records(),
              static_cast<long long>(rec.num_tokens()), top_prob, secs);
  return 0;
}
