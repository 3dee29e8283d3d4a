// How a hidden-state batch moves from a target's send buffer into a drafter's receive slot, under the
// credits of flow_control.h (docs/pipeline.md "Data planes"). The endpoints decide who sends what where;
// a plane only moves the bytes, and owns the send buffers and slots it moves them between.
//
// A plane never blocks: every call returns at once and the owner drives transfers by polling
// (receive_done / send_done) from its progress loop, which also drives MPI and checks deadlines.
#pragma once
#include <mpi.h>

#include <memory>
#include <string>

#include "dflash/hs_batch.h"
#include "dflash/tensor.h"

namespace dflash {

struct Topology;

// --data-plane: how hidden-state tensors travel from targets to drafters (setup_data_plane picks a DataPlaneKind).
enum class DataPlaneChoice : uint8_t {
  Auto,     // nccl when every target-drafter pair has GPUs of its own and NCCL initialises, else cuda-mpi when
            // the MPI library is CUDA-aware, else host
  Nccl,     // ncclSend/ncclRecv between the pair's GPUs
  CudaMpi,  // MPI_Isend/MPI_Irecv on device pointers (a CUDA-aware MPI only)
  Host,     // host MPI, device tensors staged through page-locked host memory
};
const char* data_plane_choice_name(DataPlaneChoice c);

enum class DataPlaneKind : uint8_t {
  Host,     // host MPI; device tensors are staged through page-locked host buffers (every cluster can)
  CudaMpi,  // MPI_Isend/MPI_Irecv straight on device pointers (a CUDA-aware MPI: UCX or smcuda move them)
  Nccl,     // headers on host MPI, tensors by ncclSend/ncclRecv on a stream per target-drafter pair
  Local,    // --topology colocated: the target and the drafter of one process share the batches (no transfer)
};
const char* data_plane_name(DataPlaneKind k);

// Whether the MPI library moves device memory: the headers it was compiled against say so
// (MPIX_CUDA_AWARE_SUPPORT) and the library loaded at run time agrees (MPIX_Query_cuda_support()).
struct CudaAwareMpi {
  bool compiled = false;  // mpi-ext.h: MPIX_CUDA_AWARE_SUPPORT 1
  bool runtime = false;   // MPIX_Query_cuda_support() == 1
  bool usable() const { return compiled && runtime; }
  std::string describe() const;  // "compile-time yes, run-time no"
};
CudaAwareMpi query_cuda_aware_mpi();

// The NCCL communicators of this rank's target-drafter pairs (opaque; data_plane_nccl.cpp). One per pair,
// not one per node: NCCL serialises every operation of a communicator, so with two targets and two
// drafters on a node, one communicator can order T1->D1 behind T1->D2 on one rank and T2->D2 behind
// T2->D1 on another, a cycle. Pairs never wait on each other.
class NcclPairs;

// --topology colocated: the receive slots and send buffers one process's target and drafter share
// (opaque; data_plane_local.cpp). A send hands the filled send buffer to the drafter's slot as it is
// (the buffers swap places: no copy, no host staging) and the drafter's slot is "received" at once; events
// order the drafter's reads after the forward that wrote the batch, and the next forward into a batch
// after the drafter step that read it (two streams of one GPU on CUDA). Made once per segment by the job.
class LocalSlots;
std::shared_ptr<LocalSlots> make_local_slots(const SlotShape& shape, int num_slots, int num_send_buffers, const Ctx& ctx);

// The job's plane, agreed by every rank. Collective over the world (idle ranks too: they only vote).
struct DataPlaneSetup {
  DataPlaneKind kind = DataPlaneKind::Host;
  std::string why;                   // one line for the startup table: how auto chose, what was refused
  std::shared_ptr<NcclPairs> nccl;   // the pairs' communicators (nccl only; targets and drafters)
};
// ctx: this rank's compute context (the CPU context on idle ranks).
DataPlaneSetup setup_data_plane(DataPlaneChoice choice, Device backend, const Topology& topo, const Ctx& ctx,
                                double timeout_s);

class DataPlane {
 public:
  virtual ~DataPlane() = default;
  virtual DataPlaneKind kind() const = 0;
  virtual int num_slots() const = 0;
  virtual int num_send_buffers() const = 0;

  // ---- drafter side: receive slots
  // Posts the receive of `slot` from `sender`, the world rank that holds the slot's credit (only it may
  // fill the slot).
  virtual void post_receive(int slot, int sender) = 0;
  virtual bool receive_posted(int slot) const = 0;
  virtual int receive_sender(int slot) const = 0;  // -1 when none is posted
  // Drives the slot's transfer; true once the whole batch is in slot(slot), its tensors on this rank's
  // device (the receive is then no longer posted).
  virtual bool receive_done(int slot) = 0;
  virtual void cancel_receive(int slot) = 0;
  virtual HsBatch& slot(int slot) = 0;

  // ---- target side: send buffers
  virtual HsBatch& send_buffer(int buf) = 0;
  // Sends send buffer `buf` (filled, header complete) into `drafter`'s `slot`, ordered after the work
  // enqueued on `producer` so far (the forward that wrote it) by an event: the host does not wait for it.
  virtual void post_send(int buf, const Ctx& producer, int drafter, int slot) = 0;
  // Drives the send; true once `buf` may be written again.
  virtual bool send_done(int buf) = 0;

  // A batch is moving (a send under way, or a receive whose header has arrived): the owner's progress
  // loop should poll without sleeping, since host MPI moves a large message only inside MPI calls.
  // Drives the sends (so one that completed stops counting). A send counts from post_send until it
  // completed, not until its buffer is next reused.
  virtual bool transfers_in_flight() = 0;
};

struct DataPlaneSpec {
  DataPlaneKind kind = DataPlaneKind::Host;
  NcclPairs* nccl = nullptr;      // the nccl plane's communicators (DataPlaneSetup::nccl)
  std::shared_ptr<LocalSlots> local;  // the local plane's shared batches (colocated)
  MPI_Comm comm = MPI_COMM_NULL;  // the world: credits, headers and host messages address world ranks
  Ctx ctx;                        // this rank's compute context: where the batches' tensors live
  SlotShape shape;
  int num_slots = 0;              // drafters: --hs-queue-depth
  int num_send_buffers = 0;       // targets: 2, so the forward of batch n+1 overlaps the send of batch n
};
std::unique_ptr<DataPlane> make_data_plane(const DataPlaneSpec& spec);

// The planes behind the factory (data_plane_mpi.cpp: Host and CudaMpi; cuda/data_plane_nccl.cpp: nccl;
// data_plane_local.cpp: Local, the drafter's side when spec.num_slots > 0, else the target's).
std::unique_ptr<DataPlane> make_mpi_data_plane(const DataPlaneSpec& spec);
std::unique_ptr<DataPlane> make_local_data_plane(const DataPlaneSpec& spec);

// The comm floor's CUDA factories (src/comm/cuda/data_plane_nccl.cpp): slots the CUDA library defines, null
// in a build without it (src/comm/no_cuda.cpp; src/core/cuda_entry.h tells the mechanism): the nccl
// plane, and every target-drafter pair's communicators (on failure null, *error saying why).
using MakeNcclDataPlane = std::unique_ptr<DataPlane>(const DataPlaneSpec& spec);
extern MakeNcclDataPlane* const make_nccl_data_plane;
struct Topology;
using MakeNcclPairs = std::shared_ptr<NcclPairs>(const Topology& topo, const Ctx& ctx, double timeout_s,
                                                 std::string* error);
extern MakeNcclPairs* const make_nccl_pairs;

}  // namespace dflash
