// metrics.h5 writer: extendible chunked series, flushed every N appends. Layout: include/dflash/metrics.h,
// docs/metrics.md.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "data/h5_util.h"
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/metrics.h"

namespace dflash {

using h5::Handle;

constexpr int kMetricsFormatVersion = 1;

const char* metrics_role_name(MetricsRole r) {
  switch (r) {
    case MetricsRole::Target: return "target";
    case MetricsRole::Drafter: return "drafter";
    case MetricsRole::Idle: return "idle";
  }
  return "unknown";
}

namespace {

enum class Elem { I64, F64, I32 };
struct SeriesSpec {
  const char* name;
  Elem elem;
};

// Column order of each group (one 1-D dataset per entry).
const SeriesSpec kStepSeries[] = {{"step", Elem::I64},   {"time_s", Elem::F64}, {"loss", Elem::F64},
                                  {"acc", Elem::F64},    {"agree", Elem::F64},  {"streak", Elem::F64},
                                  {"lr", Elem::F64},     {"noise", Elem::F64},  {"grad_norm", Elem::F64},
                                  {"tokens", Elem::I64}, {"anchors", Elem::I64}};
const SeriesSpec kRankSeries[] = {{"interval", Elem::I64},  {"time_s", Elem::F64},        {"rank", Elem::I64},
                                  {"role", Elem::I64},      {"batches", Elem::I64},       {"busy_s", Elem::F64},
                                  {"wait_s", Elem::F64},    {"compute_s", Elem::F64},     {"credit_wait_s", Elem::F64},
                                  {"data_wait_s", Elem::F64}, {"allreduce_s", Elem::F64}, {"optimizer_s", Elem::F64}};

hid_t file_type(Elem e) {
  switch (e) {
    case Elem::I64: return H5T_STD_I64LE;
    case Elem::I32: return H5T_STD_I32LE;
    case Elem::F64: return H5T_IEEE_F64LE;
  }
  return H5T_IEEE_F64LE;
}
bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Rows of /steps/step in an existing metrics file; -1 when it cannot be read as one (then it is kept:
// nobody knows what it holds). Called with hdf5_mutex() held.
int64_t stored_steps(const std::string& path) {
  if (H5Fis_hdf5(path.c_str()) <= 0) return -1;
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), Handle::Kind::File);
  if (!file.valid() || !h5::link_exists(file, "steps/step")) return -1;
  Handle ds(H5Dopen2(file, "steps/step", H5P_DEFAULT), Handle::Kind::Dataset);
  const std::vector<hsize_t> d = ds.valid() ? h5::dims(ds) : std::vector<hsize_t>{};
  return d.size() == 1 ? static_cast<int64_t>(d[0]) : -1;
}

// A new run in a directory that already has `path` (DIR/metrics.h5). A file that holds steps (or
// cannot be read) is renamed to DIR/metrics.N.h5, N one more than the highest already there, so every
// earlier run's file survives however many runs follow, in the order they ran. A file without any step
// (a start that failed before its first step) holds nothing worth keeping and is replaced.
void set_aside_previous(const std::string& path) {
  namespace fs = std::filesystem;
  if (!file_exists(path)) return;
  const int64_t steps = stored_steps(path);
  if (steps == 0) {
    DF_CHECK_HINT(std::remove(path.c_str()) == 0, SystemFailure,
                  "cannot remove the step-less " << path << " of a failed start: " << std::strerror(errno),
                  "check that the --out directory is writable");
    return;
  }
  const fs::path p(path);
  const std::string stem = p.stem().string(), ext = p.extension().string();  // "metrics", ".h5"
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  int64_t highest = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= stem.size() + 1 + ext.size() || name.compare(0, stem.size() + 1, stem + ".") != 0 ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
      continue;
    const std::string digits = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    highest = std::max<int64_t>(highest, std::stoll(digits));
  }
  const std::string aside = (dir / (stem + "." + std::to_string(highest + 1) + ext)).string();
  // No other job writes here meanwhile (the run holds the --out lock), so nothing can appear at `aside`.
  DF_CHECK_HINT(!file_exists(aside) && std::rename(path.c_str(), aside.c_str()) == 0, SystemFailure,
                "cannot move the previous run's " << path << " (" << (steps < 0 ? std::string("unreadable") : std::to_string(steps) + " steps")
                                                  << ") to " << aside << ": " << std::strerror(errno),
                "check that the --out directory is writable; the previous file is left as it was");
  std::fprintf(stderr, "[dflash] the previous run's %s (%s) is kept as %s\n", path.c_str(),
               steps < 0 ? "not readable as a metrics file" : (std::to_string(steps) + " steps").c_str(), aside.c_str());
}

