// The nccl data plane (data_plane.h): credits, headers and the index arrays stay on host MPI; the tensors
// go GPU to GPU by ncclSend/ncclRecv, each target-drafter pair on a communicator and a stream of its own.
//
// Hazards it is built around (docs/pipeline.md "Data planes"):
//  - NCCL matches a pair's operations in the order each side issues them: a target issues its sends to a
//    drafter in post order (= BatchHeader::seq), the drafter its receives from that target in seq order
//    (PairOrder), whatever order it notices the headers in.
//  - The communicators are non-blocking (config.blocking = 0): no NCCL call can hang the host, which keeps
//    driving MPI (the index arrays are host messages) and its deadlines. A call that returns
//    ncclInProgress is still being enqueued; the next call on that communicator waits until
//    ncclCommGetAsyncError says it is done, and only then is the completion event recorded.
//  - Pairs never wait on each other: a send's stream waits only on the forward that wrote the buffer, the
//    drafter's compute stream only on the host having seen the receive complete.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "dflash/data_plane.h"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"
#include "dflash/mpi_typed.h"
#include "dflash/pair_order.h"
#include "dflash/topology.h"
#include "comm/batch_messages.h"
#include "nccl_comm.h"

namespace dflash {

// One target-drafter pair: a 2-rank communicator (the target is rank 0, the drafter rank 1) and a stream.
struct NcclPair {
  int peer = -1;  // world rank of the other side
  int peer_in_comm = -1;
  NcclComm comm;
  Ctx ctx;        // this rank's context on the pair's own stream
};

class NcclPairs {
 public:
  // Every target and drafter of a node sets up a communicator with each partner on the node; collective
  // over those ranks (idle ranks take no part). Never fatal on an NCCL failure: error() says what went
  // wrong, so --data-plane auto can fall back.
  NcclPairs(const Topology& topo, const Ctx& ctx, double timeout_s) : ctx_(ctx) {
    const bool target = topo.role == Role::Target;
    const std::vector<int>& partners = target ? topo.node_drafters : topo.node_targets;
    if (partners.empty()) return;
    DF_CUDA(cudaSetDevice(cuda::backend_of(ctx).device));
    std::vector<ncclUniqueId> ids(partners.size());
    std::vector<MPI_Request> reqs(partners.size(), MPI_REQUEST_NULL);
    bool id_failed = false;
    for (size_t i = 0; i < partners.size(); ++i) {
      if (target) {
        const ncclResult_t r = ncclGetUniqueId(&ids[i]);
        if (r != ncclSuccess) {
          error_ = "ncclGetUniqueId: " + nccl_error(nullptr, r);
          id_failed = true;  // still send: the drafter must not wait for an id that never comes
        }
        reqs[i] = mpi::isend(&ids[i], 1, partners[i], kTagNcclId, MPI_COMM_WORLD);
      } else {
        reqs[i] = mpi::irecv(&ids[i], 1, partners[i], kTagNcclId, MPI_COMM_WORLD);
      }
    }
    for (size_t i = 0; i < partners.size(); ++i)
      mpi::wait(reqs[i], timeout_s, [&] {
        return "lost peer: rank " + std::to_string(partners[i]) + " did not take part in the NCCL data plane's setup";
      });
    if (id_failed) return;
    for (size_t i = 0; i < partners.size(); ++i) {
      NcclPair& p = pairs_[partners[i]];
      p.peer = partners[i];
      p.peer_in_comm = target ? 1 : 0;
      p.ctx = ctx;
      cudaStream_t s = nullptr;
      DF_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      p.ctx.stream = s;
      if (!p.comm.begin(ids[i], 2, target ? 0 : 1, timeout_s) && error_.empty())
        error_ = "ncclCommInitRankConfig with rank " + std::to_string(p.peer) + ": " + p.comm.error();
    }
    // The inits run in the background; all of them at once, so no order between pairs can deadlock.
    const mpi::Deadline deadline(timeout_s);
    for (auto& [peer, p] : pairs_) {
      if (!error_.empty()) break;
      switch (p.comm.wait_ready(std::max(1e-3, timeout_s - deadline.elapsed()))) {
        case NcclComm::Setup::Ready: break;
        case NcclComm::Setup::Failed: error_ = "NCCL setup with rank " + std::to_string(peer) + ": " + p.comm.error(); break;
        case NcclComm::Setup::TimedOut:
          error_ = "NCCL setup with rank " + std::to_string(peer) + " did not finish within " +
                   std::to_string(static_cast<int>(timeout_s)) + " s";
          break;
      }
    }
    if (!error_.empty()) abort();
  }

