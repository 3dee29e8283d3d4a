// DFlash speculative decoding, greedy (include/dflash/spec_decode.h).
#include "dflash/spec_decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "dflash/backend.h"
#include "dflash/drafter_ops.h"
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

int official_verify_rows(int block_size, int64_t start, int64_t max_length) {
  return static_cast<int>(std::min<int64_t>(block_size, max_length - start));
}

OfficialStep official_step_count(const std::vector<int32_t>& kept, int64_t start, int64_t max_length,
                                 const std::vector<int32_t>& stop) {
  OfficialStep s;
  s.produced = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(kept.size()), max_length - start - 1));
  for (int i = 0; i < s.produced; ++i)
    if (std::find(stop.begin(), stop.end(), kept[static_cast<size_t>(i)]) != stop.end()) {
      s.produced = i + 1;
      s.stopped = true;
      break;
    }
  return s;
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

void SpecDecoder::target_logits(int64_t first, int count) {
  DF_CHECK(count >= 1 && count <= block_, Internal, "logits of " << count << " rows");
  const Tensor fn = leading_view(tgt_final_norm_, {max_tokens_, hidden_}).slice_rows(first, first + count);
  const Tensor lg = leading_view(logits_, {count, vocab_});
  target_.lm_head_forward(lg, fn);
  copy_tensor(ctx_, cpu_view(host_logits_.data(), {count, vocab_}), lg);  // complete on return
}

void SpecDecoder::target_argmax(int64_t first, int count, std::vector<int32_t>& out) {
  target_logits(first, count);
  out.resize(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) {
    const float* row = host_logits_.data() + static_cast<size_t>(r) * static_cast<size_t>(vocab_);
    out[r] = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);  // first of equal maxima
  }
}

