// What the bench drivers share (bench_target_forward, bench_hybrid_forward, drafter_bench, dflash-plane-bench,
// dflash-drafters-bench): one output writer, so a number reads the same in every driver's output, and, for
// the CUDA drivers, the common options, the packed batch upload and the timing loop.
//
// The writer (bench::Writer; bench/bench_rows.py is its Python twin for the PyTorch references) prints in
// nccl-tests' shape (bench/README.md, "Output format"):
//   # key: value                      metadata: bench, command, date, build, device, timing, then the driver's
//   #  case      model  T        ms   the table header: one column per field, the JSON key as its name,
//   #                            (ms)   and the unit under it
//     forward   8b     16384  98.21    one fixed-width row per case ("-" where a case has no value)
// With --json each case is one JSON line instead of a row: {"bench": ..., "commit": ..., "device": ...,
// "case": ..., <column key>: <number, string or null>, ...}; the `# ` lines stay (a consumer keeps the
// lines that start with '{').
//
// Define DFLASH_BENCH_WRITER_ONLY before including to get the writer alone (no CUDA, no dflash library):
// tests/bench/test_bench_writer.cpp does.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#if __has_include("dflash_git_commit.h")
#include "dflash_git_commit.h"  // generated at build time (cmake/git_commit.cmake)
#endif
#ifndef DFLASH_GIT_COMMIT
#define DFLASH_GIT_COMMIT "unknown"
#endif

namespace dflash::bench {

// One column of the table: `key` names it in the header and in the JSON lines (units in the key where the
// value has one: step_ms, peak_gib, tok_per_s), `unit` is printed under the header ("" for none);
// precision < 0: a text column (left-aligned), else a number with that many decimals (right-aligned).
struct Column {
  std::string key, unit;
  int precision = 2;
  int width = 0;  // at least this wide (the header and unit always fit)
};
inline Column text(std::string key, int width = 8) { return Column{std::move(key), "", -1, width}; }
inline Column num(std::string key, std::string unit, int precision, int width = 0) {
  return Column{std::move(key), std::move(unit), precision, width};
}

// One cell of a row: text, a number, or missing ("-" in the table, null in JSON; a non-finite number too).
struct Cell {
  enum Kind { Missing, Text, Number } kind = Missing;
  std::string s;
  double v = 0;
  Cell() = default;
  Cell(const char* x) : kind(Text), s(x) {}
  Cell(std::string x) : kind(Text), s(std::move(x)) {}
  Cell(double x) : kind(std::isfinite(x) ? Number : Missing), v(x) {}
  Cell(float x) : Cell(static_cast<double>(x)) {}
  Cell(int x) : kind(Number), v(x) {}
  Cell(long x) : kind(Number), v(static_cast<double>(x)) {}
  Cell(long long x) : kind(Number), v(static_cast<double>(x)) {}
  Cell(unsigned x) : kind(Number), v(x) {}
  Cell(unsigned long x) : kind(Number), v(static_cast<double>(x)) {}
  Cell(unsigned long long x) : kind(Number), v(static_cast<double>(x)) {}
};
inline const Cell none{};

inline std::string vformat(const char* fmt, va_list ap) {
  va_list aq;
  va_copy(aq, ap);
  const int n = std::vsnprintf(nullptr, 0, fmt, aq);
  va_end(aq);
  std::string s(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(s.data(), s.size() + 1, fmt, ap);
  return s;
}
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string format(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = vformat(fmt, ap);
  va_end(ap);
  return s;
}

inline std::string json_string(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += static_cast<char>(c);
    else if (c == '\n') o += "\\n";
    else if (c == '\t') o += "\\t";
    else if (c < 0x20) o += format("\\u%04x", c);
    else o += static_cast<char>(c);
  }
  return o + "\"";
}

// The writer. Construct it first in main (after MPI_Init in the MPI drivers): it takes --json out of argv
// and keeps the command line. Only an enabled writer prints (the MPI drivers enable one rank).
class Writer {
 public:
  Writer(std::string bench, int& argc, char** argv, FILE* out = stdout) : bench_(std::move(bench)), out_(out) {
    int k = 1;
    for (int i = 1; i < argc; ++i) {
      if (std::string(argv[i]) == "--json") json_ = true;
      else argv[k++] = argv[i];
    }
    for (int i = 0; i < argc; ++i) command_ += (i ? " " : "") + quoted(argv[i]);
    argc = k;
    argv[argc] = nullptr;
  }
  bool json() const { return json_; }
  void set_json(bool on) { json_ = on; }
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  const std::string& bench() const { return bench_; }

