// The MPI data planes: every part of a batch is a non-blocking MPI message.
//  - host: on the CPU backend the messages read and write the batch's own buffers; on CUDA the tensors are
//    staged through page-locked host buffers by a copy stream: send = D2H after the forward's event, then
//    MPI; receive = MPI, then H2D. Works on every cluster (no CUDA-aware MPI, no NCCL), at host-link speed.
//  - cuda-mpi: the tensor messages read and write device memory directly (a CUDA-aware MPI moves them by
//    CUDA IPC or UCX); a send is posted once the forward's event says the buffer is written, since MPI
//    knows nothing of streams.
// On the wire: the backend's dtype (bf16 on CUDA) or, with --hs-dtype fp8, the fp8 parts' bytes (hs_batch.h).
#include <array>
#include <deque>

#include "dflash/data_plane.h"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"
#include "dflash/mpi_typed.h"
#include "comm/batch_messages.h"

namespace dflash {
namespace {

// A batch is six messages: the four host parts (batch_messages.h), then the tensors; part p of slot s
// travels on tag kTagSlotBase + s * kSlotTags + p.
enum TensorPart : int { kFeatures = kHostParts, kFinalNorm, kParts };
static_assert(kParts <= kSlotTags, "a slot's messages need distinct tags");

// A wire part as MPI elements of its dtype (count and type from the element type, never bytes): F32 or BF16
// on the Backend wire, bytes on the fp8 wire (hs_batch.h).
MPI_Request isend_part(const void* p, const WirePart& w, int dest, int tag, MPI_Comm comm) {
  if (w.dtype == DType::F32) return mpi::isend(static_cast<const float*>(p), w.count, dest, tag, comm);
  if (w.dtype == DType::U8) return mpi::isend(static_cast<const uint8_t*>(p), w.count, dest, tag, comm);
  DF_CHECK(w.dtype == DType::BF16, Internal, "hidden states travel as F32, BF16 or fp8 bytes, not " << dtype_name(w.dtype));
  return mpi::isend(static_cast<const uint16_t*>(p), w.count, dest, tag, comm);
}
MPI_Request irecv_part(void* p, const WirePart& w, int source, int tag, MPI_Comm comm) {
  if (w.dtype == DType::F32) return mpi::irecv(static_cast<float*>(p), w.count, source, tag, comm);
  if (w.dtype == DType::U8) return mpi::irecv(static_cast<uint8_t*>(p), w.count, source, tag, comm);
  DF_CHECK(w.dtype == DType::BF16, Internal, "hidden states travel as F32, BF16 or fp8 bytes, not " << dtype_name(w.dtype));
  return mpi::irecv(static_cast<uint16_t*>(p), w.count, source, tag, comm);
}
size_t received_elements(const MPI_Status& st, DType t) {
  if (t == DType::F32) return mpi::received_count<float>(st);
  return t == DType::U8 ? mpi::received_count<uint8_t>(st) : mpi::received_count<uint16_t>(st);
}

class MpiDataPlane final : public DataPlane {
  // Staging: a send waits for its tensors (the D2H copy, or on cuda-mpi the forward itself).
  enum class State : uint8_t { Idle, Staging, Transferring, Uploading };

  struct Entry {
    Entry(const SlotShape& s, const Ctx& ctx, bool staged)
        : buf(s),
          produced(ctx),
          copied(ctx),
          stage_features(staged ? buf.features.t().nbytes() : 0, HostMemory::Pinned),
          stage_final_norm(staged && s.final_norm ? buf.final_norm.t().nbytes() : 0, HostMemory::Pinned) {
      req.fill(MPI_REQUEST_NULL);
    }
    HsBatch buf;
    Event produced, copied;  // the forward that wrote buf; the staging copy
    HostBuffer stage_features, stage_final_norm;
    std::array<MPI_Request, kParts> req;
    State state = State::Idle;
    int peer = -1;
    int tag = 0;
    bool header_in = false;  // receive: the header arrived, the bulk is on its way
  };

