// DFlash speculative decoding, greedy (include/dflash/spec_decode.h).
#include "dflash/spec_decode.h"

#include <algorithm>
#include <chrono>

#include "dflash/backend.h"
#include "dflash/error.h"

namespace dflash {

int accepted_prefix(const int32_t* draft, const int32_t* posterior, int n) {
  int a = 0;
  while (a < n && draft[a] == posterior[a]) ++a;
  return a;
}

double SpecDecodeResult::tau() const {
  if (acceptance.empty()) return 0.0;
  double s = 0;
  for (int a : acceptance) s += a;
  return s / static_cast<double>(acceptance.size());
}

namespace {

// A [dims] view of the start of buffer b (contiguous, so any leading part of it is a valid tensor).
Tensor leading_view(const Buffer& b, std::initializer_list<int64_t> dims) {
  Tensor t(b.t().data, b.t().dtype, b.t().device, dims);
  DF_CHECK(t.numel() <= b.numel(), Internal, "view " << t.shape_str() << " exceeds its buffer " << b.t().shape_str());
  return t;
}

// Rows [0, rows) of slice k of a [K, T, H] tensor, as a [rows, H] view.
Tensor feature_rows(const Tensor& f, int64_t k, int64_t rows) {
  const int64_t T = f.shape[1], H = f.shape[2];
  char* base = static_cast<char*>(f.data) + static_cast<size_t>(k * T * H) * dtype_size(f.dtype);
  return Tensor(base, f.dtype, f.device, {rows, H});
}

bool is_stop(int32_t t, const std::vector<int32_t>& stop) {
  return std::find(stop.begin(), stop.end(), t) != stop.end();
}

}  // namespace

SpecDecoder::SpecDecoder(TargetModel& target, DrafterTrainer& drafter, const Ctx& ctx, int64_t max_tokens)
    : target_(target), drafter_(drafter), ctx_(ctx), max_tokens_(max_tokens) {
  const DrafterConfig& dc = drafter.config();
  block_ = dc.block_size;
  k_ = static_cast<int>(dc.target_layer_ids.size());
  hidden_ = target.config().hidden_size;
  vocab_ = target.config().vocab_size;
  mask_token_ = dc.mask_token_id;
  DF_CHECK(target.capture_layers() == dc.target_layer_ids, Internal,
           "the target must capture the drafter's target_layer_ids");
  DF_CHECK(max_tokens >= block_ + 1, BadOptions, "max_tokens " << max_tokens << " below block size + 1");
  const DType dt = target.activation_dtype();
  const Device dev = ctx.device;
  tgt_features_ = Buffer(dev, dt, {k_, max_tokens, hidden_});
  tgt_final_norm_ = Buffer(dev, dt, {max_tokens, hidden_});
  drf_features_ = Buffer(dev, dt, {k_, max_tokens, hidden_});
  logits_ = Buffer(dev, dt, {block_, vocab_});
  // The drafter reads features only before its anchor, but its projection runs over every position:
  // keep the unread rows finite.
  drf_features_.zero();
  host_logits_.resize(static_cast<size_t>(block_ * vocab_));
}

SpecDecoder::~SpecDecoder() = default;

void SpecDecoder::target_forward(const std::vector<int32_t>& seq) {
  const int64_t T = static_cast<int64_t>(seq.size());
  DF_CHECK(T >= 1 && T <= max_tokens_, Internal, "target forward of " << T << " tokens (limit " << max_tokens_ << ")");
  batch_.tokens = seq;
  batch_.cu_seqlens = {0, static_cast<int32_t>(T)};
  batch_.loss_mask.assign(static_cast<size_t>(T), 0);
  CaptureOut out;
  out.features = leading_view(tgt_features_, {k_, T, hidden_});
  out.final_norm = leading_view(tgt_final_norm_, {T, hidden_});
  target_.forward(batch_, out);
}

void SpecDecoder::target_argmax(int64_t first, int count, std::vector<int32_t>& out) {
  DF_CHECK(count >= 1 && count <= block_, Internal, "argmax over " << count << " rows");
  const Tensor fn = leading_view(tgt_final_norm_, {max_tokens_, hidden_}).slice_rows(first, first + count);
  const Tensor lg = leading_view(logits_, {count, vocab_});
  target_.lm_head_forward(lg, fn);
  copy_tensor(ctx_, cpu_view(host_logits_.data(), {count, vocab_}), lg);  // complete on return
  out.resize(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) {
    const float* row = host_logits_.data() + static_cast<size_t>(r) * static_cast<size_t>(vocab_);
    out[r] = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);  // first of equal maxima
  }
}

