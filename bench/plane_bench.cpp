// dflash-plane-bench: moves hidden-state batches from a target rank to a drafter rank through the job's
// own data planes (data_plane.h), under credits as the job does, checks the bytes and reports the rate
// against a device-to-device copy of the same size on the drafter's GPU and, when the two ranks have a GPU
// each, against raw ncclSend/ncclRecv of the same bytes (no credits, headers or index arrays) in the same
// run (the bench writer of bench_common.h: `# ` metadata, a fixed-width row per plane, --json for JSON lines;
// exit 1 when a check fails; the drafter regenerates the expected bytes from the seed).
//
//   mpirun -np 2 dflash-plane-bench [--planes host,cuda-mpi,nccl] [--layers 5 --tokens 32768 --hidden 5120]
//                                   [--iters 10 --warmup 3 --depth 2 --seed 1] [--json]
// Rank 0 is the target, rank 1 the drafter (topology 1-1); both may share one GPU (host, cuda-mpi), nccl
// needs two. A plane that cannot run here is listed with the reason and skipped, unless named with
// --require, which makes that an error.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dflash/backend.h"
#include "dflash/data_plane.h"
#include "dflash/device_async.h"
#include "dflash/error.h"
#include "dflash/message_tags.h"
#include "dflash/mpi_typed.h"
#include "dflash/topology.h"
#include "backend.cuh"
#include "bench_common.h"
#include "random_fill.cuh"

using namespace dflash;

namespace {

struct Args {
  std::vector<std::string> planes = {"host", "cuda-mpi", "nccl"};
  std::vector<std::string> required;
  int64_t layers = 5, tokens = 32768, hidden = 5120;
  int iters = 10, warmup = 3, depth = 2;
  uint64_t seed = 1;
  double timeout_s = 120;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) out.push_back(x);
  return out;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    DF_CHECK_HINT(i + 1 < argc, BadOptions, k << " needs a value", "see the usage at the top of bench/plane_bench.cpp");
    const std::string v = argv[++i];
    if (k == "--planes") a.planes = split(v);
    else if (k == "--require") a.required = split(v);
    else if (k == "--layers") a.layers = std::stoll(v);
    else if (k == "--tokens") a.tokens = std::stoll(v);
    else if (k == "--hidden") a.hidden = std::stoll(v);
    else if (k == "--iters") a.iters = std::stoi(v);
    else if (k == "--warmup") a.warmup = std::stoi(v);
    else if (k == "--depth") a.depth = std::stoi(v);
    else if (k == "--seed") a.seed = std::stoull(v);
    else if (k == "--timeout") a.timeout_s = std::stod(v);
    else DF_FAIL(BadOptions, "unknown option " << k, "see the usage at the top of bench/plane_bench.cpp");
  }
  DF_CHECK(a.iters >= 2 && a.warmup >= 1 && a.depth >= 1 && a.layers >= 1 && a.tokens >= 2 && a.hidden >= 1, BadOptions,
           "bad sizes");
  return a;
}

using bench::median;

// What send buffer b holds: features and final norm from the seed, one sequence of random tokens.
uint64_t buffer_seed(const Args& a, int64_t batch_index) { return a.seed * 1000 + static_cast<uint64_t>(batch_index % 2); }
PackedBatch index_arrays(const Args& a, uint64_t seed) {
  PackedBatch b;
  std::mt19937_64 rng(seed);
  b.tokens.resize(static_cast<size_t>(a.tokens));
  for (auto& t : b.tokens) t = static_cast<int32_t>(rng() % 151936);
  b.cu_seqlens = {0, static_cast<int32_t>(a.tokens)};
  b.loss_mask.assign(static_cast<size_t>(a.tokens), 1);
  return b;
}

DataPlaneChoice choice_of(const std::string& p) {
  if (p == "host") return DataPlaneChoice::Host;
  if (p == "cuda-mpi") return DataPlaneChoice::CudaMpi;
  if (p == "nccl") return DataPlaneChoice::Nccl;
  DF_FAIL(BadOptions, "unknown plane " << p, "--planes takes host, cuda-mpi, nccl");
}

// Why a plane cannot run here ("" = it can). Same answer on both ranks.
std::string unavailable(const std::string& plane, const Topology& topo) {
  if (plane == "cuda-mpi") {
    const CudaAwareMpi m = query_cuda_aware_mpi();
    int32_t ok = m.usable() ? 1 : 0;
    mpi::allreduce(&ok, 1, MPI_MIN, MPI_COMM_WORLD);
    return ok ? "" : "MPI not CUDA-aware (" + m.describe() + ")";
  }
  if (plane == "nccl") {
    int32_t gpus[2] = {topo.gpu, -topo.gpu};  // max and -min of the two ranks' devices
    mpi::allreduce(gpus, 2, MPI_MAX, MPI_COMM_WORLD);
    return gpus[0] == -gpus[1] ? "both ranks on one GPU (NCCL needs two)" : "";
  }
  return "";
}