 public:
  explicit MpiDataPlane(const DataPlaneSpec& s)
      : kind_(s.kind),
        comm_(s.comm),
        ctx_(s.ctx),
        copy_(side_ctx(s.ctx)),
        staged_(s.kind == DataPlaneKind::Host && s.shape.device != Device::CPU) {
    DF_CHECK(s.shape.device == s.ctx.device, Internal, "the batches' tensors must live on the plane's device");
    DF_CHECK(s.kind == DataPlaneKind::Host || (s.kind == DataPlaneKind::CudaMpi && s.shape.device == Device::CUDA),
             Internal, "the MPI plane moves host tensors, or device tensors with a CUDA-aware MPI");
    int tag_ub_flag = 0;
    int* tag_ub = nullptr;
    DF_MPI(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &tag_ub_flag));
    DF_CHECK(!tag_ub_flag || kTagSlotBase + s.num_slots * kSlotTags <= *tag_ub, BadOptions,
             "--hs-queue-depth " << s.num_slots << " needs more MPI tags than this MPI offers (" << *tag_ub << ")");
    for (int i = 0; i < s.num_slots; ++i) slots_.emplace_back(s.shape, ctx_, staged_);
    for (int i = 0; i < s.num_send_buffers; ++i) sends_.emplace_back(s.shape, ctx_, staged_);
  }

  ~MpiDataPlane() override {
    for (auto& e : slots_)
      for (auto& r : e.req) mpi::cancel(r);
  }

  DataPlaneKind kind() const override { return kind_; }
  int num_slots() const override { return static_cast<int>(slots_.size()); }
  int num_send_buffers() const override { return static_cast<int>(sends_.size()); }
  HsBatch& slot(int s) override { return slots_.at(s).buf; }
  HsBatch& send_buffer(int b) override { return sends_.at(b).buf; }
  bool receive_posted(int s) const override { return slots_.at(s).state != State::Idle; }
  int receive_sender(int s) const override { return receive_posted(s) ? slots_.at(s).peer : -1; }

  void post_receive(int s, int sender) override {
    Entry& e = slots_.at(s);
    DF_ASSERT(e.state == State::Idle);
    HsBatch& b = e.buf;
    b.clear();
    const int tag = kTagSlotBase + s * kSlotTags;
    const WirePart features = b.feature_capacity(), final_norm = b.final_norm_capacity();
    irecv_host_parts(b, sender, tag, comm_, e.req.data());
    e.req[kFeatures] = irecv_part(staged_ ? e.stage_features.data() : features.data, features, sender, tag + kFeatures, comm_);
    e.req[kFinalNorm] = irecv_part(staged_ ? e.stage_final_norm.data() : final_norm.data, final_norm, sender,
                                   tag + kFinalNorm, comm_);
    e.peer = sender;
    e.header_in = false;
    e.state = State::Transferring;
  }

  bool receive_done(int s) override {
    Entry& e = slots_.at(s);
    if (e.state == State::Transferring) {
      if (!e.header_in) {
        e.header_in = mpi::test(e.req[kHeader]);
        if (!e.header_in) return false;
      }
      int done = 0;
      std::array<MPI_Status, kParts> st;
      DF_MPI(MPI_Testall(kParts, e.req.data(), &done, st.data()));
      if (!done) return false;
      check_counts(s, e, st);
      e.buf.set_filled();
      if (!staged_) {
        e.state = State::Idle;
        return true;
      }
      copy_bytes_async(copy_, e.buf.features.t().data, e.stage_features.data(), e.buf.feature_bytes());
      copy_bytes_async(copy_, e.buf.final_norm.t().data, e.stage_final_norm.data(), e.buf.final_norm_bytes());
      e.copied.record(copy_);
      e.state = State::Uploading;
    }
    if (e.state != State::Uploading || !e.copied.done()) return false;
    e.state = State::Idle;
    return true;
  }

  bool transfers_in_flight() override {
    for (const Entry& e : slots_)
      if ((e.state == State::Transferring && e.header_in) || e.state == State::Uploading) return true;
    bool sending = false;
    for (int b = 0; b < num_send_buffers(); ++b) sending = !send_done(b) || sending;
    return sending;
  }

  void cancel_receive(int s) override {
    Entry& e = slots_.at(s);
    for (auto& r : e.req) mpi::cancel(r);
    // An upload in flight finishes on its own (nothing waits for it); the slot is free either way.
    e.state = State::Idle;
    e.peer = -1;
  }

