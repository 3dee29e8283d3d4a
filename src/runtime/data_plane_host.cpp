// The CPU backend's data plane: host MPI, non-blocking, receives pre-posted per slot.
#include <array>

#include "dflash/error.h"
#include "dflash/flow_control.h"
#include "dflash/mpi_typed.h"

namespace dflash {
namespace {

// A batch is six messages; part p of slot s travels on tag kTagSlotBase + s * kParts + p.
enum Part : int { kHeader, kTokens, kCuSeqlens, kLossMask, kFeatures, kFinalNorm, kParts };

class HostMpiDataPlane final : public DataPlane {
 public:
  HostMpiDataPlane(MPI_Comm comm, const SlotShape& shape, int num_slots, int num_send_buffers) : comm_(comm) {
    int tag_ub_flag = 0;
    int* tag_ub = nullptr;
    DF_MPI(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &tag_ub_flag));
    DF_CHECK(!tag_ub_flag || kTagSlotBase + num_slots * kParts <= *tag_ub, BadOptions,
             "--hs-queue-depth " << num_slots << " needs more MPI tags than this MPI offers (" << *tag_ub << ")");
    for (int i = 0; i < num_slots; ++i) slots_.emplace_back(shape);
    for (int i = 0; i < num_send_buffers; ++i) sends_.emplace_back(shape);
  }

  ~HostMpiDataPlane() override {
    for (auto& s : slots_)
      for (auto& r : s.req) mpi::cancel(r);
  }

  void post_receive(int slot) override {
    Entry& e = slots_.at(slot);
    WireBuffers& b = e.buf;
    const int tag = kTagSlotBase + slot * kParts;
    e.req[kHeader] = mpi::irecv(&b.header, 1, MPI_ANY_SOURCE, tag + kHeader, comm_);
    e.req[kTokens] = mpi::irecv(b.tokens.data(), b.tokens.size(), MPI_ANY_SOURCE, tag + kTokens, comm_);
    e.req[kCuSeqlens] = mpi::irecv(b.cu_seqlens.data(), b.cu_seqlens.size(), MPI_ANY_SOURCE, tag + kCuSeqlens, comm_);
    e.req[kLossMask] = mpi::irecv(b.loss_mask.data(), b.loss_mask.size(), MPI_ANY_SOURCE, tag + kLossMask, comm_);
    e.req[kFeatures] = mpi::irecv(b.features.data(), b.features.size(), MPI_ANY_SOURCE, tag + kFeatures, comm_);
    e.req[kFinalNorm] = mpi::irecv(b.final_norm.data(), b.final_norm.size(), MPI_ANY_SOURCE, tag + kFinalNorm, comm_);
    e.posted = true;
  }

  bool receive_done(int slot) override {
    Entry& e = slots_.at(slot);
    DF_ASSERT(e.posted);
    int done = 0;
    std::array<MPI_Status, kParts> st;
    DF_MPI(MPI_Testall(kParts, e.req.data(), &done, st.data()));
    if (!done) return false;
    e.posted = false;
    // The header says how much of each buffer the sender filled; the messages must agree.
    const BatchHeader& h = e.buf.header;
    const size_t T = static_cast<size_t>(h.num_tokens);
    DF_CHECK(h.num_tokens > 0 && h.num_tokens <= e.buf.shape.max_tokens && mpi::received_count<int32_t>(st[kTokens]) == T &&
                 mpi::received_count<int32_t>(st[kCuSeqlens]) == static_cast<size_t>(h.num_seqs + 1) &&
                 mpi::received_count<uint8_t>(st[kLossMask]) == T &&
                 mpi::received_count<float>(st[kFeatures]) == static_cast<size_t>(h.num_layers) * T * h.hidden &&
                 mpi::received_count<float>(st[kFinalNorm]) == (h.has_final_norm ? T * h.hidden : 0),
             Internal, "batch in slot " << slot << " from rank " << st[kHeader].MPI_SOURCE << " does not match its header");
    return true;
  }

  void cancel_receive(int slot) override {
    Entry& e = slots_.at(slot);
    for (auto& r : e.req) mpi::cancel(r);
    e.posted = false;
  }
  bool receive_posted(int slot) const override { return slots_.at(slot).posted; }
  WireBuffers& slot_buffers(int slot) override { return slots_.at(slot).buf; }

  void post_send(int buf, int drafter, int slot) override {
    Entry& e = sends_.at(buf);
    DF_ASSERT(!e.posted);
    const WireBuffers& b = e.buf;
    const BatchHeader& h = b.header;
    const size_t T = static_cast<size_t>(h.num_tokens);
    const int tag = kTagSlotBase + slot * kParts;
    e.req[kHeader] = mpi::isend(&b.header, 1, drafter, tag + kHeader, comm_);
    e.req[kTokens] = mpi::isend(b.tokens.data(), T, drafter, tag + kTokens, comm_);
    e.req[kCuSeqlens] = mpi::isend(b.cu_seqlens.data(), static_cast<size_t>(h.num_seqs + 1), drafter, tag + kCuSeqlens, comm_);
    e.req[kLossMask] = mpi::isend(b.loss_mask.data(), T, drafter, tag + kLossMask, comm_);
    e.req[kFeatures] = mpi::isend(b.features.data(), static_cast<size_t>(h.num_layers) * T * h.hidden, drafter, tag + kFeatures, comm_);
    e.req[kFinalNorm] = mpi::isend(b.final_norm.data(), h.has_final_norm ? T * h.hidden : 0, drafter, tag + kFinalNorm, comm_);
    e.posted = true;
  }

  bool send_done(int buf) override {
    Entry& e = sends_.at(buf);
    if (!e.posted) return true;
    int done = 0;
    DF_MPI(MPI_Testall(kParts, e.req.data(), &done, MPI_STATUSES_IGNORE));
    if (done) e.posted = false;
    return done != 0;
  }
  WireBuffers& send_buffers(int buf) override { return sends_.at(buf).buf; }
  int num_send_buffers() const override { return static_cast<int>(sends_.size()); }

 private:
  struct Entry {
    explicit Entry(const SlotShape& s) : buf(s) { req.fill(MPI_REQUEST_NULL); }
    WireBuffers buf;
    std::array<MPI_Request, kParts> req;
    bool posted = false;
  };
  MPI_Comm comm_;
  std::deque<Entry> slots_, sends_;  // deque: entries never move (MPI holds pointers into them)
};

}  // namespace

std::unique_ptr<DataPlane> make_host_mpi_data_plane(MPI_Comm comm, const SlotShape& shape, int num_slots,
                                                    int num_send_buffers) {
  return std::make_unique<HostMpiDataPlane>(comm, shape, num_slots, num_send_buffers);
}

}  // namespace dflash