  ~NcclPairs() {
    for (auto& [peer, p] : pairs_) p.comm.close();  // finalized (bounded) and destroyed before their streams go
    release_streams();
  }

  const std::string& error() const { return error_; }
  NcclPair& pair(int peer) {
    auto it = pairs_.find(peer);
    DF_CHECK(it != pairs_.end() && static_cast<bool>(it->second.comm), Internal, "no NCCL communicator with rank " << peer);
    return it->second;
  }
  // A peer is lost or a transfer failed: abandon every communicator so this rank can report and exit.
  void abort() {
    for (auto& [peer, p] : pairs_) p.comm.abort();
  }

 private:
  void release_streams() {
    for (auto& [peer, p] : pairs_)
      if (p.ctx.stream) cudaStreamDestroy(static_cast<cudaStream_t>(p.ctx.stream)), p.ctx.stream = nullptr;
  }

  Ctx ctx_;
  std::map<int, NcclPair> pairs_;  // by the partner's world rank
  std::string error_;
};

namespace {
std::shared_ptr<NcclPairs> make_pairs(const Topology& topo, const Ctx& ctx, double timeout_s, std::string* error) {
  auto pairs = std::make_shared<NcclPairs>(topo, ctx, timeout_s);
  if (pairs->error().empty()) return pairs;
  *error = pairs->error();
  return nullptr;
}
}  // namespace

MakeNcclPairs* const make_nccl_pairs = &make_pairs;

namespace {

ncclDataType_t nccl_type(DType t) {
  DF_CHECK(t == DType::BF16 || t == DType::F32 || t == DType::U8, Internal,
           "hidden states travel as F32, BF16 or fp8 bytes, not " << dtype_name(t));
  return t == DType::BF16 ? ncclBfloat16 : t == DType::U8 ? ncclUint8 : ncclFloat32;
}

class NcclDataPlane final : public DataPlane {
  // Queued: waiting for its turn on the pair; Enqueuing: NCCL still enqueuing it; Moving: on the stream.
  enum class State : uint8_t { Idle, AwaitHeader, Queued, Enqueuing, Moving };

  struct Entry {
    Entry(const SlotShape& s, const Ctx& ctx, bool send) : outgoing(send), buf(s), produced(ctx), moved(ctx) {
      req.fill(MPI_REQUEST_NULL);
    }
    const bool outgoing;  // a send buffer (else a receive slot)
    HsBatch buf;
    Event produced, moved;  // the forward that wrote buf (sends); the NCCL transfer, on the pair's stream
    std::array<MPI_Request, kHostParts> req;
    State state = State::Idle;
    int peer = -1;
  };

  // One pair's NCCL operations, issued strictly one after another in this order.
  struct Lane {
    NcclPair* pair = nullptr;
    std::deque<Entry*> queue;
    Entry* enqueuing = nullptr;
    PairOrder order;  // drafter side: receives in the target's send order
  };

 public:
  explicit NcclDataPlane(const DataPlaneSpec& s) : comm_(s.comm), ctx_(s.ctx), pairs_(s.nccl) {
    DF_CHECK(pairs_ && s.ctx.device == Device::CUDA && s.shape.device == Device::CUDA, Internal,
             "the nccl plane needs the CUDA backend and the pairs' communicators");
    for (int i = 0; i < s.num_slots; ++i) slots_.emplace_back(s.shape, ctx_, false);
    for (int i = 0; i < s.num_send_buffers; ++i) sends_.emplace_back(s.shape, ctx_, true);
  }
  ~NcclDataPlane() override {
    for (auto& e : slots_)
      for (auto& r : e.req) mpi::cancel(r);
  }

