// DFlash speculative decoding, greedy (include/dflash/spec_decode.h).
#include "dflash/spec_decode.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <numeric>
#include <thread>

#include "dflash/backend.h"
#include "dflash/drafter_ops.h"
#include "dflash/error.h"
#include "eval/spec_decode_lane.h"

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

// Rows [first, first + rows) of slice k of a [K, T, H] tensor, as a [rows, H] view.
Tensor feature_rows(const Tensor& f, int64_t k, int64_t first, int64_t rows) {
  const int64_t T = f.shape[1], H = f.shape[2];
  DF_CHECK(first >= 0 && first + rows <= T, Internal, "feature rows [" << first << ", " << first + rows << ") of " << T);
  char* base = static_cast<char*>(f.data) + static_cast<size_t>((k * T + first) * H) * dtype_size(f.dtype);
  return Tensor(base, f.dtype, f.device, {rows, H});
}


}  // namespace

SpecDecoder::SpecDecoder(TargetModel& target, DrafterTrainer& drafter, const Ctx& ctx, int64_t max_tokens,
                         int64_t packed_tokens, int prompt_batch)
    : target_(target), drafter_(drafter), ctx_(ctx), prompt_batch_(prompt_batch), max_tokens_(max_tokens),
      packed_tokens_(packed_tokens > 0 ? packed_tokens : max_tokens) {
  const DrafterConfig& dc = drafter.config();
  block_ = dc.block_size;
  k_ = static_cast<int>(dc.target_layer_ids.size());
  hidden_ = target.config().hidden_size;
  vocab_ = target.config().vocab_size;
  mask_token_ = dc.mask_token_id;
  DF_CHECK(target.capture_layers() == dc.target_layer_ids, Internal,
           "the target must capture the drafter's target_layer_ids");
  DF_CHECK(max_tokens >= block_ + 1, BadOptions, "max_tokens " << max_tokens << " below block size + 1");
  DF_CHECK(prompt_batch >= 1, BadOptions, "a prompt batch of " << prompt_batch);
  // One prompt alone must fit a packed forward: its reservation is at most max_tokens - block.
  DF_CHECK(packed_tokens_ >= max_tokens - block_, Internal,
           "packed tokens " << packed_tokens_ << " below one prompt's " << max_tokens - block_);
  const DType dt = target.activation_dtype();
  const Device dev = ctx.device;
  tgt_features_ = Buffer(dev, dt, {k_, packed_tokens_, hidden_});
  tgt_final_norm_ = Buffer(dev, dt, {packed_tokens_, hidden_});
  // The drafter's packed forward (greedy: the lanes of a step draft together): as many blocks and tokens as
  // the drafter takes, at most what the running prompts can need.
  draft_anchors_ = std::min(prompt_batch, drafter.max_anchors());
  draft_tokens_ = std::max(max_tokens, std::min(drafter.max_tokens(), packed_tokens_ + static_cast<int64_t>(prompt_batch) * block_));
  DF_CHECK(drafter.max_tokens() >= max_tokens && draft_anchors_ >= 1, Internal,
           "the drafter takes " << drafter.max_tokens() << " tokens and " << drafter.max_anchors()
                                << " anchors a batch; one prompt needs " << max_tokens << " and 1");
  drf_features_ = Buffer(dev, dt, {k_, draft_tokens_, hidden_});
  const int64_t logit_rows = static_cast<int64_t>(prompt_batch) * block_;
  fn_rows_ = Buffer(dev, dt, {logit_rows, hidden_});
  logits_ = Buffer(dev, dt, {logit_rows, vocab_});
  // The drafter reads features only before its anchor, but its projection runs over every position:
  // keep the unread rows finite.
  drf_features_.zero();
  row_ready_.assign(static_cast<size_t>(logit_rows), 0);
  if (!logits_on_host()) {
    host_logits_.resize(static_cast<size_t>(logit_rows * vocab_));
    host_raw_.reset(new char[logits_.t().nbytes()]);
  }
  const unsigned cores = std::thread::hardware_concurrency();
  host_threads_ = static_cast<int>(std::clamp(cores, 1u, 16u));
}