void SpecDecoder::draft(const std::vector<int32_t>& x, int64_t seq_len, std::vector<int32_t>& out) {
  const int64_t n = static_cast<int64_t>(x.size()) - 1;  // the anchor: x[n] has no features yet
  const int64_t T = n + block_;
  DF_CHECK(n <= seq_len && T <= max_tokens_, Internal, "draft at " << n << " of " << seq_len << " tokens");
  // The block after the anchor: any ids (the drafter sees mask tokens there), loss_mask 1 so that every
  // position gets its row.
  batch_.tokens.assign(x.begin(), x.end());
  batch_.tokens.resize(static_cast<size_t>(T), mask_token_);
  batch_.cu_seqlens = {0, static_cast<int32_t>(T)};
  batch_.loss_mask.assign(static_cast<size_t>(T), 0);
  std::fill(batch_.loss_mask.begin() + n + 1, batch_.loss_mask.end(), uint8_t{1});
  const Tensor src = leading_view(tgt_features_, {k_, seq_len, hidden_});
  const Tensor dst = leading_view(drf_features_, {k_, T, hidden_});
  if (n > 0)
    for (int k = 0; k < k_; ++k) copy_tensor(ctx_, feature_rows(dst, k, n), feature_rows(src, k, n));
  FeatureBatch fb;
  fb.batch = &batch_;
  fb.features = dst;
  out = drafter_.draft_block(fb, n);
}

SpecDecodeResult SpecDecoder::generate(const std::vector<int32_t>& prompt, int max_new_tokens,
                                       const std::vector<int32_t>& stop) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  const int64_t m = static_cast<int64_t>(prompt.size());
  DF_CHECK(m >= 1 && max_new_tokens >= 1 && m + max_new_tokens + block_ <= max_tokens_, BadOptions,
           "a prompt of " << m << " tokens + " << max_new_tokens << " new + block " << block_ << " exceeds "
                          << max_tokens_ << " tokens");
  SpecDecodeResult res;
  std::vector<int32_t> x = prompt, drafts, posterior;
  // Prefill: the prompt's features and the target's first token.
  target_forward(x);
  int64_t seq_len = m;
  target_argmax(m - 1, 1, posterior);
  x.push_back(posterior[0]);
  bool stopped = is_stop(posterior[0], stop);
  const int B = block_;
  while (!stopped && static_cast<int64_t>(x.size()) - 1 < m + max_new_tokens) {
    const int64_t n = static_cast<int64_t>(x.size()) - 1;
    draft(x, seq_len, drafts);
    std::vector<int32_t> verify = x;
    verify.insert(verify.end(), drafts.begin(), drafts.end());
    target_forward(verify);
    seq_len = n + B;
    target_argmax(n, B, posterior);
    const int a = accepted_prefix(drafts.data(), posterior.data(), B - 1);
    for (int j = 0; j < a && !stopped; ++j) {
      x.push_back(drafts[j]);
      stopped = is_stop(drafts[j], stop);
    }
    if (!stopped) {
      x.push_back(posterior[a]);
      stopped = is_stop(posterior[a], stop);
    }
    res.acceptance.push_back(a + 1);
  }
  const int64_t end = std::min<int64_t>(static_cast<int64_t>(x.size()), m + max_new_tokens);
  res.tokens.assign(x.begin() + m, x.begin() + end);
  for (size_t i = 0; i < res.tokens.size(); ++i)
    if (is_stop(res.tokens[i], stop)) {
      res.tokens.resize(i + 1);
      break;
    }
  res.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  return res;
}

std::vector<int32_t> SpecDecoder::greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                         const std::vector<int32_t>& stop) {
  std::vector<int32_t> x = prompt, next;
  const int64_t m = static_cast<int64_t>(prompt.size());
  DF_CHECK(m >= 1 && m + max_new_tokens <= max_tokens_, BadOptions,
           "a prompt of " << m << " tokens + " << max_new_tokens << " new exceeds " << max_tokens_ << " tokens");
  for (int i = 0; i < max_new_tokens; ++i) {
    target_forward(x);
    target_argmax(static_cast<int64_t>(x.size()) - 1, 1, next);
    x.push_back(next[0]);
    if (is_stop(next[0], stop)) break;
  }
  return std::vector<int32_t>(x.begin() + m, x.end());
}

}  // namespace dflash