  // The metadata every driver prints first: bench, command, date (UTC), build, device, timing.
  void begin(const std::string& device, const std::string& timing) {
    device_ = device;
    meta("bench", bench_);
    meta("command", command_);
    meta("date", utc_now());
    meta("build", std::string(DFLASH_GIT_COMMIT));
    meta("host", hostname());
    meta("device", device);
    meta("timing", timing);
    meta("format", json_ ? "one JSON line per case (the lines that start with '{')"
                         : "one row per case, units under the header; --json for JSON lines");
  }
  // "# key: value"
  void meta(const std::string& key, const std::string& value) {
    if (enabled_) std::fprintf(out_, "# %s: %s\n", key.c_str(), value.c_str()), std::fflush(out_);
  }
  // "# text": a free note (a check's verdict, a skipped case's reason)
  void note(const std::string& text) {
    if (enabled_) std::fprintf(out_, "# %s\n", text.c_str()), std::fflush(out_);
  }
  // The table's columns; the first is the case's name. A new call starts a new table (a header again).
  void columns(std::vector<Column> cols) {
    cols_ = std::move(cols);
    for (Column& c : cols_) {
      c.width = std::max<int>({c.width, static_cast<int>(c.key.size()),
                               c.unit.empty() ? 0 : static_cast<int>(c.unit.size()) + 2});
      if (c.precision >= 0) c.width = std::max(c.width, 6);
    }
    header_done_ = false;
  }
  // One case: a cell per column, in order (fewer: the rest are missing).
  void row(const std::vector<Cell>& cells) {
    if (!enabled_) return;
    if (json_) {
      std::string o = "{\"bench\": " + json_string(bench_) + ", \"commit\": " + json_string(DFLASH_GIT_COMMIT) +
                      ", \"device\": " + json_string(device_);
      for (size_t i = 0; i < cols_.size(); ++i) {
        const Cell& c = i < cells.size() ? cells[i] : none;
        o += ", " + json_string(i == 0 ? "case" : cols_[i].key) + ": " + json_value(c, cols_[i]);
      }
      std::fprintf(out_, "%s}\n", o.c_str());
    } else {
      if (!header_done_) print_header();
      std::string line = " ";
      for (size_t i = 0; i < cols_.size(); ++i) {
        const Cell& c = i < cells.size() ? cells[i] : none;
        line += " " + pad(cell_text(c, cols_[i]), cols_[i]);
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::fprintf(out_, "%s\n", line.c_str());
    }
    std::fflush(out_);
  }

  // The table text of a cell (no padding): "-" for a missing one; blanks in text become '_' (a row splits on
  // blanks).
  static std::string cell_text(const Cell& c, const Column& col) {
    if (c.kind == Cell::Missing) return "-";
    if (c.kind == Cell::Text) {
      std::string t = c.s.empty() ? "-" : c.s;
      std::replace(t.begin(), t.end(), ' ', '_');
      return t;
    }
    return format("%.*f", std::max(col.precision, 0), c.v);
  }

 private:
  static std::string quoted(const std::string& a) {
    if (!a.empty() && a.find_first_of(" \t\"'$\\") == std::string::npos) return a;
    std::string o = "'";
    for (char c : a) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
  }
  static std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char b[32];
    std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return b;
  }
  static std::string hostname() {
    char b[256] = {0};
    if (gethostname(b, sizeof b - 1) != 0) return "unknown";
    return b;
  }
  static std::string pad(const std::string& s, const Column& c) {
    const size_t w = static_cast<size_t>(c.width);
    if (s.size() >= w) return s;
    return c.precision < 0 ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
  }
  static std::string json_value(const Cell& c, const Column& col) {
    if (c.kind == Cell::Missing) return "null";
    if (c.kind == Cell::Text) return json_string(c.s);
    return format("%.*f", std::max(col.precision, 0), c.v);
  }
  void print_header() {
    std::string names = "#", units = "#";
    for (const Column& c : cols_) {
      names += " " + pad(c.key, c);
      units += " " + pad(c.unit.empty() ? "" : "(" + c.unit + ")", c);
    }
    for (std::string* s : {&names, &units})
      while (!s->empty() && s->back() == ' ') s->pop_back();
    std::fprintf(out_, "%s\n%s\n", names.c_str(), units.c_str());
    header_done_ = true;
  }

  std::string bench_, command_, device_;
  FILE* out_;
  bool json_ = false, enabled_ = true, header_done_ = false;
  std::vector<Column> cols_;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline std::vector<int32_t> parse_ints(const std::string& s) {
  std::vector<int32_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoi(item.c_str()));
  return v;
}

}  // namespace dflash::bench

#ifndef DFLASH_BENCH_WRITER_ONLY
#include <cuda_runtime.h>

#include "dflash/backend.h"
#include "dflash/error.h"
#include "dflash/ops.h"
#include "dflash/tensor.h"

