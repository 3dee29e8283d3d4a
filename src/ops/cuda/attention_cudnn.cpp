// cuDNN's fused attention for the target's varlen causal GQA attention (see attention_cudnn.cuh).
// Host code only: it builds cuDNN graphs through cuDNN's C++ frontend and runs them on the op's stream.
#include "attention_cudnn.cuh"

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "backend.cuh"
#include "cuda_check.cuh"
#include "device_memory.cuh"

#if DFLASH_HAVE_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#endif

namespace dflash::cuda {

#if !DFLASH_HAVE_CUDNN_FRONTEND

bool attention_cudnn_compiled() { return false; }
bool attention_cudnn_forward(const Ctx&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             float, int64_t) {
  return false;
}

#else

namespace {
namespace fe = cudnn_frontend;

// The graph's tensors, by uid (the variant pack maps uids to pointers at each call).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kSeqQ, kSeqKV, kOffQ, kOffK, kOffV, kOffO };

// (nseq, S bucket, nh, nkv, hd, scale bits)
using GraphKey = std::tuple<int, int64_t, int, int, int, uint32_t>;

struct SdpaGraph {
  bool ok = false;
  fe::graph::Graph graph;
  int64_t workspace_bytes = 0;
  int32_t* ints = nullptr;  // device: seq_len [nseq], q_off [nseq + 1], kv_off [nseq + 1]
};

struct DeviceState {
  cudnnHandle_t handle = nullptr;
  bool unusable = false;  // cudnnCreate failed here (e.g. a libcudnn that does not match the driver)
  std::map<GraphKey, std::unique_ptr<SdpaGraph>> graphs;
  void* workspace = nullptr;  // shared by the graphs of this context (one stream): the largest any needs
  int64_t workspace_bytes = 0;
};

std::mutex g_mutex;
// Per compute context (its Backend), not per device: a colocated rank computes on two streams of one GPU
// (include/dflash/backend.h colocated_target_ctx), and a handle's workspace and offsets serve one stream.
std::map<const void*, DeviceState> g_devices;

#define DF_CUDNN(call)                                                                                       \
  do {                                                                                                       \
    cudnnStatus_t df_s_ = (call);                                                                            \
    if (df_s_ != CUDNN_STATUS_SUCCESS)                                                                       \
      DF_FAIL(DeviceFailure, "cuDNN call failed: " #call " -> " << cudnnGetErrorString(df_s_) << " ("         \
                                                             << __FILE__ << ":" << __LINE__ << ")",          \
              "check that libcudnn.so.9 on this machine matches the toolkit; DFLASH_ATTENTION=own avoids cuDNN"); \
  } while (0)

// S: a power of two >= the longest sequence, at least 64. b: the sequence count rounded up (powers of two
// to 16, then multiples of 16); the extra entries are empty sequences (length 0, offsets at the end). Both
// let a training run's varying batches share a few graphs: a new graph costs a build (1.2 s on the H200,
// GpuAttentionCudnn.GraphBuiltOncePerBucket), a reuse 0.1 ms. Tiles past a sequence's end exit early: S
// bounded by T (8 x 4096 tokens: S = 32768) ran as fast as S = 4096 (GpuAttentionBench, bench/README.md).
// The cost of the empty padding entries was not measured on its own (they exit as early).
int64_t s_bucket(int64_t longest) {
  int64_t s = 64;
  while (s < longest) s *= 2;
  return s;
}
int b_bucket(int nseq) {
  if (nseq > 16) return (nseq + 15) / 16 * 16;
  int b = 1;
  while (b < nseq) b *= 2;
  return b;
}

void build(SdpaGraph& sg, cudnnHandle_t handle, int b, int64_t S, int nh, int nkv, int hd, float scale,
           std::string* why) {
  fe::graph::Graph& g = sg.graph;
  g.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto ints = [&](const char* name, int64_t uid, int64_t n) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({n, 1, 1, 1})
                        .set_stride({1, 1, 1, 1})
                        .set_data_type(fe::DataType_t::INT32));
  };
  auto off_q = ints("off_q", kOffQ, b + 1), off_k = ints("off_k", kOffK, b + 1), off_v = ints("off_v", kOffV, b + 1),
       off_o = ints("off_o", kOffO, b + 1);
  auto seq_q = ints("seq_q", kSeqQ, b), seq_kv = ints("seq_kv", kSeqKV, b);
  // [b, heads, S, hd] over the packed [T, heads, hd]: a token row holds every head; the ragged offsets
  // replace the batch stride.
  auto thd = [&](const char* name, int64_t uid, int64_t heads, const std::shared_ptr<fe::graph::Tensor_attributes>& off) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({b, heads, S, hd})
                        .set_stride({S * heads * hd, hd, heads * hd, 1})
                        .set_ragged_offset(off));
  };
  auto Q = thd("Q", kQ, nh, off_q), K = thd("K", kK, nkv, off_k), V = thd("V", kV, nkv, off_v);
  fe::graph::SDPA_attributes opts;
  opts.set_name("target_attention")
      .set_generate_stats(false)
      .set_attn_scale(scale)
      .set_causal_mask(true)
      .set_padding_mask(true)
      .set_seq_len_q(seq_q)
      .set_seq_len_kv(seq_kv);
  auto outs = g.sdpa(Q, K, V, opts);
  outs[0]->set_output(true).set_uid(kO).set_dim({b, nh, S, hd}).set_stride({S * nh * hd, hd, nh * hd, 1}).set_ragged_offset(off_o);
  fe::error_t st = g.build(handle, {fe::HeurMode_t::A});
  if (!st.is_good()) {
    *why = st.get_message();
    return;
  }
  int64_t ws = 0;
  if (!g.get_workspace_size(ws).is_good()) {
    *why = "no workspace size";
    return;
  }
  sg.workspace_bytes = ws;
  sg.ints = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * (3 * size_t(b) + 2)));
  sg.ok = true;
}

}  // namespace