// units + description of every series, as attributes of its dataset: xarray/netCDF tools and h5py users see
// what a column means without docs/metrics.md ([n, T] etc. name the dimensions of the 2-D series).
struct SeriesNote {
  const char* name;
  const char* units;
  const char* description;
};
const SeriesNote kSeriesNotes[] = {
    {"steps/step", "1", "optimizer step, absolute (continues across resumes)"},
    {"steps/time_s", "s", "when the step finished, seconds since this segment's job start (restarts at a resume)"},
    {"steps/loss", "1", "training loss of the step (nats; position-weighted, over all drafters)"},
    {"steps/acc", "1", "share of trained positions whose drafter argmax equals the label"},
    {"steps/agree", "1", "share of trained positions whose drafter argmax equals the target's argmax"},
    {"steps/streak", "tokens", "mean leading run of correct predictions per block (acceptance-length estimate)"},
    {"steps/lr", "1", "learning rate of the step (AdamW)"},
    {"steps/noise", "1", "std of the Gaussian noise added to the target features"},
    {"steps/grad_norm", "1", "global L2 norm of the gradients"},
    {"steps/tokens", "tokens", "tokens in the step's batches (all drafters)"},
    {"steps/anchors", "1", "anchors (blocks) trained on in the step (all drafters)"},
    {"ranks/interval", "1", "report interval (every --log-every steps; restarts at 0 in a resumed segment)"},
    {"ranks/time_s", "s", "end of the interval, seconds since this segment's job start"},
    {"ranks/rank", "1", "world rank"},
    {"ranks/role", "1", "role of the rank: 0 target, 1 drafter, 2 idle"},
    {"ranks/batches", "batches", "batches the rank finished in the interval"},
    {"ranks/busy_s", "s", "time working in the interval (target: forward; drafter: forward+backward+optimizer)"},
    {"ranks/wait_s", "s", "time blocked in the interval (credit, data, sends, allreduce)"},
    {"ranks/compute_s", "s", "target: forward; drafter: forward+backward"},
    {"ranks/credit_wait_s", "s", "target: waiting for a drafter's credit (a free receive slot)"},
    {"ranks/data_wait_s", "s", "target: waiting for its loader; drafter: waiting for a batch"},
    {"ranks/allreduce_s", "s", "drafter: gradient allreduce"},
    {"ranks/optimizer_s", "s", "drafter: AdamW step"},
    {"queues/time_s", "s", "sample time, seconds since this segment's job start"},
    {"queues/q_pre", "batches", "[sample, target] batches ready in each target's prefetch queue (capacity --prefetch-depth)"},
    {"queues/q_hs", "batches", "[sample, drafter] receive slots holding an untrained batch (capacity --hs-queue-depth)"},
    {"gpus/time_s", "s", "sample time, seconds since this segment's job start"},
    {"gpus/power_w", "W", "[sample, gpu] board power; column g = world rank gpu_ranks[g] (root attribute)"},
    {"gpus/util_pct", "%", "[sample, gpu] GPU utilisation"},
    {"gpus/mem_used_mib", "MiB", "[sample, gpu] device memory used"},
};

// Writes (or rewrites: files of earlier versions get them on a resume) the notes of the open series.
void annotate_series(const std::map<std::string, Handle>& series) {
  for (const SeriesNote& n : kSeriesNotes) {
    const auto it = series.find(n.name);
    if (it == series.end()) continue;
    h5::write_attr_string(it->second, "units", n.units);
    h5::write_attr_string(it->second, "description", n.description);
  }
}

}  // namespace

struct MetricsWriter::Impl {
  std::string path;
  Handle file;
  std::map<std::string, Handle> series;  // "steps/loss" -> dataset