// The drafter's GPU copying the same bytes device to device: the yardstick.
double d2d_copy_ms(const Ctx& ctx, size_t bytes, const Args& a) {
  Buffer src(Device::CUDA, DType::BF16, {static_cast<int64_t>(bytes / 2)}), dst(Device::CUDA, DType::BF16, {static_cast<int64_t>(bytes / 2)});
  cuda::fill_random(ctx, src.t(), a.seed, 0.f, 1.f);
  std::vector<double> ms;
  Event t0(ctx, true), t1(ctx, true);
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    t0.record(ctx);
    copy_bytes_async(ctx, dst.t().data, src.t().data, bytes);
    t1.record(ctx);
    while (!t1.done()) {
    }
    if (i >= a.warmup) ms.push_back(Event::elapsed_ms(t0, t1));
  }
  return median(ms);
}

// Raw ncclSend (target) / ncclRecv (drafter) of `bytes` between the two ranks' GPUs on a blocking 2-rank
// communicator of its own: the ceiling the nccl plane is held against (issue "Two-GPU measurements":
// the plane >= 90% of it). Each transfer starts after a barrier; the drafter times its receive with CUDA
// events (median). Returns 0 on the target. Needs a GPU per rank (the caller checks).
double raw_nccl_ms(const Ctx& ctx, const Topology& topo, size_t bytes, const Args& a) {
  const bool drafter = topo.role == Role::Drafter;
  const int peer = drafter ? topo.node_targets.at(0) : topo.node_drafters.at(0);  // = its rank in comm
  DF_CHECK(cudaSetDevice(cuda::backend_of(ctx).device) == cudaSuccess, DeviceFailure, "cudaSetDevice");
  ncclUniqueId id{};
  if (topo.world_rank == 0) DF_CHECK(ncclGetUniqueId(&id) == ncclSuccess, DeviceFailure, "ncclGetUniqueId");
  mpi::bcast(reinterpret_cast<char*>(&id), sizeof id, 0, MPI_COMM_WORLD);
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRank(&comm, 2, id, topo.world_rank);
  DF_CHECK(init == ncclSuccess, DeviceFailure, "ncclCommInitRank: " << ncclGetErrorString(init));
  const size_t n = bytes / 2;  // bf16 elements: NCCL counts elements, not bytes
  Buffer buf(Device::CUDA, DType::BF16, {static_cast<int64_t>(n)});
  cudaStream_t st = static_cast<cudaStream_t>(ctx.stream);
  Event t0(ctx, true), t1(ctx, true);
  std::vector<double> ms;
  for (int i = 0; i < a.warmup + a.iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    t0.record(ctx);
    const ncclResult_t r = drafter ? ncclRecv(buf.t().data, n, ncclBfloat16, peer, comm, st)
                                   : ncclSend(buf.t().data, n, ncclBfloat16, peer, comm, st);
    DF_CHECK(r == ncclSuccess, DeviceFailure, (drafter ? "ncclRecv: " : "ncclSend: ") << ncclGetErrorString(r));
    t1.record(ctx);
    while (!t1.done()) {
    }
    if (i >= a.warmup) ms.push_back(Event::elapsed_ms(t0, t1));
  }
  ncclCommDestroy(comm);
  return drafter ? median(ms) : 0;
}

// Drafter: the received batch equals what the target's buffer held (regenerated here from the seed).
bool batch_matches(const Ctx& ctx, const HsBatch& got, const Args& a, Buffer& scratch, HostBuffer& h_got, HostBuffer& h_want) {
  const uint64_t seed = buffer_seed(a, got.header.batch_index);
  const PackedBatch want = index_arrays(a, seed);
  if (got.batch.tokens != want.tokens || got.batch.cu_seqlens != want.cu_seqlens || got.batch.loss_mask != want.loss_mask) return false;
  const Tensor f = got.features_view();
  const Tensor w(scratch.t().data, f.dtype, f.device, {static_cast<int64_t>(f.numel())});
  cuda::fill_random(ctx, w, seed, 0.f, 1.f);
  copy_bytes_async(ctx, h_want.data(), w.data, w.nbytes());
  copy_bytes_async(ctx, h_got.data(), f.data, f.nbytes());
  Event e(ctx);
  e.record(ctx);
  while (!e.done()) {
  }
  return std::memcmp(h_got.data(), h_want.data(), f.nbytes()) == 0;
}

struct Result {
  double ms = 0;  // median interval between completed batches, steady state
  bool checked_ok = true;
};