bool SpecDecoder::logits_on_host() const { return logits_.t().device == Device::CPU && logits_.t().dtype == DType::F32; }

const float* SpecDecoder::logits_row(int64_t r) {
  DF_CHECK(r >= 0 && r < static_cast<int64_t>(row_ready_.size()), Internal, "logits row " << r);
  if (logits_on_host()) return logits_.t().ptr<float>() + r * vocab_;
  float* row = host_logits_.data() + static_cast<size_t>(r * vocab_);
  if (!row_ready_[static_cast<size_t>(r)]) {
    const DType dt = logits_.t().dtype;
    to_f32(row, host_raw_.get() + static_cast<size_t>(r * vocab_) * dtype_size(dt), dt, static_cast<size_t>(vocab_));
    row_ready_[static_cast<size_t>(r)] = 1;
  }
  return row;
}

void SpecDecoder::parallel_for(size_t n, const std::function<void(size_t)>& f) const {
  const size_t threads = std::min(n, static_cast<size_t>(host_threads_));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) f(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

SpecDecoder::~SpecDecoder() = default;

void SpecDecoder::target_forward() {
  const int64_t T = batch_.num_tokens();
  DF_CHECK(T >= 1 && T <= packed_tokens_, Internal, "target forward of " << T << " tokens (limit " << packed_tokens_ << ")");
  CaptureOut out;
  out.features = leading_view(tgt_features_, {k_, T, hidden_});
  out.final_norm = leading_view(tgt_final_norm_, {T, hidden_});
  target_.forward(batch_, out);
  packed_now_ = T;
}

void SpecDecoder::target_logits(const std::vector<std::pair<int64_t, int>>& rows) {
  const Tensor fn = leading_view(tgt_final_norm_, {packed_now_, hidden_});
  int64_t total = 0;
  for (const auto& [first, count] : rows) {
    DF_CHECK(count >= 1 && count <= block_ && first >= 0 && first + count <= packed_now_, Internal,
             "logits of rows [" << first << ", " << first + count << ") of " << packed_now_);
    total += count;
  }
  DF_CHECK(total >= 1 && total <= fn_rows_.t().shape[0], Internal, "logits of " << total << " rows");
  // Gathered into one [total, H] block so that one lm_head GEMM serves every prompt of the step.
  const Tensor gathered = leading_view(fn_rows_, {total, hidden_});
  int64_t at = 0;
  for (const auto& [first, count] : rows) {
    copy_tensor(ctx_, gathered.slice_rows(at, at + count), fn.slice_rows(first, first + count));
    at += count;
  }
  const Tensor lg = leading_view(logits_, {total, vocab_});
  target_.lm_head_forward(lg, gathered);
  std::fill(row_ready_.begin(), row_ready_.begin() + total, 0);
  if (!logits_on_host())  // as they are (bf16 on CUDA: half the bytes); logits_row converts what is read
    copy_tensor(ctx_, Tensor(host_raw_.get(), lg.dtype, Device::CPU, {total, vocab_}), lg);  // complete on return
}

FeatureBatch SpecDecoder::pack_draft(const std::vector<Lane*>& lanes, std::vector<int64_t>& anchors) {
  // Each lane's sequence: x[0..n] then the block after its anchor x[n] (any ids: the drafter sees mask tokens
  // there), loss_mask 1 so that every block position gets its row. All B positions, also for a shorter block:
  // the drafter hides the rows from block_rows on (draft_blocks).
  draft_batch_.tokens.clear();
  draft_batch_.loss_mask.clear();
  draft_batch_.cu_seqlens.assign(1, 0);
  anchors.clear();
  for (Lane* l : lanes) {
    const int64_t n = static_cast<int64_t>(l->x.size()) - 1;  // the anchor: x[n] has no features yet
    DF_CHECK(n <= l->seq_len, Internal, "draft at " << n << " of " << l->seq_len << " tokens");
    anchors.push_back(draft_batch_.num_tokens() + n);
    draft_batch_.tokens.insert(draft_batch_.tokens.end(), l->x.begin(), l->x.end());
    draft_batch_.tokens.resize(draft_batch_.tokens.size() + static_cast<size_t>(block_ - 1), mask_token_);
    draft_batch_.loss_mask.resize(draft_batch_.tokens.size() - static_cast<size_t>(block_ - 1), 0);
    draft_batch_.loss_mask.resize(draft_batch_.tokens.size(), 1);
    draft_batch_.cu_seqlens.push_back(static_cast<int32_t>(draft_batch_.num_tokens()));
  }
  const int64_t T = draft_batch_.num_tokens();
  DF_CHECK(T <= draft_tokens_ && static_cast<int>(lanes.size()) <= draft_anchors_, Internal,
           "a draft of " << lanes.size() << " blocks, " << T << " tokens (limits " << draft_anchors_ << ", " << draft_tokens_ << ")");
  // Each lane's features: its sequence in the last packed target forward, from its offset.
  const Tensor src = leading_view(tgt_features_, {k_, packed_now_, hidden_});
  const Tensor dst = leading_view(drf_features_, {k_, T, hidden_});
  for (size_t i = 0; i < lanes.size(); ++i) {
    const int64_t n = static_cast<int64_t>(lanes[i]->x.size()) - 1, at = draft_batch_.cu_seqlens[i];
    if (n > 0)
      for (int k = 0; k < k_; ++k) copy_tensor(ctx_, feature_rows(dst, k, at, n), feature_rows(src, k, lanes[i]->offset, n));
  }
  FeatureBatch fb;
  fb.batch = &draft_batch_;
  fb.features = dst;
  return fb;
}

void SpecDecoder::draft_together(const std::vector<Lane*>& lanes, int block_rows) {
  std::vector<int64_t> anchors;
  const FeatureBatch fb = pack_draft(lanes, anchors);
  std::vector<std::vector<int32_t>> drafts = drafter_.draft_blocks(fb, anchors, block_rows);
  for (size_t i = 0; i < lanes.size(); ++i) lanes[i]->drafts = std::move(drafts[i]);
}

std::vector<int32_t> SpecDecoder::greedy(const std::vector<int32_t>& prompt, int max_new_tokens,
                                         const std::vector<int32_t>& stop) {
  std::vector<int32_t> x = prompt;
  const int64_t m = static_cast<int64_t>(prompt.size());
  DF_CHECK(m >= 1 && m + max_new_tokens <= std::min(max_tokens_, packed_tokens_), BadOptions,
           "a prompt of " << m << " tokens + " << max_new_tokens << " new exceeds " << max_tokens_ << " tokens");
  for (int i = 0; i < max_new_tokens; ++i) {
    const int64_t T = static_cast<int64_t>(x.size());
    batch_.tokens = x;
    batch_.cu_seqlens = {0, static_cast<int32_t>(T)};
    batch_.loss_mask.assign(static_cast<size_t>(T), 0);
    target_forward();
    target_logits({{T - 1, 1}});
    const float* row = logits_row(0);
    const auto next = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);  // first of equal maxima
    x.push_back(next);
    if (is_stop(next, stop)) break;
  }
  return std::vector<int32_t>(x.begin() + m, x.end());
}