  Handle group(const std::string& name, bool create) {
    if (h5::link_exists(file, name)) {
      return Handle(DF_H5(H5Gopen2(file, name.c_str(), H5P_DEFAULT), "opening group " + name + " in " + path),
                    Handle::Kind::Group);
    }
    DF_CHECK(create, BadInput, "metrics file " << path << " has no group /" << name);
    return Handle(DF_H5(H5Gcreate2(file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                        "creating group " + name + " in " + path),
                  Handle::Kind::Group);
  }

  // Opens or creates an extendible dataset [0 (x cols)], chunked along the row dimension.
  void open_series(const std::string& name, Elem e, int cols, bool create) {
    const int rank = cols > 0 ? 2 : 1;
    if (h5::link_exists(file, name)) {
      Handle ds(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name + " in " + path),
                Handle::Kind::Dataset);
      std::vector<hsize_t> d = h5::dims(ds);
      DF_CHECK_HINT(static_cast<int>(d.size()) == rank && (rank == 1 || d[1] == static_cast<hsize_t>(cols)), BadInput,
                    "metrics file " << path << ": /" << name << " does not match this run's layout (expected "
                                    << (rank == 1 ? std::string("1-D") : std::to_string(cols) + " columns") << ")",
                    "the topology changed since the file was written: use a new --out directory");
      series[name] = std::move(ds);
      return;
    }
    DF_CHECK(create, BadInput, "metrics file " << path << " has no series /" << name);
    hsize_t dims[2] = {0, static_cast<hsize_t>(cols)};
    hsize_t maxdims[2] = {H5S_UNLIMITED, static_cast<hsize_t>(cols)};
    // ~8 KiB chunks: a few hundred rows per chunk for scalars, fewer for wide rows.
    hsize_t chunk[2] = {rank == 1 ? 1024 : std::max<hsize_t>(16, 1024 / std::max(cols, 1)),
                        static_cast<hsize_t>(std::max(cols, 1))};
    Handle space(DF_H5(H5Screate_simple(rank, dims, maxdims), "dataspace for " + name), Handle::Kind::Dataspace);
    Handle dcpl(DF_H5(H5Pcreate(H5P_DATASET_CREATE), "dataset properties"), Handle::Kind::PropList);
    DF_H5(H5Pset_chunk(dcpl, rank, chunk), "chunking " + name);
    Handle ds(DF_H5(H5Dcreate2(file, name.c_str(), file_type(e), space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                    "creating " + name + " in " + path),
              Handle::Kind::Dataset);
    series[name] = std::move(ds);
  }

  // Appends one row (cols values; cols = 0 for a scalar) to series `name`.
  void append(const std::string& name, hid_t mem, const void* row, int cols) {
    auto it = series.find(name);
    DF_ASSERT(it != series.end());
    hid_t ds = it->second;
    std::vector<hsize_t> d = h5::dims(ds);
    const int rank = static_cast<int>(d.size());
    DF_ASSERT(rank >= 1);
    hsize_t new_dims[2] = {d[0] + 1, rank == 2 ? d[1] : 0};
    DF_H5(H5Dset_extent(ds, new_dims), "growing " + name + " in " + path);
    // Re-read the dataspace after extending (FACTS.md).
    Handle fs(DF_H5(H5Dget_space(ds), "dataspace of " + name), Handle::Kind::Dataspace);
    hsize_t start[2] = {d[0], 0};
    hsize_t count[2] = {1, rank == 2 ? static_cast<hsize_t>(cols) : 0};
    DF_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr), "selecting a row of " + name);
    Handle ms(DF_H5(H5Screate_simple(rank, count, nullptr), "row dataspace"), Handle::Kind::Dataspace);
    DF_H5(H5Dwrite(ds, mem, ms, fs, H5P_DEFAULT, row), "appending to " + name + " in " + path);
  }
};