  DataPlaneKind kind() const override { return DataPlaneKind::Nccl; }
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
    irecv_host_parts(b, sender, tag, comm_, e.req.data());
    e.peer = sender;
    e.state = State::AwaitHeader;
  }

  bool receive_done(int s) override {
    Entry& e = slots_.at(s);
    if (e.state == State::AwaitHeader) {
      if (!mpi::test(e.req[kHeader])) return false;
      check_header(s, e);
      // The receive is issued once every earlier batch of this sender has been (NCCL matches in order).
      Lane& lane = lane_of(e.peer);
      e.state = State::Queued;
      lane.order.arrived(e.buf.header.seq, s);
      for (int next; (next = lane.order.take_next()) >= 0;) lane.queue.push_back(&slots_.at(next));
    }
    if (e.state == State::Queued || e.state == State::Enqueuing) drive(lane_of(e.peer));
    if (e.state != State::Moving || !e.moved.done()) return false;
    int done = 0;
    std::array<MPI_Status, kHostParts> st;
    DF_MPI(MPI_Testall(kHostParts, e.req.data(), &done, st.data()));
    if (!done) return false;
    check_counts(s, e, st);
    e.buf.set_filled();
    e.state = State::Idle;
    return true;
  }

  void cancel_receive(int s) override {
    Entry& e = slots_.at(s);
    // Only a slot whose header never came is cancelled (the sender ended its data); one whose tensors are
    // on their way cannot be called back from NCCL.
    DF_CHECK(e.state == State::Idle || e.state == State::AwaitHeader, Internal,
             "slot " << s << ": cancelling a receive whose batch from rank " << e.peer << " is already moving");
    for (auto& r : e.req) mpi::cancel(r);
    e.state = State::Idle;
    e.peer = -1;
  }

  void post_send(int b, const Ctx& producer, int drafter, int s) override {
    Entry& e = sends_.at(b);
    DF_ASSERT(e.state == State::Idle);
    const HsBatch& hb = e.buf;
    DF_CHECK(hb.header.num_tokens == hb.batch.num_tokens() && hb.header.num_seqs == hb.batch.num_seqs(), Internal,
             "send buffer " << b << ": header and index arrays disagree");
    e.peer = drafter;
    const int tag = kTagSlotBase + s * kSlotTags;
    isend_host_parts(hb, drafter, tag, comm_, e.req.data());
    // The pair's stream waits for the forward that wrote the buffer; the host does not.
    Lane& lane = lane_of(drafter);
    e.produced.record(producer);
    e.produced.order_before(lane.pair->ctx);
    e.state = State::Queued;
    lane.queue.push_back(&e);
    drive(lane);
  }

  bool send_done(int b) override {
    Entry& e = sends_.at(b);
    if (e.state == State::Idle) return true;
    if (e.state == State::Queued || e.state == State::Enqueuing) drive(lane_of(e.peer));
    if (e.state != State::Moving || !e.moved.done()) return false;
    int done = 0;
    DF_MPI(MPI_Testall(kHostParts, e.req.data(), &done, MPI_STATUSES_IGNORE));
    if (done) e.state = State::Idle;
    return done != 0;
  }

  bool transfers_in_flight() override {
    bool moving = false;
    for (auto& [peer, lane] : lanes_) drive(lane);
    for (const Entry& e : slots_) moving = moving || (e.state != State::Idle && e.state != State::AwaitHeader);
    for (int b = 0; b < num_send_buffers(); ++b) moving = !send_done(b) || moving;
    return moving;
  }

 private:
  Lane& lane_of(int peer) {
    Lane& l = lanes_[peer];
    if (!l.pair) l.pair = &pairs_->pair(peer);
    return l;
  }

  // Issues the lane's operations in order, one at a time: the next waits until NCCL has enqueued the last.
  void drive(Lane& lane) {
    for (;;) {
      if (Entry* e = lane.enqueuing) {
        if (async_state(*lane.pair) == ncclInProgress) return;
        e->moved.record(lane.pair->ctx);
        e->state = State::Moving;
        lane.enqueuing = nullptr;
      }
      if (lane.queue.empty()) return;
      Entry* e = lane.queue.front();
      lane.queue.pop_front();
      issue(*lane.pair, *e);
      e->state = State::Enqueuing;
      lane.enqueuing = e;
    }
  }