  void post_send(int b, const Ctx& producer, int drafter, int s) override {
    Entry& e = sends_.at(b);
    DF_ASSERT(e.state == State::Idle);
    const HsBatch& hb = e.buf;
    const BatchHeader& h = hb.header;
    DF_CHECK(h.num_tokens == hb.batch.num_tokens() && h.num_seqs == hb.batch.num_seqs(), Internal,
             "send buffer " << b << ": header and index arrays disagree");
    e.peer = drafter;
    e.tag = kTagSlotBase + s * kSlotTags;
    // The small parts go now; the drafter's receives for them are posted.
    isend_host_parts(hb, drafter, e.tag, comm_, e.req.data());
    e.produced.record(producer);  // CPU: already done
    e.state = State::Staging;
    if (staged_) {
      // D2H on the copy stream once the forward is done; the host goes on (send_done posts the tensors).
      e.produced.order_before(copy_);
      copy_bytes_async(copy_, e.stage_features.data(), hb.features.t().data, hb.feature_bytes());
      copy_bytes_async(copy_, e.stage_final_norm.data(), hb.final_norm.t().data, hb.final_norm_bytes());
      e.copied.record(copy_);
    }
    send_done(b);  // posts the tensors now when they are ready (always on the CPU backend)
  }

  bool send_done(int b) override {
    Entry& e = sends_.at(b);
    if (e.state == State::Idle) return true;
    if (e.state == State::Staging) {
      if (!(staged_ ? e.copied : e.produced).done()) return false;
      if (staged_) post_tensor_sends(e, e.stage_features.data(), e.stage_final_norm.data());
      else post_tensor_sends(e, e.buf.features.t().data, e.buf.final_norm.t().data);
    }
    int done = 0;
    DF_MPI(MPI_Testall(kParts, e.req.data(), &done, MPI_STATUSES_IGNORE));
    if (done) e.state = State::Idle;
    return done != 0;
  }

 private:
  void post_tensor_sends(Entry& e, const void* features, const void* final_norm) {
    const HsBatch& hb = e.buf;
    e.req[kFeatures] = isend_part(features, hb.feature_part(), e.peer, e.tag + kFeatures, comm_);
    e.req[kFinalNorm] = isend_part(final_norm, hb.final_norm_part(), e.peer, e.tag + kFinalNorm, comm_);
    e.state = State::Transferring;
  }

  // The header says how much of each buffer the sender filled; the messages must agree.
  void check_counts(int s, const Entry& e, const std::array<MPI_Status, kParts>& st) const {
    const BatchHeader& h = e.buf.header;
    const size_t T = static_cast<size_t>(h.num_tokens);
    // The parts' sizes for the header's token count (layers and width: set_filled checks them next).
    const auto part_fits = [&st](int p, const WirePart& w) { return received_elements(st[p], w.dtype) == w.count; };
    DF_CHECK(h.num_tokens > 0 && h.num_tokens <= e.buf.shape.max_tokens && mpi::received_count<int32_t>(st[kTokens]) == T &&
                 mpi::received_count<int32_t>(st[kCuSeqlens]) == static_cast<size_t>(h.num_seqs + 1) &&
                 mpi::received_count<uint8_t>(st[kLossMask]) == T && part_fits(kFeatures, e.buf.feature_part()) &&
                 part_fits(kFinalNorm, e.buf.final_norm_part()) && (h.has_final_norm != 0) == e.buf.shape.final_norm,
             Internal, "batch in slot " << s << " from rank " << e.peer << " does not match its header");
  }

  DataPlaneKind kind_;
  MPI_Comm comm_;
  Ctx ctx_, copy_;  // compute context (where batches live) and its copy stream
  bool staged_;     // host plane on CUDA: tensors go through page-locked host buffers
  std::deque<Entry> slots_, sends_;  // deque: entries never move (MPI and the copies hold pointers into them)
};

}  // namespace

std::unique_ptr<DataPlane> make_mpi_data_plane(const DataPlaneSpec& spec) { return std::make_unique<MpiDataPlane>(spec); }

}  // namespace dflash