void sampling_probs(const float* logits, int64_t V, const SamplingSpec& s, std::vector<double>& probs) {
  DF_CHECK(s.temperature > 0.f && s.top_p > 0.f && s.top_p <= 1.f && s.top_k >= 0, Internal,
           "sampling_probs: temperature " << s.temperature << ", top_p " << s.top_p << ", top_k " << s.top_k);
  if ((s.top_k == 0 || s.top_k >= V) && s.top_p >= 1.f) {
    // the whole vocabulary: the same arithmetic as below in id order, written into probs directly (this runs
    // for every verified row and every DFlash draft row at T > 0)
    double m = -1e300;
    for (int64_t i = 0; i < V; ++i) m = std::max(m, static_cast<double>(logits[i]) / s.temperature);
    probs.resize(static_cast<size_t>(V));
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += probs[i] = std::exp(static_cast<double>(logits[i]) / s.temperature - m);
    for (double& x : probs) x /= z;
    return;
  }
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
  if (s.temperature > 0.f && drafter_.config().arch == DraftArch::DFlash && draft_logits_.t().empty()) {
    draft_logits_ = Buffer(ctx_.device, target_.activation_dtype(), {static_cast<int64_t>(draft_anchors_) * block_, vocab_});
    draft_raw_.reset(new char[draft_logits_.t().nbytes()]);
  }
}

