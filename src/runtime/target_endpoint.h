// The target's protocol endpoint (docs/pipeline.md "Protocol"), the mirror of DrafterEndpoint: its send
// buffers, the credits the drafters of its node grant (CreditWallet), the progress pump (credits, Stop,
// Fin, a stop signal sent to this rank), the deadlines of its waits, and the end-of-data handshake. It
// knows nothing of the model or the loader: the target loop (role_target.cpp) fills a send buffer, asks
// for a credit and sends.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "dflash/data_plane.h"
#include "dflash/flow_control.h"
#include "job.h"

namespace dflash {

class TargetEndpoint {
 public:
  // Owns `plane` (its send buffers are this target's). Listens for control messages from here on.
  TargetEndpoint(JobContext& job, std::unique_ptr<DataPlane> plane);
  ~TargetEndpoint();

  // Drives the transfers and every control message that has arrived: credits (kept in the wallet), Stop,
  // Fin; a stop signal sent to this rank alone goes on to the first drafter.
  void pump();
  // A drafter said Stop: the drafters have their steps, no more batches are needed.
  bool stopped() const { return stop_; }

  int num_send_buffers() const { return plane_->num_send_buffers(); }
  HsBatch& send_buffer(int buf) { return plane_->send_buffer(buf); }
  // The send buffer to fill next (they are used in turn); wait_sent(it) before writing into it.
  int next_buffer();
  // Waits (pumping) until buffer `buf`'s last batch is fully sent; `what` names the wait in the error
  // ("sending a batch": "... to drafter rank 3 did not complete"). Bounded by --peer-timeout.
  void wait_sent(int buf, const char* what);

  // Waits for a credit and takes it: of drafter `from`, or (from < 0) of any drafter of the node, the one
  // the wallet picks (a credit unused for a quarter of the deadline first). nullopt when a Stop came first.
  // Bounded by 1.5 x --peer-timeout (the drafters, which know which of them is silent, speak first);
  // then fatal LostPeer naming the drafters that granted nothing. eval_batch >= 0: a credit for that eval
  // batch (a Stop cannot come before training), named in the error.
  std::optional<Credit> take_credit(int from, int64_t eval_batch = -1);
  // Sends buffer `buf` (its header filled, all but the sequence number) into credit c; producer: the
  // context whose work wrote it (the plane's send waits for that work, the host does not).
  void send(int buf, const Ctx& producer, const Credit& c);

  // The end of this target's data (every buffer sent: wait_sent): EndOfData to every drafter of the node
  // with the count it was sent and the loader's end index, then waits for each one's Fin.
  void finish(int64_t end_index);

 private:
  template <class Done, class Why> void wait_until(Done done, Why why, double timeout_s);

  JobContext& job_;
  const Options& o_;
  const Topology& topo_;
  std::unique_ptr<DataPlane> plane_;
  int next_buf_ = 0;
  std::map<int, int> buf_dest_;  // send buffer -> the drafter its last batch went to
  CreditWallet wallet_;
  ControlMsg control_in_;
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::map<int, int64_t> sent_to_;  // batches sent to each drafter (the next one's BatchHeader::seq)
  std::map<int, mpi::Clock::time_point> last_credit_;
  bool stop_ = false, finishing_ = false;
  int fins_ = 0;
};

}  // namespace dflash