void SpecDecoder::draft(const std::vector<int32_t>& x, int64_t seq_len, int block_rows, std::vector<int32_t>& out) {
  const int64_t n = static_cast<int64_t>(x.size()) - 1;  // the anchor: x[n] has no features yet
  const int64_t T = n + block_;
  DF_CHECK(n <= seq_len && T <= max_tokens_, Internal, "draft at " << n << " of " << seq_len << " tokens");
  // The block after the anchor: any ids (the drafter sees mask tokens there), loss_mask 1 so that every
  // position gets its row. All B positions, also for a shorter block: the drafter hides the rows from
  // block_rows on (draft_block).
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
  out = drafter_.draft_block(fb, n, block_rows);
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
  const bool sampled = sampling_.temperature > 0.f;
  std::vector<double> p;
  auto target_probs = [&](int row) {  // sampling_probs of target logits row `row` of the last target_logits
    sampling_probs(host_logits_.data() + static_cast<size_t>(row) * static_cast<size_t>(vocab_), vocab_, sampling_, p);
  };
  int32_t first;
  if (sampled) {
    target_logits(m - 1, 1);
    target_probs(0);
    first = draw(p);
  } else {
    target_argmax(m - 1, 1, posterior);
    first = posterior[0];
  }
  x.push_back(first);
  bool stopped = is_stop(first, stop);
  const int B = block_;
  // The official loop's bounds and count (official_step_count): x[n] is its output_ids[start].
  const int64_t max_length = m + max_new_tokens;
  while (!stopped && static_cast<int64_t>(x.size()) < max_length) {
    const int64_t n = static_cast<int64_t>(x.size()) - 1;
    // The block of V rows: B, or near the limit the rows left (the official loop's verify_size): the drafter
    // drafts V - 1 tokens as a drafter of block size V would, the target verifies V rows.
    const int V = official_verify_rows(B, n, max_length);
    if (sampled) draft_sampled(x, seq_len, V, drafts);
    else draft(x, seq_len, V, drafts);
    DF_CHECK(static_cast<int>(drafts.size()) == V - 1, Internal, drafts.size() << " drafts for a block of " << V);
    std::vector<int32_t> verify = x;
    verify.insert(verify.end(), drafts.begin(), drafts.end());
    target_forward(verify);
    seq_len = n + V;
    int a = 0;
    int32_t bonus = 0;
    if (!sampled) {
      target_argmax(n, V, posterior);
      a = accepted_prefix(drafts.data(), posterior.data(), V - 1);
      bonus = posterior[a];
    } else {
      target_logits(n, V);
      // the draft probability of token d at row j: q over the vocabulary (DFlash) or over the candidates
      auto q_of = [&](int j, int32_t d) {
        if (q_ids_.empty()) return q_rows_[j][static_cast<size_t>(d)];
        const size_t K = q_rows_[j].size();
        double q = 0;
        for (size_t i = 0; i < K; ++i) q += q_ids_[j * K + i] == d ? q_rows_[j][i] : 0.0;
        return q;
      };
      for (; a < V - 1; ++a) {  // accept while u q(d) < p(d)
        target_probs(a);
        if (!(rng_.uniform() * q_of(a, drafts[a]) < p[static_cast<size_t>(drafts[a])])) break;
      }
      target_probs(a);  // row a: the bonus's distribution (all accepted: the last verified row, p itself)
      if (a < V - 1) {  // the residual max(0, p - q), renormalised; p itself where it is all zero
        std::vector<double> r = p;
        if (q_ids_.empty()) {
          for (size_t v = 0; v < r.size(); ++v) r[v] -= q_rows_[a][v];
        } else {
          const size_t K = q_rows_[a].size();
          for (size_t i = 0; i < K; ++i) r[static_cast<size_t>(q_ids_[a * K + i])] -= q_rows_[a][i];
        }
        double total = 0;
        for (double& v : r) total += v = std::max(v, 0.0);
        bonus = draw(total > 0 ? r : p);
      } else {
        bonus = draw(p);
      }
    }
    std::vector<int32_t> kept(drafts.begin(), drafts.begin() + a);
    kept.push_back(bonus);
    const OfficialStep step = official_step_count(kept, n, max_length, stop);
    x.insert(x.end(), kept.begin(), kept.begin() + step.produced);
    stopped = step.stopped;
    res.acceptance.push_back(step.produced);
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

void sampling_probs(const float* logits, int64_t V, const SamplingSpec& s, std::vector<double>& probs) {
  DF_CHECK(s.temperature > 0.f && s.top_p > 0.f && s.top_p <= 1.f && s.top_k >= 0, Internal,
           "sampling_probs: temperature " << s.temperature << ", top_p " << s.top_p << ", top_k " << s.top_k);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  int64_t n = V;
  if (s.top_k > 0 && s.top_k < V) {  // torch.topk: the k largest (ties by the lower id here)
    n = s.top_k;
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    ids.resize(static_cast<size_t>(n));
  }
  double m = -1e300;
  for (int32_t i : ids) m = std::max(m, static_cast<double>(logits[i]) / s.temperature);
  std::vector<double> p(static_cast<size_t>(n));
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += p[i] = std::exp(static_cast<double>(logits[ids[i]]) / s.temperature - m);
  for (double& x : p) x /= z;
  if (s.top_p < 1.f) {  // keep entries whose preceding mass (descending order) is < top_p
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double before = 0, kept = 0;
    std::vector<double> q(static_cast<size_t>(n), 0.0);
    for (int64_t o : order) {
      if (before < s.top_p) {
        q[o] = p[o];
        kept += p[o];
      }
      before += p[o];
    }
    for (int64_t i = 0; i < n; ++i) p[i] = q[i] / kept;
  }
  probs.assign(static_cast<size_t>(V), 0.0);
  for (int64_t i = 0; i < n; ++i) probs[ids[i]] = p[i];
}

void SpecDecoder::set_sampling(const SamplingSpec& s) {
  sampling_ = s;
  rng_ = Rng(s.seed);
  if (s.temperature > 0.f && drafter_.config().arch == DraftArch::DFlash && draft_logits_.t().empty())
    draft_logits_ = Buffer(ctx_.device, target_.activation_dtype(), {block_, vocab_});
}

int32_t SpecDecoder::draw(const std::vector<double>& p) {  // inverse CDF in id order (torch.multinomial's law)
  double total = 0;
  for (double x : p) total += x;
  const double u = rng_.uniform() * total;
  double acc = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = static_cast<int32_t>(i);
    if ((acc += p[i]) > u) return last;
  }
  return last;
}

void SpecDecoder::draft_sampled(const std::vector<int32_t>& x, int64_t seq_len, int block_rows,
                                std::vector<int32_t>& out) {
  const int n = block_rows - 1;
  q_rows_.assign(static_cast<size_t>(n), {});
  if (drafter_.config().arch == DraftArch::DFlash2) {
    // the selector's sampled walk: q over the candidates (temperature only, as the official propose)
    std::vector<int32_t> greedy;
    draft(x, seq_len, block_rows, greedy);  // builds the block and runs the forward (the walk below reuses it)
    std::vector<float> q;
    const int64_t anchor = static_cast<int64_t>(x.size()) - 1;
    FeatureBatch fb;
    fb.batch = &batch_;
    fb.features = leading_view(drf_features_, {k_, anchor + block_, hidden_});
    out = drafter_.draft_block_sampled(fb, anchor, block_rows, sampling_.temperature, [this] { return rng_.uniform(); },
                                       q, q_ids_);
    const size_t K = q.size() / static_cast<size_t>(n);
    for (int j = 0; j < n; ++j) q_rows_[j].assign(q.begin() + j * K, q.begin() + (j + 1) * K);
    return;
  }
  // DFlash: the drafter's logits = the target's lm_head over its hidden rows 1..V-1, compute_logits' transform,
  // then sampling_probs with the same top-p / top-k, one draw a row
  std::vector<int32_t> greedy;
  draft(x, seq_len, block_rows, greedy);
  const Tensor h = drafter_.draft_hidden().slice_rows(1, block_rows);
  const Tensor lg = leading_view(draft_logits_, {n, vocab_});
  target_.lm_head_forward(lg, h);
  std::vector<float> host(static_cast<size_t>(n * vocab_));
  copy_tensor(ctx_, cpu_view(host.data(), {n, vocab_}), lg);
  const ops::LogitSpec logit = ops::logit_spec(drafter_.config());
  out.resize(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    float* row = host.data() + static_cast<size_t>(j) * vocab_;
    ops::transform_logits_in_place(row, vocab_, logit);
    sampling_probs(row, vocab_, sampling_, q_rows_[j]);
    out[j] = draw(q_rows_[j]);
  }
  q_ids_.clear();
}

}  // namespace dflash