Result run_target(DataPlane& plane, const Ctx& ctx, const Topology& topo, const Args& a) {
  const int drafter = topo.node_drafters.at(0);
  for (int b = 0; b < plane.num_send_buffers(); ++b) {
    HsBatch& hb = plane.send_buffer(b);
    const uint64_t seed = buffer_seed(a, b);
    hb.fill_from(index_arrays(a, seed));
    cuda::fill_random(ctx, hb.features.t(), seed, 0.f, 1.f);
  }
  const int total = a.warmup + a.iters;
  for (int sent = 0; sent < total; ++sent) {
    ControlMsg credit;
    MPI_Request r = mpi::irecv(&credit, 1, drafter, kTagToTarget, MPI_COMM_WORLD);
    mpi::wait(r, a.timeout_s, [] { return std::string("lost peer: the drafter sent no credit"); }, [&] { plane.transfers_in_flight(); });
    const int b = sent % plane.num_send_buffers();
    mpi::Deadline d(a.timeout_s);
    while (!plane.send_done(b)) DF_CHECK(!d.expired(), LostPeer, "send buffer " << b << " never drained");
    HsBatch& hb = plane.send_buffer(b);
    hb.header.seq = sent;
    hb.header.batch_index = sent;
    plane.post_send(b, ctx, drafter, credit.slot);
  }
  mpi::Deadline d(a.timeout_s);
  while (plane.transfers_in_flight()) DF_CHECK(!d.expired(), LostPeer, "the last sends never completed");
  return {};
}