MetricsWriter::MetricsWriter(const std::string& path, const MetricsLayout& layout, MetricsOpen mode)
    : path_(path), layout_(layout), impl_(std::make_unique<Impl>()) {
  DF_CHECK(layout.num_targets >= 0 && layout.num_drafters >= 0 && layout.num_gpus >= 0, Internal,
           "negative metrics layout for " << path);
  DF_CHECK(layout.flush_every >= 1, BadOptions,
           "--metrics-flush-every must be at least 1 (got " << layout.flush_every << ")");
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  impl_->path = path;
  const bool append = mode == MetricsOpen::Append && file_exists(path);
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  if (append) {
    DF_CHECK_HINT(H5Fis_hdf5(path.c_str()) > 0, BadInput, "metrics file " << path << " is not an HDF5 file",
                  "move it away or use a new --out directory");
    impl_->file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl), Handle::Kind::File);
    DF_CHECK_HINT(impl_->file.valid(), BadInput, "cannot open metrics file " << path << " for appending",
                  "move it away or use a new --out directory");
  } else {
    set_aside_previous(path);
    impl_->file = Handle(DF_H5(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), "creating " + path),
                         Handle::Kind::File);
    h5::write_attr_int64(impl_->file, "format_version", kMetricsFormatVersion);
  }
  const bool create = !append;
  impl_->group("steps", create);
  for (const SeriesSpec& s : kStepSeries) impl_->open_series(std::string("steps/") + s.name, s.elem, 0, create);
  {
    Handle ranks = impl_->group("ranks", create);
    if (create) h5::write_attr_string(ranks, "role_legend", "0=target 1=drafter 2=idle");
    for (const SeriesSpec& s : kRankSeries) impl_->open_series(std::string("ranks/") + s.name, s.elem, 0, create);
  }
  impl_->group("queues", create);
  impl_->open_series("queues/time_s", Elem::F64, 0, create);
  impl_->open_series("queues/q_pre", Elem::I32, layout.num_targets, create);
  impl_->open_series("queues/q_hs", Elem::I32, layout.num_drafters, create);
  {
    Handle gpus = impl_->group("gpus", create);
    if (create) {
      h5::write_attr_int64(gpus, "available", layout.gpu_available ? 1 : 0);
      h5::write_attr_string(gpus, "reason", layout.gpu_available ? "" : layout.gpu_unavailable_reason);
    }
    if (create ? layout.gpu_available : h5::link_exists(impl_->file, "gpus/time_s")) {
      impl_->open_series("gpus/time_s", Elem::F64, 0, create);
      impl_->open_series("gpus/power_w", Elem::F64, layout.num_gpus, create);
      impl_->open_series("gpus/util_pct", Elem::F64, layout.num_gpus, create);
      impl_->open_series("gpus/mem_used_mib", Elem::F64, layout.num_gpus, create);
    }
  }
  annotate_series(impl_->series);
  DF_H5(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "flushing " + path);
}

MetricsWriter::~MetricsWriter() { close(); }

void MetricsWriter::count_append() {
  if (++appends_since_flush_ >= layout_.flush_every) {
    DF_H5(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "flushing " + path_);
    appends_since_flush_ = 0;
  }
}

void MetricsWriter::append_step(const StepMetrics& s) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  impl_->append("steps/step", H5T_NATIVE_INT64, &s.step, 0);
  impl_->append("steps/time_s", H5T_NATIVE_DOUBLE, &s.time_s, 0);
  impl_->append("steps/loss", H5T_NATIVE_DOUBLE, &s.loss, 0);
  impl_->append("steps/acc", H5T_NATIVE_DOUBLE, &s.acc, 0);
  impl_->append("steps/agree", H5T_NATIVE_DOUBLE, &s.agree, 0);
  impl_->append("steps/streak", H5T_NATIVE_DOUBLE, &s.streak, 0);
  impl_->append("steps/lr", H5T_NATIVE_DOUBLE, &s.lr, 0);
  impl_->append("steps/noise", H5T_NATIVE_DOUBLE, &s.noise, 0);
  impl_->append("steps/grad_norm", H5T_NATIVE_DOUBLE, &s.grad_norm, 0);
  impl_->append("steps/tokens", H5T_NATIVE_INT64, &s.tokens, 0);
  impl_->append("steps/anchors", H5T_NATIVE_INT64, &s.anchors, 0);
  count_append();
}

void MetricsWriter::append_rank_timing(const RankTiming& r) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int64_t rank = r.rank, role = static_cast<int64_t>(r.role);
  impl_->append("ranks/interval", H5T_NATIVE_INT64, &r.interval, 0);
  impl_->append("ranks/time_s", H5T_NATIVE_DOUBLE, &r.time_s, 0);
  impl_->append("ranks/rank", H5T_NATIVE_INT64, &rank, 0);
  impl_->append("ranks/role", H5T_NATIVE_INT64, &role, 0);
  impl_->append("ranks/batches", H5T_NATIVE_INT64, &r.batches, 0);
  impl_->append("ranks/busy_s", H5T_NATIVE_DOUBLE, &r.busy_s, 0);
  impl_->append("ranks/wait_s", H5T_NATIVE_DOUBLE, &r.wait_s, 0);
  impl_->append("ranks/compute_s", H5T_NATIVE_DOUBLE, &r.compute_s, 0);
  impl_->append("ranks/credit_wait_s", H5T_NATIVE_DOUBLE, &r.credit_wait_s, 0);
  impl_->append("ranks/data_wait_s", H5T_NATIVE_DOUBLE, &r.data_wait_s, 0);
  impl_->append("ranks/allreduce_s", H5T_NATIVE_DOUBLE, &r.allreduce_s, 0);
  impl_->append("ranks/optimizer_s", H5T_NATIVE_DOUBLE, &r.optimizer_s, 0);
  count_append();
}