#define BENCH_CUDA(call)                                                                        \
  do {                                                                                          \
    cudaError_t e_ = (call);                                                                    \
    if (e_ != cudaSuccess) DF_FAIL(DeviceFailure, #call << ": " << cudaGetErrorString(e_), ""); \
  } while (0)

namespace dflash::bench {

// The device line of the metadata: name, memory, SMs, compute capability, driver and runtime versions.
inline std::string device_line(int device) {
  cudaDeviceProp p{};
  BENCH_CUDA(cudaGetDeviceProperties(&p, device));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return format("%d \"%s\", %.1f GiB, %d SMs, sm_%d%d, driver CUDA %d.%d, runtime %d.%d", device, p.name,
                p.totalGlobalMem / 1073741824.0, p.multiProcessorCount, p.major, p.minor, driver / 1000,
                driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10);
}

// The timing line of the metadata for `warmup` untimed and `iters` timed calls.
inline std::string timing_line(int warmup, int iters, const char* clock = "CUDA events") {
  return format("%d warm-up + %d timed, %s, median", warmup, iters, clock);
}

// The options both forward benchmarks take; the caller sets the defaults of model and seqlens.
struct ForwardOptions {
  std::string model, seqlens, capture;  // --model, --seqlens a,b,..., --capture l,m,...
  int iters = 5, warmup = 2;
  bool no_final_norm = false;
  // --fp8: the decoder layers' linears as block-scaled FP8 GEMMs (bench/bench_fp8.h), as an FP8 target runs
  // them on sm_90 (docs/fp8.md); random e4m3 weights with 128-channel scales instead of random bf16.
  enum class Linears : uint8_t { Bf16, Fp8 } linears = Linears::Bf16;
  // --fp8-scaling block|token (with --fp8): the fine-grained format's 1x128 scales (default), or
  // compressed-tensors FP8-Dynamic's one scale per token x one per output channel (ops::Fp8Scaling).
  ops::Fp8Scaling fp8_scaling = ops::Fp8Scaling::Block128;
};

// Reads argv[i] into o when it is one of ForwardOptions' (i then moves past its value) and returns true;
// false for any other argument, which the caller reads.
inline bool parse_forward_option(int argc, char** argv, int& i, ForwardOptions& o) {
  const std::string a = argv[i];
  auto next = [&]() -> std::string {
    DF_CHECK(i + 1 < argc, BadOptions, a << " needs a value");
    return argv[++i];
  };
  if (a == "--model") o.model = next();
  else if (a == "--seqlens") o.seqlens = next();
  // A mixed-length packing of 16384 tokens: long and short documents together, down to 33 tokens.
  else if (a == "--mixed") o.seqlens = "3011,517,1290,4096,87,2203,740,1650,33,998,1402,357";
  else if (a == "--capture") o.capture = next();
  else if (a == "--iters") o.iters = std::atoi(next().c_str());
  else if (a == "--warmup") o.warmup = std::atoi(next().c_str());
  // A CE job's target forward: no final norm, so the layers after the last capture are not run.
  else if (a == "--no-final-norm") o.no_final_norm = true;
  else if (a == "--fp8") o.linears = ForwardOptions::Linears::Fp8;
  else if (a == "--fp8-scaling") {
    const std::string v = next();
    DF_CHECK(v == "block" || v == "token", BadOptions, "--fp8-scaling must be block or token, got '" << v << "'");
    o.fp8_scaling = v == "token" ? ops::Fp8Scaling::TokenChannel : ops::Fp8Scaling::Block128;
  } else return false;
  return true;
}

// Uploads a packed batch as a target forward reads it: tokens, positions (restarting per sequence) and
// cu_seqlens into the first rows of the I32 buffers. Returns the cu_seqlens rows written.
inline int64_t upload_packed_batch(const Ctx& ctx, const Tensor& tokens, const Tensor& pos, const Tensor& cu,
                                   const std::vector<int32_t>& tok, const std::vector<int32_t>& cu_seqlens) {
  const int64_t T = static_cast<int64_t>(tok.size()), ncu = static_cast<int64_t>(cu_seqlens.size());
  std::vector<int32_t> p(T);
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
    for (int32_t t = cu_seqlens[i]; t < cu_seqlens[i + 1]; ++t) p[t] = t - cu_seqlens[i];
  copy_tensor(ctx, tokens.slice_rows(0, T), cpu_view(tok.data(), {T}));
  copy_tensor(ctx, pos.slice_rows(0, T), cpu_view(p.data(), {T}));
  copy_tensor(ctx, cu.slice_rows(0, ncu), cpu_view(cu_seqlens.data(), {ncu}));
  return ncu;
}

// `warmup` untimed calls, then `iters` calls each between two CUDA events on ctx's stream: the
// milliseconds of each timed call. after_sync runs once the device is idle: after the warm-up and after
// each timed call (the hybrid bench samples free memory there).
template <class Call, class AfterSync>
std::vector<double> time_calls(const Ctx& ctx, int warmup, int iters, Call&& call, AfterSync&& after_sync) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) call();
  synchronize(ctx);
  after_sync();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(e0, stream));
    call();
    BENCH_CUDA(cudaEventRecord(e1, stream));
    synchronize(ctx);
    after_sync();
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  BENCH_CUDA(cudaEventDestroy(e0));
  BENCH_CUDA(cudaEventDestroy(e1));
  return ms;
}

}  // namespace dflash::bench

#endif  // DFLASH_BENCH_WRITER_ONLY