  void issue(NcclPair& p, Entry& e) {
    const HsBatch& hb = e.buf;
    const bool send = e.outgoing;
    // The parts' sizes follow the header's token count (check_header ran on a receive).
    const WirePart features = hb.feature_part(), final_norm = hb.final_norm_part();
    const size_t n_features = features.count, n_final = final_norm.count;
    const ncclDataType_t t = nccl_type(features.dtype);
    cudaStream_t stream = cuda::stream_of(p.ctx);
    ncclComm_t c = p.comm.get();
    const std::string with = " with rank " + std::to_string(p.peer);
    DF_NCCL(p.comm, ncclGroupStart(), "ncclGroupStart" + with, kHint);
    if (send) {
      DF_NCCL(p.comm, ncclSend(hb.features.t().data, n_features, t, p.peer_in_comm, c, stream), "ncclSend" + with, kHint);
      if (n_final) DF_NCCL(p.comm, ncclSend(hb.final_norm.t().data, n_final, t, p.peer_in_comm, c, stream), "ncclSend" + with, kHint);
    } else {
      DF_NCCL(p.comm, ncclRecv(hb.features.t().data, n_features, t, p.peer_in_comm, c, stream), "ncclRecv" + with, kHint);
      if (n_final) DF_NCCL(p.comm, ncclRecv(hb.final_norm.t().data, n_final, t, p.peer_in_comm, c, stream), "ncclRecv" + with, kHint);
    }
    DF_NCCL(p.comm, ncclGroupEnd(), "ncclGroupEnd" + with, kHint);
  }

  // ncclSuccess or ncclInProgress; any other state is fatal.
  ncclResult_t async_state(NcclPair& p) {
    const ncclResult_t st = p.comm.state();
    DF_NCCL(p.comm, st, "an NCCL transfer with rank " + std::to_string(p.peer), kHint);
    return st;
  }

  static constexpr const char* kHint =
      "the GPU, its link or the peer failed; see the other ranks' errors, and rerun with NCCL_DEBUG=WARN";

  // The receive's counts come from the header: a header that does not fit the slot would overrun it.
  void check_header(int s, const Entry& e) const {
    const BatchHeader& h = e.buf.header;
    const SlotShape& sh = e.buf.shape;
    DF_CHECK(h.num_tokens > 0 && h.num_tokens <= sh.max_tokens && h.num_layers == sh.num_layers && h.hidden == sh.hidden &&
                 h.has_final_norm == (sh.final_norm ? 1 : 0) && h.seq >= 0,
             Internal, "batch header in slot " << s << " from rank " << e.peer << " does not fit the slot (" << h.num_tokens
                                               << " tokens, " << h.num_layers << " layers, hidden " << h.hidden << ")");
  }
  void check_counts(int s, const Entry& e, const std::array<MPI_Status, kHostParts>& st) const {
    const BatchHeader& h = e.buf.header;
    const size_t T = static_cast<size_t>(h.num_tokens);
    DF_CHECK(mpi::received_count<int32_t>(st[kTokens]) == T &&
                 mpi::received_count<int32_t>(st[kCuSeqlens]) == static_cast<size_t>(h.num_seqs + 1) &&
                 mpi::received_count<uint8_t>(st[kLossMask]) == T,
             Internal, "batch in slot " << s << " from rank " << e.peer << " does not match its header");
  }

  MPI_Comm comm_;
  Ctx ctx_;
  NcclPairs* pairs_;
  std::deque<Entry> slots_, sends_;  // deque: entries never move (MPI, NCCL and the lanes hold pointers)
  std::map<int, Lane> lanes_;        // by the partner's world rank
};

std::unique_ptr<DataPlane> make_plane(const DataPlaneSpec& spec) { return std::make_unique<NcclDataPlane>(spec); }

}  // namespace

MakeNcclDataPlane* const make_nccl_data_plane = &make_plane;

}  // namespace dflash