void MetricsWriter::append_queues(double time_s, const std::vector<int>& q_pre, const std::vector<int>& q_hs) {
  DF_CHECK(static_cast<int>(q_pre.size()) == layout_.num_targets && static_cast<int>(q_hs.size()) == layout_.num_drafters,
           Internal, "append_queues: " << q_pre.size() << " q_pre and " << q_hs.size() << " q_hs values for a layout of "
                                       << layout_.num_targets << " targets and " << layout_.num_drafters << " drafters");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  std::vector<int32_t> pre(q_pre.begin(), q_pre.end()), hs(q_hs.begin(), q_hs.end());
  impl_->append("queues/time_s", H5T_NATIVE_DOUBLE, &time_s, 0);
  impl_->append("queues/q_pre", H5T_NATIVE_INT32, pre.data(), layout_.num_targets);
  impl_->append("queues/q_hs", H5T_NATIVE_INT32, hs.data(), layout_.num_drafters);
  count_append();
}

void MetricsWriter::append_gpus(double time_s, const std::vector<double>& power_w, const std::vector<double>& util_pct,
                                const std::vector<double>& mem_used_mib) {
  const size_t g = static_cast<size_t>(layout_.num_gpus);
  DF_CHECK(layout_.gpu_available && impl_->series.count("gpus/time_s"), Internal,
           "append_gpus on a metrics file without GPU readings (" << path_ << ")");
  DF_CHECK(power_w.size() == g && util_pct.size() == g && mem_used_mib.size() == g, Internal,
           "append_gpus: expected " << g << " values per series");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  impl_->append("gpus/time_s", H5T_NATIVE_DOUBLE, &time_s, 0);
  impl_->append("gpus/power_w", H5T_NATIVE_DOUBLE, power_w.data(), layout_.num_gpus);
  impl_->append("gpus/util_pct", H5T_NATIVE_DOUBLE, util_pct.data(), layout_.num_gpus);
  impl_->append("gpus/mem_used_mib", H5T_NATIVE_DOUBLE, mem_used_mib.data(), layout_.num_gpus);
  count_append();
}

void MetricsWriter::set_attribute(const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_string(impl_->file, name, value);
}
void MetricsWriter::set_attribute(const std::string& name, double value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_double(impl_->file, name, value);
}
void MetricsWriter::set_attribute(const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_int64(impl_->file, name, value);
}

int64_t MetricsWriter::num_steps() const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return static_cast<int64_t>(h5::dims(impl_->series.at("steps/step"))[0]);
}

void MetricsWriter::drop_steps_after(int64_t last_step) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  hid_t step_ds = impl_->series.at("steps/step");
  const hsize_t n = h5::dims(step_ds)[0];
  std::vector<int64_t> steps(n);
  if (n > 0) DF_H5(H5Dread(step_ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), "reading steps/step");
  // Rows are appended in step order; keep the prefix with step <= last_step.
  hsize_t keep = 0;
  while (keep < n && steps[keep] <= last_step) ++keep;
  if (keep == n) return;
  for (const SeriesSpec& s : kStepSeries) {
    hsize_t d = keep;
    DF_H5(H5Dset_extent(impl_->series.at(std::string("steps/") + s.name), &d), "shrinking steps in " + path_);
  }
  DF_H5(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "flushing " + path_);
}

void MetricsWriter::flush() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_->file.valid()) return;
  DF_H5(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "flushing " + path_);
  appends_since_flush_ = 0;
}

void MetricsWriter::close() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_ || !impl_->file.valid()) return;
  DF_H5(H5Fflush(impl_->file, H5F_SCOPE_GLOBAL), "flushing " + path_);
  impl_->series.clear();
  impl_->file.reset();
}

}  // namespace dflash
