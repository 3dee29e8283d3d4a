// TargetEndpoint: see target_endpoint.h.
#include "target_endpoint.h"

#include <vector>

#include "dflash/checkpoint.h"  // forward_stop_signal
#include "dflash/error.h"
#include "dflash/message_tags.h"

namespace dflash {
namespace {

std::string ranks_str(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

}  // namespace

TargetEndpoint::TargetEndpoint(JobContext& job, std::unique_ptr<DataPlane> plane)
    : job_(job), o_(job.opt), topo_(job.topo), plane_(std::move(plane)) {
  for (int d : topo_.node_drafters) last_credit_[d] = mpi::Clock::now();
  control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToTarget, MPI_COMM_WORLD);
}

TargetEndpoint::~TargetEndpoint() = default;

void TargetEndpoint::pump() {
  forward_stop_signal(topo_.drafters.front());  // a signal sent to this rank alone still stops the job
  MPI_Status st;
  while (control_req_ != MPI_REQUEST_NULL && mpi::test(control_req_, &st)) {
    const int from = st.MPI_SOURCE;
    switch (control_in_.kind) {
      case ControlKind::Credit:
        if (!finishing_) wallet_.add(Credit{from, control_in_.slot, job_.elapsed()});
        last_credit_[from] = mpi::Clock::now();
        break;
      case ControlKind::Stop: stop_ = true; break;
      case ControlKind::Fin: fins_++; break;
      default: DF_FAIL(Internal, "target got control message " << static_cast<int>(control_in_.kind) << " from rank " << from, "");
    }
    control_req_ = mpi::irecv(&control_in_, 1, MPI_ANY_SOURCE, kTagToTarget, MPI_COMM_WORLD);
  }
}

template <class Done, class Why> void TargetEndpoint::wait_until(Done done, Why why, double timeout_s) {
  mpi::Polling polling;
  polling.progress = [&] { pump(); };
  polling.busy = [&] { return plane_->transfers_in_flight(); };  // poll without sleeping while a batch moves
  mpi::wait_until(done, timeout_s, why, polling,
                  "a drafter rank died or hangs; see its own error above, or raise --peer-timeout if it is just slow");
}

int TargetEndpoint::next_buffer() {
  const int buf = next_buf_;
  next_buf_ = (next_buf_ + 1) % plane_->num_send_buffers();
  return buf;
}

void TargetEndpoint::wait_sent(int buf, const char* what) {
  wait_until([&] { return plane_->send_done(buf); },
             [&] { return std::string(what) + " to drafter rank " + std::to_string(buf_dest_[buf]) + " did not complete"; },
             o_.peer_timeout_s);
}

std::optional<Credit> TargetEndpoint::take_credit(int from, int64_t eval_batch) {
  const bool training = eval_batch < 0;
  wait_until([&] { return (training && stop_) || (from >= 0 ? wallet_.held_from(from) > 0 : !wallet_.empty()); }, [&] {
    if (!training)
      return "lost peer: no credit from drafter rank " + std::to_string(from) + " for eval batch " + std::to_string(eval_batch);
    std::vector<int> silent;  // drafters that granted nothing within the deadline
    for (int d : topo_.node_drafters)
      if (mpi::seconds_since(last_credit_[d]) > o_.peer_timeout_s) silent.push_back(d);
    return "lost peer: no credit from drafter rank(s) " + ranks_str(silent.empty() ? topo_.node_drafters : silent) +
           " (they stopped consuming batches)";
  }, 1.5 * o_.peer_timeout_s);  // the drafters know which of them is silent: they get the first word
  if (training && stop_) return std::nullopt;
  // A credit unused for a quarter of the deadline goes first, whoever granted it.
  return from >= 0 ? wallet_.take_from(from) : wallet_.take(job_.elapsed(), o_.peer_timeout_s / 4);
}

void TargetEndpoint::send(int buf, const Ctx& producer, const Credit& c) {
  plane_->send_buffer(buf).header.seq = sent_to_[c.drafter];
  plane_->post_send(buf, producer, c.drafter, c.slot);
  buf_dest_[buf] = c.drafter;
  sent_to_[c.drafter]++;
}

void TargetEndpoint::finish(int64_t end_index) {
  finishing_ = true;
  std::vector<ControlMsg> eod(topo_.node_drafters.size());
  std::vector<MPI_Request> reqs(eod.size());
  for (size_t i = 0; i < eod.size(); ++i) {
    const int d = topo_.node_drafters[i];
    eod[i] = ControlMsg{ControlKind::EndOfData, -1, sent_to_[d], end_index};
    reqs[i] = mpi::isend(&eod[i], 1, d, kTagToDrafter, MPI_COMM_WORLD);
  }
  const int want = static_cast<int>(topo_.node_drafters.size());
  wait_until([&] {
    bool sent = true;
    for (auto& r : reqs) sent = mpi::test(r) && sent;
    return sent && fins_ == want;
  }, [&] { return "drafter rank(s) " + ranks_str(topo_.node_drafters) + " did not acknowledge end-of-data"; },
     o_.peer_timeout_s);
  mpi::cancel(control_req_);
}

}  // namespace dflash