bool attention_cudnn_compiled() { return true; }

bool attention_cudnn_forward(const Ctx& ctx, const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& cu_seqlens, float scale, int64_t max_seqlen) {
  const int64_t T = q.size(0);
  const int nh = static_cast<int>(q.size(1)), nkv = static_cast<int>(k.size(1)), hd = static_cast<int>(q.size(2));
  const int nseq = static_cast<int>(cu_seqlens.numel()) - 1;
  if (T == 0 || nseq <= 0) return true;  // nothing to do: the caller's kernel would do nothing either
  // The ragged offsets are int32 element counts: the packed tensors must stay under 2^31 elements.
  if (T * nh * hd >= (int64_t(1) << 31)) return false;
  const int64_t S = s_bucket(max_seqlen > 0 ? std::min(max_seqlen, T) : T);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &scale, sizeof scale_bits);
  const int device = backend_of(ctx).device;

  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& ds = g_devices[ctx.backend];
  if (ds.unusable) return false;
  if (!ds.handle) {
    // A cuDNN that cannot start on this device is not fatal: the project's kernel serves every call then.
    const cudnnStatus_t st = cudnnCreate(&ds.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      ds.handle = nullptr;
      ds.unusable = true;
      std::fprintf(stderr, "[attention] cuDNN does not start on device %d (cudnnCreate: %s); the project's own kernel "
                           "runs every attention call\n", device, cudnnGetErrorString(st));
      return false;
    }
  }
  const int b = b_bucket(nseq);
  const GraphKey key{b, S, nh, nkv, hd, scale_bits};
  auto it = ds.graphs.find(key);
  if (it == ds.graphs.end()) {
    auto sg = std::make_unique<SdpaGraph>();
    std::string why;
    build(*sg, ds.handle, b, S, nh, nkv, hd, scale, &why);
    // One line per (device, heads, hd): a GPU or cuDNN that refuses a head layout refuses every bucket of it.
    static std::set<std::tuple<int, int, int, int>> reported;
    if (!sg->ok && reported.insert({device, nh, nkv, hd}).second)
      std::fprintf(stderr,
                   "[attention] cuDNN cannot run %d sequences (b %d, S %lld) x %d/%d heads x hd %d on device %d (cuDNN %zu): "
                   "%s; the project's own kernel runs this shape\n",
                   nseq, b, static_cast<long long>(S), nh, nkv, hd, device, cudnnGetVersion(), why.c_str());
    if (sg->ok && sg->workspace_bytes > ds.workspace_bytes) {
      // Grows only when a new shape needs more (graph build time, never per call).
      if (ds.workspace) {
        DF_CUDA(cudaStreamSynchronize(stream_of(ctx)));
        device_free(ds.workspace);
      }
      ds.workspace = device_alloc(static_cast<size_t>(sg->workspace_bytes));
      ds.workspace_bytes = sg->workspace_bytes;
    }
    it = ds.graphs.emplace(key, std::move(sg)).first;
  }
  SdpaGraph& sg = *it->second;
  if (!sg.ok) return false;

  int32_t* seq_len = sg.ints;
  int32_t* q_off = seq_len + b;
  int32_t* kv_off = q_off + b + 1;
  attention_cudnn_ragged(ctx, static_cast<const int32_t*>(cu_seqlens.data), nseq, b, nh * hd, nkv * hd, seq_len, q_off,
                         kv_off);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.data},       {kK, k.data},          {kV, v.data},      {kO, out.data},    {kSeqQ, seq_len},
      {kSeqKV, seq_len},  {kOffQ, q_off},        {kOffK, kv_off},   {kOffV, kv_off},   {kOffO, q_off}};
  DF_CUDNN(cudnnSetStream(ds.handle, stream_of(ctx)));
  fe::error_t st = sg.graph.execute(ds.handle, pack, ds.workspace);
  DF_CHECK(st.is_good(), DeviceFailure,
           "cuDNN attention failed to run (" << nseq << " sequences, " << nh << "/" << nkv << " heads, hd " << hd
                                             << "): " << st.get_message());
  return true;
}

#endif  // DFLASH_HAVE_CUDNN_FRONTEND

}  // namespace dflash::cuda
