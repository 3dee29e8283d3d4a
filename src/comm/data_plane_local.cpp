// The local plane (--topology colocated, data_plane.h): one process's target and drafter share Q + 2
// batches. A send swaps the filled send buffer with the drafter's posted slot (the target's forward wrote
// the captures where the drafter reads them: no MPI, no copy, no host staging on CUDA), so the credit
// protocol above it runs unchanged: the drafter grants a slot (post_receive), the target sends into it, the
// drafter's pump sees it done at once. Ordering on a GPU, without a host wait: a batch carries two events,
// `written` (recorded on the target's context after its forward) that the drafter's context waits for when
// the slot completes, and `read` (recorded on the drafter's context when it re-posts the slot, after the
// step that read it) that the target's context waits for before its next forward writes into that batch.
// The target and the drafter are two threads of the process, so every call takes the shared lock.
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dflash/data_plane.h"
#include "dflash/device_async.h"
#include "dflash/error.h"

namespace dflash {

class LocalSlots {
 public:
  struct Item {
    Item(const SlotShape& shape, const Ctx& ctx) : batch(std::make_unique<HsBatch>(shape)), written(ctx), read(ctx) {}
    std::unique_ptr<HsBatch> batch;
    Event written, read;
  };
  LocalSlots(const SlotShape& shape, int num_slots, int num_send_buffers, const Ctx& ctx)
      : sender(static_cast<size_t>(num_slots), -1), filled(static_cast<size_t>(num_slots), false) {
    for (int s = 0; s < num_slots; ++s) slots.emplace_back(shape, ctx);
    for (int b = 0; b < num_send_buffers; ++b) buffers.emplace_back(shape, ctx);
  }
  std::mutex mu;
  std::vector<Item> slots, buffers;
  std::vector<int> sender;    // per slot: the world rank whose credit it is (-1: no receive posted)
  std::vector<bool> filled;   // per slot: a batch was handed over and not yet taken by receive_done
};

std::shared_ptr<LocalSlots> make_local_slots(const SlotShape& shape, int num_slots, int num_send_buffers, const Ctx& ctx) {
  return std::make_shared<LocalSlots>(shape, num_slots, num_send_buffers, ctx);
}

namespace {

// One side's view of the shared batches: the drafter's (slots) or the target's (send buffers). ctx is that
// side's compute context: the one its events are recorded on and its work waits on.
class LocalDataPlane final : public DataPlane {
 public:
  LocalDataPlane(std::shared_ptr<LocalSlots> shared, const Ctx& ctx) : s_(std::move(shared)), ctx_(ctx) {}

  DataPlaneKind kind() const override { return DataPlaneKind::Local; }
  int num_slots() const override { return static_cast<int>(s_->slots.size()); }
  int num_send_buffers() const override { return static_cast<int>(s_->buffers.size()); }

  void post_receive(int slot, int sender) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    LocalSlots::Item& it = s_->slots.at(static_cast<size_t>(slot));
    it.read.record(ctx_);  // the drafter's work on this batch so far (the step that trained on it) is its last read
    s_->sender[static_cast<size_t>(slot)] = sender;
    s_->filled[static_cast<size_t>(slot)] = false;
  }
  bool receive_posted(int slot) const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->sender.at(static_cast<size_t>(slot)) >= 0;
  }
  int receive_sender(int slot) const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->sender.at(static_cast<size_t>(slot));
  }
  bool receive_done(int slot) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    const size_t i = static_cast<size_t>(slot);
    if (s_->sender.at(i) < 0 || !s_->filled[i]) return false;
    s_->slots[i].written.order_before(ctx_);  // the drafter's step on it waits for the forward that wrote it
    s_->sender[i] = -1;
    s_->filled[i] = false;
    return true;
  }
  void cancel_receive(int slot) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->sender.at(static_cast<size_t>(slot)) = -1;
    s_->filled[static_cast<size_t>(slot)] = false;
  }
  HsBatch& slot(int slot) override { return *s_->slots.at(static_cast<size_t>(slot)).batch; }

  HsBatch& send_buffer(int buf) override { return *s_->buffers.at(static_cast<size_t>(buf)).batch; }
  void post_send(int buf, const Ctx& producer, int drafter, int slot) override {
    std::lock_guard<std::mutex> lock(s_->mu);
    const size_t i = static_cast<size_t>(slot);
    DF_CHECK(s_->sender.at(i) >= 0 && !s_->filled[i], Internal,
             "a batch for slot " << slot << " of drafter rank " << drafter << ", which has no receive posted for it");
    LocalSlots::Item& b = s_->buffers.at(static_cast<size_t>(buf));
    b.written.record(producer);
    std::swap(b, s_->slots[i]);  // the batch is now the drafter's; the slot's old batch becomes this send buffer
    s_->filled[i] = true;
  }
  bool send_done(int buf) override {
    // The buffer's batch may still be read by the drafter step that trained on it: the next forward into
    // it waits for that step on the device; the host goes on at once.
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->buffers.at(static_cast<size_t>(buf)).read.order_before(ctx_);
    return true;
  }
  bool transfers_in_flight() override { return false; }  // nothing moves: a send completes as it is posted

 private:
  std::shared_ptr<LocalSlots> s_;
  Ctx ctx_;
};

}  // namespace

std::unique_ptr<DataPlane> make_local_data_plane(const DataPlaneSpec& spec) {
  DF_CHECK(spec.local != nullptr, Internal, "the local data plane without its shared batches");
  DF_CHECK(spec.num_slots == 0 || spec.num_slots == static_cast<int>(spec.local->slots.size()), Internal,
           "the local plane has " << spec.local->slots.size() << " slots, the drafter asked for " << spec.num_slots);
  return std::make_unique<LocalDataPlane>(spec.local, spec.ctx);
}

}  // namespace dflash