int32_t draw_from(const std::vector<double>& p, Rng& rng) {  // inverse CDF in id order (torch.multinomial's law)
  double total = 0;
  for (double x : p) total += x;
  const double u = rng.uniform() * total;
  double acc = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = static_cast<int32_t>(i);
    if ((acc += p[i]) > u) return last;
  }
  return last;
}

void SpecDecoder::draft_sampled_together(const std::vector<Lane*>& lanes, int block_rows) {
  const int n = block_rows - 1;
  if (drafter_.config().arch == DraftArch::DFlash2) {
    // the selector's sampled walk of each block: q over its candidates (temperature only, as the official
    // propose), each lane's walk drawing from its own generator
    std::vector<int64_t> anchors;
    const FeatureBatch fb = pack_draft(lanes, anchors);
    std::vector<std::function<double()>> uniforms;
    for (Lane* l : lanes) uniforms.emplace_back([l] { return l->rng.uniform(); });
    std::vector<std::vector<float>> q;
    std::vector<std::vector<int32_t>> cand;
    std::vector<std::vector<int32_t>> drafts =
        drafter_.draft_blocks_sampled(fb, anchors, block_rows, sampling_.temperature, uniforms, q, cand);
    for (size_t i = 0; i < lanes.size(); ++i) {
      Lane& lane = *lanes[i];
      lane.drafts = std::move(drafts[i]);
      lane.q_ids = std::move(cand[i]);
      const size_t K = q[i].size() / static_cast<size_t>(n);
      lane.q_rows.resize(static_cast<size_t>(n));  // (each row rewritten whole: its storage kept)
      for (int j = 0; j < n; ++j) lane.q_rows[j].assign(q[i].begin() + j * K, q[i].begin() + (j + 1) * K);
    }
    return;
  }
  // DFlash: the drafter's logits = the target's lm_head over its hidden rows 1..V-1 of each block,
  // compute_logits' transform, then sampling_probs with the same top-p / top-k, one draw a row
  DF_CHECK(!draft_logits_.t().empty(), Internal, "draft_sampled_together: a DFlash drafter after set_sampling");
  draft_together(lanes, block_rows);  // the forward (its greedy drafts are replaced by the draws below)
  const int64_t rows = static_cast<int64_t>(lanes.size()) * block_;  // each block's B rows (drafter.h)
  const Tensor h = drafter_.draft_hidden();
  DF_CHECK(h.size(0) == rows, Internal, "draft hidden " << h.shape_str() << " for " << lanes.size() << " blocks of " << block_);
  const Tensor lg = leading_view(draft_logits_, {rows, vocab_});
  target_.lm_head_forward(lg, h);
  const Tensor raw(draft_raw_.get(), lg.dtype, Device::CPU, {rows, vocab_});
  copy_tensor(ctx_, raw, lg);  // complete on return
  const ops::LogitSpec logit = ops::logit_spec(drafter_.config());
  const size_t row_bytes = static_cast<size_t>(vocab_) * dtype_size(lg.dtype);
  parallel_for(lanes.size(), [&](size_t i) {
    Lane& lane = *lanes[i];
    lane.q_rows.resize(static_cast<size_t>(n));  // sampling_probs rewrites each row whole, in its storage
    lane.drafts.resize(static_cast<size_t>(n));
    std::vector<float> row(static_cast<size_t>(vocab_));
    for (int j = 0; j < n; ++j) {
      const size_t r = i * static_cast<size_t>(block_) + 1 + static_cast<size_t>(j);
      to_f32(row.data(), static_cast<const char*>(raw.data) + r * row_bytes, lg.dtype, static_cast<size_t>(vocab_));
      ops::transform_logits_in_place(row.data(), vocab_, logit);
      sampling_probs(row.data(), vocab_, sampling_, lane.q_rows[j]);
      lane.drafts[j] = draw_from(lane.q_rows[j], lane.rng);
    }
    lane.q_ids.clear();
  });
}

}  // namespace dflash
