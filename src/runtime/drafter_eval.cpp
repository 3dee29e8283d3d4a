// DrafterEval: src/runtime/drafter_eval.h.
#include "drafter_eval.h"

#include <algorithm>

#include "dflash/anchors.h"
#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/eval_set.h"

namespace dflash {

DrafterEval::DrafterEval(const JobContext& job, int block_size) : job_(job), block_size_(block_size) {
  DF_ASSERT(job.eval != nullptr);
  const EvalSet& e = *job.eval;
  const Topology& topo = job.topo;
  const int64_t n = static_cast<int64_t>(e.batches.size());
  for (const EvalRoute& r : topo.eval_routes(n)) {  // in batch order
    if (r.drafter != topo.world_rank) continue;
    senders_.push_back(topo.node_target_index_of(r.target));
    Kept k;
    k.index = r.batch;
    k.batch = &e.batches[static_cast<size_t>(r.batch)];
    k.anchors = fixed_anchors(*k.batch, r.batch, job.plan.train);
    share_.push_back(std::move(k));
  }
  std::vector<int64_t> mine;
  for (const Kept& k : share_) mine.push_back(k.index);
  DF_CHECK(mine == eval_share(n, static_cast<int>(topo.drafters.size()), topo.drafter_index_of(topo.world_rank)), Internal,
           "the eval routes give drafter rank " << topo.world_rank << " another share than eval_share");
}

std::vector<int64_t> DrafterEval::fixed_anchors(const PackedBatch& batch, int64_t index, const TrainOptions& opt) {
  AnchorSampler sampler(0xe7a15e7a15e7a15ull ^ (static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ull));
  return sampler.sample(batch, opt.max_anchors, opt.anchors_per_record);
}

Tensor DrafterEval::host_view(const Kept& k, const HostBuffer& buf, bool features) const {
  const SlotShape& sh = job_.plan.slot_shape;
  const int64_t T = k.batch->num_tokens();
  if (features) return Tensor(buf.data(), sh.dtype, Device::CPU, {sh.num_layers, T, sh.hidden});
  return Tensor(buf.data(), sh.dtype, Device::CPU, {T, sh.hidden});
}

void DrafterEval::keep(const HsBatch& b, const HsValues& values) {
  const BatchHeader& h = b.header;
  auto it = std::find_if(share_.begin(), share_.end(), [&](const Kept& k) { return k.index == h.batch_index; });
  DF_CHECK(h.kind == BatchKind::Eval && it != share_.end() && !it->received, Internal,
           "eval batch " << h.batch_index << " from rank " << h.report.rank << " is not one this drafter waits for");
  Kept& k = *it;
  DF_CHECK(b.batch.tokens == k.batch->tokens && b.batch.cu_seqlens == k.batch->cu_seqlens && b.batch.loss_mask == k.batch->loss_mask,
           Internal, "eval batch " << h.batch_index << " from rank " << h.report.rank << " differs from the one this rank packed");
  // Host memory, pageable: a share may be large, and it moves only every --eval-every steps.
  k.features = HostBuffer(values.features.nbytes(), HostMemory::Pageable);
  copy_tensor(job_.ctx, host_view(k, k.features, true), values.features);
  if (b.shape.final_norm) {
    k.final_norm = HostBuffer(values.final_norm.nbytes(), HostMemory::Pageable);
    copy_tensor(job_.ctx, host_view(k, k.final_norm, false), values.final_norm);
  }
  k.received = true;
}

bool DrafterEval::complete() const {
  return std::all_of(share_.begin(), share_.end(), [](const Kept& k) { return k.received; });
}

EvalSums DrafterEval::evaluate(DrafterTrainer& trainer) {
  DF_CHECK(complete(), Internal, "evaluating before every eval batch of this drafter arrived");
  const SlotShape& sh = job_.plan.slot_shape;
  EvalSums sums(block_size_);
  for (const Kept& k : share_) {
    FeatureBatch fb;
    fb.batch = k.batch;
    const Tensor features = host_view(k, k.features, true);
    const Tensor final_norm = sh.final_norm ? host_view(k, k.final_norm, false) : Tensor();
    if (job_.ctx.device == Device::CPU) {  // the kept bytes are the trainer's input: a view
      fb.features = features;
      fb.final_norm = final_norm;
    } else {  // uploaded into device buffers of the trainer's dtype, ordered on its stream before the forward
      if (device_features_.t().empty()) {
        int64_t T = 1;
        for (const Kept& s : share_) T = std::max(T, s.batch->num_tokens());
        device_features_ = Buffer(job_.ctx.device, sh.dtype, {sh.num_layers, T, sh.hidden});
        if (sh.final_norm) device_final_norm_ = Buffer(job_.ctx.device, sh.dtype, {T, sh.hidden});
      }
      const int64_t T = k.batch->num_tokens();
      fb.features = Tensor(device_features_.t().data, sh.dtype, job_.ctx.device, {sh.num_layers, T, sh.hidden});
      copy_tensor(job_.ctx, fb.features, features);
      if (sh.final_norm) {
        fb.final_norm = Tensor(device_final_norm_.t().data, sh.dtype, job_.ctx.device, {T, sh.hidden});
        copy_tensor(job_.ctx, fb.final_norm, final_norm);
      }
    }
    sums.add(trainer.evaluate(fb, k.anchors), k.batch->num_seqs());
  }
  return sums;
}

}  // namespace dflash