Result run_drafter(DataPlane& plane, const Ctx& ctx, const Topology& topo, const Args& a, size_t bytes) {
  const int target = topo.node_targets.at(0);
  const int total = a.warmup + a.iters;
  Buffer scratch(Device::CUDA, DType::BF16, {a.layers, a.tokens, a.hidden});
  HostBuffer h_got(bytes, HostMemory::Pinned), h_want(bytes, HostMemory::Pinned);
  std::vector<ControlMsg> credits(static_cast<size_t>(plane.num_slots()));
  std::vector<MPI_Request> credit_reqs(credits.size(), MPI_REQUEST_NULL);
  int granted = 0, received = 0;
  auto grant = [&](int s) {
    if (granted >= total) return;
    plane.post_receive(s, target);
    mpi::wait(credit_reqs[s], a.timeout_s, [] { return std::string("lost peer: a credit never left"); });
    credits[s] = ControlMsg{ControlKind::Credit, s, 0, -1};
    credit_reqs[s] = mpi::isend(&credits[s], 1, target, kTagToTarget, MPI_COMM_WORLD);
    ++granted;
  };
  for (int s = 0; s < plane.num_slots(); ++s) grant(s);
  Result res;
  std::vector<double> intervals;
  auto last = mpi::Clock::now();
  mpi::Deadline d(a.timeout_s);
  while (received < total) {
    for (int s = 0; s < plane.num_slots() && received < total; ++s) {
      if (!plane.receive_posted(s) || !plane.receive_done(s)) continue;
      const auto now = mpi::Clock::now();
      const HsBatch& hb = plane.slot(s);
      // Warm-up batches are checked byte for byte (the check's time is not counted); timed ones by header.
      const bool checked = received < a.warmup;
      if (checked) res.checked_ok = batch_matches(ctx, hb, a, scratch, h_got, h_want) && res.checked_ok;
      res.checked_ok = res.checked_ok && hb.header.seq == received;
      if (received > a.warmup) intervals.push_back(std::chrono::duration<double, std::milli>(now - last).count());
      ++received;
      grant(s);
      last = mpi::Clock::now();
      d.restart();
    }
    DF_CHECK(!d.expired(), LostPeer, "no batch arrived for " << a.timeout_s << " s");
  }
  for (auto& r : credit_reqs) mpi::wait(r, a.timeout_s, [] { return std::string("lost peer: a credit never left"); });
  res.ms = median(intervals);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  bench::Writer w("dflash-plane-bench", argc, argv);
  const Args a = parse(argc, argv);
  DF_CHECK(cuda_device_count() > 0, DeviceFailure, "no CUDA device visible");
  Topology topo = create_topology(MPI_COMM_WORLD, TopologySpec{1, 1}, Device::CUDA);
  DF_CHECK_HINT(topo.world_size == 2, BadOptions, "dflash-plane-bench runs on 2 ranks", "mpirun -np 2 dflash-plane-bench ...");
  const Ctx ctx = make_ctx(Device::CUDA, topo.gpu);
  const bool drafter = topo.role == Role::Drafter;
  w.set_enabled(drafter);  // the drafter rank measures and prints
  SlotShape shape;
  shape.max_tokens = a.tokens;
  shape.num_layers = a.layers;
  shape.hidden = a.hidden;
  shape.device = Device::CUDA;
  shape.dtype = DType::BF16;
  const size_t bytes = static_cast<size_t>(a.layers * a.tokens * a.hidden) * 2;
  const double copy_ms = drafter ? d2d_copy_ms(ctx, bytes, a) : 0;
  const std::string no_raw = unavailable("nccl", topo);  // raw NCCL needs a GPU per rank, as the plane does
  const double raw_ms = no_raw.empty() ? raw_nccl_ms(ctx, topo, bytes, a) : 0;
  using bench::num;
  using bench::text;
  const bench::Cell gb = bytes / 1e9, _ = bench::none;
  auto vs_raw = [&](double ms) { return raw_ms > 0 ? bench::Cell(100.0 * raw_ms / ms) : _; };
  w.begin(bench::device_line(cuda::backend_of(ctx).device) + " (the drafter's)",
          bench::format("%d warm-up (checked byte for byte) + %d timed batches, median; planes: interval between "
                        "completed batches on the drafter (host clock); d2d-copy, nccl-raw: CUDA events",
                        a.warmup, a.iters));
  w.meta("ranks", bench::format("target rank %d -> drafter rank %d, %s", topo.node_targets.at(0), topo.node_drafters.at(0),
                                topo.to_string().c_str()));
  w.meta("batch", bench::format("%lld layers x %lld tokens x %lld hidden, bf16 = %.3f GB (+ %lld tokens, mask); "
                                "%d slots",
                                static_cast<long long>(a.layers), static_cast<long long>(a.tokens),
                                static_cast<long long>(a.hidden), bytes / 1e9, static_cast<long long>(a.tokens),
                                a.depth));
  w.meta("MPI CUDA-aware", drafter ? query_cuda_aware_mpi().describe() : "");
  w.meta("yardsticks", "d2d-copy on the drafter's GPU; nccl-raw = ncclSend/ncclRecv of the same bytes, no credits" +
                           (no_raw.empty() ? std::string() : " (not run: " + no_raw + ")"));
  w.columns({text("case", 10), num("gb", "GB", 3), num("ms", "ms", 2, 8), num("gb_per_s", "GB/s", 1),
             num("vs_copy", "%", 0), num("vs_raw", "%", 0), text("check", 7)});
  if (drafter) {
    w.row({"d2d-copy", gb, copy_ms, bytes / 1e6 / copy_ms, 100.0, _, "-"});
    if (raw_ms > 0) w.row({"nccl-raw", gb, raw_ms, bytes / 1e6 / raw_ms, 100.0 * copy_ms / raw_ms, vs_raw(raw_ms), "-"});
  }
  int failures = 0;
  for (const std::string& p : a.planes) {
    const std::string why = unavailable(p, topo);
    if (!why.empty()) {
      const bool required = std::find(a.required.begin(), a.required.end(), p) != a.required.end();
      w.note(p + " skipped: " + why + (required ? " (required: FAIL)" : ""));
      w.row({p, gb, _, _, _, _, required ? "FAILED" : "skipped"});
      failures += required ? 1 : 0;
      continue;
    }
    DataPlaneSetup setup = setup_data_plane(choice_of(p), Device::CUDA, topo, ctx, a.timeout_s);
    DataPlaneSpec ps;
    ps.kind = setup.kind;
    ps.nccl = setup.nccl.get();
    ps.comm = MPI_COMM_WORLD;
    ps.ctx = ctx;
    ps.shape = shape;
    if (drafter) ps.num_slots = a.depth;
    else ps.num_send_buffers = 2;  // as a target has: the next batch fills one while the other moves
    std::unique_ptr<DataPlane> plane = make_data_plane(ps);
    const Result r = drafter ? run_drafter(*plane, ctx, topo, a, bytes) : run_target(*plane, ctx, topo, a);
    int32_t ok = r.checked_ok ? 1 : 0;  // both ranks are done with this plane before the next one starts
    MPI_Request done = mpi::iallreduce(&ok, 1, MPI_MIN, MPI_COMM_WORLD);
    mpi::wait(done, a.timeout_s, [] { return std::string("lost peer: the other rank never finished the plane"); });
    w.row({p, gb, r.ms, bytes / 1e6 / r.ms, 100.0 * copy_ms / r.ms, vs_raw(r.ms), r.checked_ok ? "ok" : "FAILED"});
    failures += r.checked_ok ? 0 : 1;
  }
  mpi::allreduce(&failures, 1, MPI_MAX, MPI_COMM_WORLD);
  w.note(failures ? "FAILED" : "all checks passed");
  free_topology(topo);
  MPI_Finalize();
  return failures ? 1 : 0;
}
