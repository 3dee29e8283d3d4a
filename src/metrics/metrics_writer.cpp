// metrics.h5 writer: extendible chunked series, flushed every N appends. Layout: include/dflash/metrics.h,
// docs/metrics.md.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "data/h5_util.h"
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/metrics.h"
#include "disk_reserve.h"

namespace dflash {

using h5::Handle;

// 1: the first layout; 2: dimension scales, /ranks/role an enum, /steps/epoch and /steps/acc_by_pos,
// /options. A resume of a format-1 file adds what 2 has (NaN over the rows written before).
constexpr int kMetricsFormatVersion = 2;

const char* metrics_role_name(MetricsRole r) {
  switch (r) {
    case MetricsRole::Target: return "target";
    case MetricsRole::Drafter: return "drafter";
    case MetricsRole::Idle: return "idle";
  }
  return "unknown";
}

namespace {

enum class Elem { I64, F64, I32, Role };  // Role: the enum /ranks/role_t
struct SeriesSpec {
  const char* name;
  Elem elem;
};

// Column order of each group (one 1-D dataset per entry).
// Format 1's /steps (a resumed format-1 file has them; epoch and acc_by_pos are added to it).
const SeriesSpec kStepSeries[] = {{"step", Elem::I64},   {"time_s", Elem::F64}, {"loss", Elem::F64},
                                  {"acc", Elem::F64},    {"agree", Elem::F64},  {"streak", Elem::F64},
                                  {"lr", Elem::F64},     {"noise", Elem::F64},  {"grad_norm", Elem::F64},
                                  {"tokens", Elem::I64}, {"anchors", Elem::I64}};
const SeriesSpec kRankSeries[] = {{"interval", Elem::I64},  {"time_s", Elem::F64},        {"rank", Elem::I64},
                                  {"role", Elem::Role},     {"batches", Elem::I64},       {"busy_s", Elem::F64},
                                  {"wait_s", Elem::F64},    {"compute_s", Elem::F64},     {"credit_wait_s", Elem::F64},
                                  {"data_wait_s", Elem::F64}, {"allreduce_s", Elem::F64}, {"optimizer_s", Elem::F64}};

hid_t file_type(Elem e) {
  switch (e) {
    case Elem::I64: return H5T_STD_I64LE;
    case Elem::I32: return H5T_STD_I32LE;
    case Elem::F64: return H5T_IEEE_F64LE;
    case Elem::Role: break;  // the committed enum (MetricsWriter::Impl::role_type)
  }
  return H5T_IEEE_F64LE;
}

// The role enum over a one-byte signed integer: H5T_STD_I8LE in the file, H5T_NATIVE_INT8 in memory
// (one byte: the same value bytes in both; HDF5 converts between the two enums by member name).
Handle role_enum(hid_t base) {
  Handle t(DF_H5(H5Tenum_create(base), "creating the role enum"), Handle::Kind::Datatype);
  for (MetricsRole r : {MetricsRole::Target, MetricsRole::Drafter, MetricsRole::Idle}) {
    const int8_t v = static_cast<int8_t>(r);
    DF_H5(H5Tenum_insert(t, metrics_role_name(r), &v), "role enum member");
  }
  return t;
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
    {"steps/epoch", "1", "fractional epochs done after the step (mean over the targets' loaders, as the status line's epoch~)"},
    {"steps/acc_by_pos", "1", "[step, block_position] share of trained positions at each block position whose drafter argmax equals the label (mean over drafters)"},
    {"steps/block_position", "1", "position in the block: 1 = the token right after the anchor"},
    {"ranks/interval", "1", "report interval (every --log-every steps; restarts at 0 in a resumed segment)"},
    {"ranks/time_s", "s", "end of the interval, seconds since this segment's job start"},
    {"ranks/rank", "1", "world rank"},
    {"ranks/role", "1", "role of the rank (enum role_t: target 0, drafter 1, idle 2)"},
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

// Writes (or rewrites: files of earlier versions get them on a resume) the notes of the open datasets.
void annotate_series(const std::map<std::string, Handle>& series) {
  for (const SeriesNote& n : kSeriesNotes) {
    const auto it = series.find(n.name);
    if (it == series.end()) continue;
    h5::write_attr_string(it->second, "units", n.units);
    h5::write_attr_string(it->second, "description", n.description);
  }
}

// The dimension of axis 0 of a group's series: what one row is.
const char* row_dimension(const std::string& group) {
  if (group == "steps") return "steps/step";  // a coordinate: the step numbers themselves
  if (group == "ranks") return "ranks/row";   // (interval, rank)
  return nullptr;                             // queues, gpus: GROUP/sample
}

}  // namespace

struct MetricsWriter::Impl {
  std::string path;
  Handle file;
  std::map<std::string, Handle> series;  // "steps/loss" -> dataset: the row-indexed series
  std::map<std::string, Handle> dims;    // "queues/target" -> its dimension scale (coordinates too)
  Handle role_type;                      // the committed /ranks/role_t (file type of /ranks/role)
  Handle role_mem = role_enum(H5T_NATIVE_INT8);
  bool role_is_enum = true;              // false in a resumed format-1 file (int64 roles)
  DiskReserve reserve;                   // room for a flush to complete on a full disk (disk_reserve.h)

  std::string dir() const {
    const size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  }

  // Sized for what one flush can write: a new chunk (<= 8 KiB) per series for every 16 rows appended,
  // plus metadata; at most 64 MiB.
  size_t reserve_bytes(int flush_every) const {
    const size_t chunks = static_cast<size_t>(std::max<int>(flush_every, 1)) / 16 + 1;
    return std::min<size_t>(64u << 20, (512u << 10) + std::max<size_t>(series.size(), 40) * (8u << 10) * chunks);
  }

  // H5Fflush that does not run out of space half-way (disk_reserve.h): with less than two reserves free,
  // the flush writes into the reserve's room and the reserve is allocated again after it; when that
  // fails, the file just flushed is whole: it is closed and the job stops, naming the cause.
  void flush_or_stop(const std::string& when) {
    const double free = free_bytes(dir());
    const bool low = free >= 0 && free < 2.0 * static_cast<double>(reserve.bytes());
    if (low) reserve.release();
    if (H5Fflush(file, H5F_SCOPE_GLOBAL) < 0) {
      const int err = hdf5_failure_errno();
      stop(when, err, "; the file may be incomplete");
    }
    if (!low) return;
    const int err = reserve.restore();
    if (err != 0)
      stop(when, err, ": too little room left to keep the next flush safe; this flush completed: every row "
                      "recorded so far is in the file, which is closed and readable");
  }
  [[noreturn]] void stop(const std::string& when, int err, const std::string& state) {
    series.clear();
    dims.clear();
    role_type.reset();
    file.reset();
    reserve.release();
    fatal(ExitCode::SystemFailure,
          "cannot write " + path + " (" + when + "): " + (err ? std::strerror(err) : "HDF5 flush failed") + state,
          io_failure_hint(err, dir()));
  }

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

  // Opens or creates an extendible dataset [rows (x cols)], chunked along the row dimension. A new one
  // starts with `rows` rows of its fill value (NaN for floats): a series a resumed older file lacks.
  void open_series(const std::string& name, Elem e, int cols, bool create, hsize_t rows = 0) {
    const int rank = cols > 0 ? 2 : 1;
    if (h5::link_exists(file, name)) {
      Handle ds(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name + " in " + path),
                Handle::Kind::Dataset);
      std::vector<hsize_t> d = h5::dims(ds);
      DF_CHECK_HINT(static_cast<int>(d.size()) == rank && (rank == 1 || d[1] == static_cast<hsize_t>(cols)), BadInput,
                    "metrics file " << path << ": /" << name << " does not match this run's layout (expected "
                                    << (rank == 1 ? std::string("1-D") : std::to_string(cols) + " columns") << ")",
                    "the topology changed since the file was written: use a new --out directory");
      if (e == Elem::Role) {
        Handle t(DF_H5(H5Dget_type(ds), "type of " + name), Handle::Kind::Datatype);
        role_is_enum = H5Tget_class(t) == H5T_ENUM;
      }
      series[name] = std::move(ds);
      return;
    }
    DF_CHECK(create, BadInput, "metrics file " << path << " has no series /" << name);
    hsize_t dims[2] = {rows, static_cast<hsize_t>(cols)};
    hsize_t maxdims[2] = {H5S_UNLIMITED, static_cast<hsize_t>(cols)};
    // ~8 KiB chunks: a few hundred rows per chunk for scalars, fewer for wide rows.
    hsize_t chunk[2] = {rank == 1 ? 1024 : std::max<hsize_t>(16, 1024 / std::max(cols, 1)),
                        static_cast<hsize_t>(std::max(cols, 1))};
    Handle space(DF_H5(H5Screate_simple(rank, dims, maxdims), "dataspace for " + name), Handle::Kind::Dataspace);
    Handle dcpl(DF_H5(H5Pcreate(H5P_DATASET_CREATE), "dataset properties"), Handle::Kind::PropList);
    DF_H5(H5Pset_chunk(dcpl, rank, chunk), "chunking " + name);
    if (e == Elem::F64) {
      const double nan = std::nan("");
      DF_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &nan), "fill value of " + name);
    }
    const hid_t type = e == Elem::Role ? role_type.get() : file_type(e);
    Handle ds(DF_H5(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                    "creating " + name + " in " + path),
              Handle::Kind::Dataset);
    series[name] = std::move(ds);
  }

  // ---- dimensions (netCDF-4 dimension scales; xarray's dimension names) ----------------------------
  // A group's series each name their axes with name_axes(series, {dim of axis 0, dim of axis 1}); a
  // dimension is a coordinate series (its own values, e.g. steps/step) or one made by dimension_only().
  // All are idempotent, so a resume names the axes of an older file too. A new group does the same:
  // coordinate("eval/step"), then name_axes("eval/loss", {"eval/step"}) for each of its series.
  void coordinate(const std::string& name) {
    const auto it = series.find(name);
    hid_t ds = it != series.end() ? it->second.get() : dims.at(name).get();
    h5::make_coordinate_scale(ds);
    if (it != series.end() && !dims.count(name))
      dims[name] = Handle(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name), Handle::Kind::Dataset);
  }
  void dimension_only(const std::string& name, int64_t size) {
    const size_t slash = name.rfind('/');
    Handle g = group(name.substr(0, slash), true);
    Handle d = h5::dimension_only_scale(g, name.substr(slash + 1), size);
    if (size != h5::kUnlimitedDimension) {
      const std::vector<hsize_t> have = h5::dims(d);
      DF_CHECK_HINT(have.size() == 1 && have[0] == static_cast<hsize_t>(size), BadInput,
                    "metrics file " << path << ": dimension /" << name << " has another length than this run's " << size,
                    "the topology changed since the file was written: use a new --out directory");
    }
    dims[name] = std::move(d);
  }
  void name_axes(const std::string& name, const std::vector<std::string>& axis_dims) {
    hid_t ds = series.at(name);
    for (size_t axis = 0; axis < axis_dims.size(); ++axis)
      if (axis_dims[axis] != name) h5::attach_scale(ds, dims.at(axis_dims[axis]), static_cast<unsigned>(axis));
  }

  // Every series of the file gets its dimensions: [step (, block_position)], [row], [sample (, target |
  // drafter | gpu)].
  void name_all_axes(const MetricsLayout& layout) {
    coordinate("steps/step");
    coordinate("steps/block_position");
    dimension_only("ranks/row", h5::kUnlimitedDimension);
    dimension_only("queues/sample", h5::kUnlimitedDimension);
    dimension_only("queues/target", layout.num_targets);
    dimension_only("queues/drafter", layout.num_drafters);
    const bool gpus = series.count("gpus/time_s") > 0;
    if (gpus) {
      dimension_only("gpus/sample", h5::kUnlimitedDimension);
      dimension_only("gpus/gpu", layout.num_gpus);
    }
    for (const auto& [name, ds] : series) {
      const std::string grp = name.substr(0, name.find('/'));
      const char* row = row_dimension(grp);
      std::vector<std::string> axes{row ? std::string(row) : grp + "/sample"};
      if (name == "steps/acc_by_pos") axes.push_back("steps/block_position");
      if (name == "queues/q_pre") axes.push_back("queues/target");
      if (name == "queues/q_hs") axes.push_back("queues/drafter");
      if (grp == "gpus" && name != "gpus/time_s") axes.push_back("gpus/gpu");
      name_axes(name, axes);
    }
  }

  // /steps/block_position: the coordinate 1 .. block_size-1 of acc_by_pos's columns (made once).
  void block_positions(int block_size) {
    const std::string name = "steps/block_position";
    const int n = block_size - 1;
    if (h5::link_exists(file, name)) {
      Handle ds(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name), Handle::Kind::Dataset);
      const std::vector<hsize_t> d = h5::dims(ds);
      DF_CHECK_HINT(d.size() == 1 && d[0] == static_cast<hsize_t>(n), BadInput,
                    "metrics file " << path << ": /" << name << " does not match this run's block size " << block_size,
                    "the drafter changed since the file was written: use a new --out directory");
      dims[name] = std::move(ds);
      return;
    }
    const hsize_t len = static_cast<hsize_t>(n);
    Handle space(DF_H5(H5Screate_simple(1, &len, nullptr), "dataspace for " + name), Handle::Kind::Dataspace);
    Handle ds(DF_H5(H5Dcreate2(file, name.c_str(), H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    "creating " + name + " in " + path),
              Handle::Kind::Dataset);
    std::vector<int32_t> k(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) k[static_cast<size_t>(i)] = i + 1;
    DF_H5(H5Dwrite(ds, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, k.data()), "writing " + name);
    dims[name] = std::move(ds);
  }

  // /ranks/role_t, committed so that netCDF readers (h5netcdf's EnumType) find it by name.
  void open_role_type(hid_t ranks) {
    if (h5::link_exists(ranks, "role_t")) {
      role_type = Handle(DF_H5(H5Topen2(ranks, "role_t", H5P_DEFAULT), "opening /ranks/role_t in " + path),
                         Handle::Kind::Datatype);
      return;
    }
    role_type = role_enum(H5T_STD_I8LE);
    DF_H5(H5Tcommit2(ranks, "role_t", role_type, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          "committing /ranks/role_t in " + path);
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
  DF_CHECK(layout.block_size >= 2, Internal, "metrics layout for " << path << ": block size " << layout.block_size);
  DF_CHECK(layout.flush_every >= 1, BadOptions,
           "--metrics-flush-every must be at least 1 (got " << layout.flush_every << ")");
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  impl_->path = path;
  const bool append = mode == MetricsOpen::Append && file_exists(path);
  // The reserve first: a disk too full for it is reported before metrics.h5 is touched.
  const std::string reserve_path = impl_->dir() + "/." + std::filesystem::path(path).filename().string() + ".reserve";
  const int reserve_err = impl_->reserve.create(reserve_path, impl_->reserve_bytes(layout.flush_every));
  DF_CHECK_HINT(reserve_err == 0, SystemFailure,
                "cannot reserve " << (impl_->reserve_bytes(layout.flush_every) >> 10) << " KiB for " << path << " ("
                                  << reserve_path << "): " << std::strerror(reserve_err),
                io_failure_hint(reserve_err, impl_->dir()));
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  if (append) {
    DF_CHECK_HINT(H5Fis_hdf5(path.c_str()) > 0, BadInput, "metrics file " << path << " is not an HDF5 file",
                  "move it away or use a new --out directory");
    impl_->file = Handle(H5Fopen(path.c_str(), H5F_ACC_RDWR, fapl), Handle::Kind::File);
    DF_CHECK_HINT(impl_->file.valid(), BadInput, "cannot open metrics file " << path << " for appending",
                  "move it away or use a new --out directory");
  } else {
    set_aside_previous(path);
    impl_->file = Handle(H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), Handle::Kind::File);
    if (!impl_->file.valid()) {
      const int err = hdf5_failure_errno();
      fatal(ExitCode::SystemFailure, "cannot create " + path + (err ? std::string(": ") + std::strerror(err) : ""),
            io_failure_hint(err, impl_->dir()));
    }
  }
  // A resumed file of an earlier format is brought up to this one (what it lacks is added).
  h5::write_attr_int64(impl_->file, "format_version", kMetricsFormatVersion);
  const bool create = !append;
  impl_->group("steps", create);
  for (const SeriesSpec& s : kStepSeries) impl_->open_series(std::string("steps/") + s.name, s.elem, 0, create);
  {
    // Added in format 2: NaN over the rows of a resumed format-1 file.
    const hsize_t rows = h5::dims(impl_->series.at("steps/step"))[0];
    impl_->open_series("steps/epoch", Elem::F64, 0, true, rows);
    impl_->block_positions(layout.block_size);  // first: another block size is named as such
    impl_->open_series("steps/acc_by_pos", Elem::F64, layout.block_size - 1, true, rows);
  }
  {
    Handle ranks = impl_->group("ranks", create);
    if (create) h5::write_attr_string(ranks, "role_legend", "0=target 1=drafter 2=idle");
    impl_->open_role_type(ranks);
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
  impl_->name_all_axes(layout_);
  annotate_series(impl_->series);
  annotate_series(impl_->dims);
  // The whole structure is on disk before the first row: a later failure cannot make the file unreadable.
  impl_->flush_or_stop("writing its structure");
}

MetricsWriter::~MetricsWriter() { close(); }

void MetricsWriter::count_append() {
  if (++appends_since_flush_ >= layout_.flush_every) {
    impl_->flush_or_stop("flushing");
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
  impl_->append("steps/epoch", H5T_NATIVE_DOUBLE, &s.epoch, 0);
  const int positions = layout_.block_size - 1;
  DF_CHECK(s.acc_by_pos.empty() || static_cast<int>(s.acc_by_pos.size()) == positions, Internal,
           "append_step: " << s.acc_by_pos.size() << " block positions for a layout of " << positions);
  const std::vector<double> acc = s.acc_by_pos.empty() ? std::vector<double>(positions, std::nan("")) : s.acc_by_pos;
  impl_->append("steps/acc_by_pos", H5T_NATIVE_DOUBLE, acc.data(), positions);
  count_append();
}

void MetricsWriter::append_rank_timing(const RankTiming& r) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int64_t rank = r.rank, role = static_cast<int64_t>(r.role);
  const int8_t role8 = static_cast<int8_t>(r.role);
  impl_->append("ranks/interval", H5T_NATIVE_INT64, &r.interval, 0);
  impl_->append("ranks/time_s", H5T_NATIVE_DOUBLE, &r.time_s, 0);
  impl_->append("ranks/rank", H5T_NATIVE_INT64, &rank, 0);
  if (impl_->role_is_enum) impl_->append("ranks/role", impl_->role_mem, &role8, 0);
  else impl_->append("ranks/role", H5T_NATIVE_INT64, &role, 0);  // a resumed format-1 file
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

namespace {
// The group for set_group_attribute (created when missing). Called with hdf5_mutex() held.
Handle attribute_group(hid_t file, const std::string& group, const std::string& path) {
  if (h5::link_exists(file, group))
    return Handle(DF_H5(H5Gopen2(file, group.c_str(), H5P_DEFAULT), "opening group " + group + " in " + path),
                  Handle::Kind::Group);
  return Handle(DF_H5(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating group " + group + " in " + path),
                Handle::Kind::Group);
}
}  // namespace

void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_string(attribute_group(impl_->file, group, path_), name, value);
}
void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, double value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_double(attribute_group(impl_->file, group, path_), name, value);
}
void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_int64(attribute_group(impl_->file, group, path_), name, value);
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
  for (const auto& [name, ds] : impl_->series) {
    if (name.compare(0, 6, "steps/") != 0) continue;
    std::vector<hsize_t> d = h5::dims(ds);
    d[0] = keep;
    DF_H5(H5Dset_extent(ds, d.data()), "shrinking steps in " + path_);
  }
  impl_->flush_or_stop("flushing");
}

// ---- /eval (--eval-data): one row per evaluation of the held-out set ------------------------------
namespace {
const SeriesSpec kEvalSeries[] = {{"step", Elem::I64},   {"time_s", Elem::F64},  {"loss", Elem::F64},
                                  {"acc", Elem::F64},    {"streak", Elem::F64},  {"tokens", Elem::I64},
                                  {"anchors", Elem::I64}, {"seqs", Elem::I64},   {"seconds", Elem::F64}};
const SeriesNote kEvalNotes[] = {
    {"eval/step", "1", "optimizer steps done when the eval set was evaluated (every --eval-every steps and after the last)"},
    {"eval/time_s", "s", "when the evaluation finished, seconds since this segment's job start"},
    {"eval/loss", "1", "held-out loss over the whole eval set (nats; position-weighted as the training loss)"},
    {"eval/acc", "1", "share of the eval set's loss positions whose drafter argmax equals the label"},
    {"eval/streak", "tokens", "mean leading run of correct predictions per block on the eval set (acceptance-length estimate)"},
    {"eval/acc_by_pos", "1", "[step, block_position] accuracy at each block position on the eval set (NaN: no position there)"},
    {"eval/tokens", "tokens", "tokens of the eval set"},
    {"eval/anchors", "1", "blocks evaluated (fixed anchors: the same every evaluation)"},
    {"eval/seqs", "1", "sequences of the eval set"},
    {"eval/seconds", "s", "wall time of the evaluation"},
};
}  // namespace

void MetricsWriter::append_eval(const EvalMetrics& m) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int positions = static_cast<int>(m.acc_by_pos.size());
  DF_CHECK(positions >= 1, Internal, "append_eval: no block positions");
  if (!impl_->series.count("eval/step")) {  // the first evaluation of this segment: make or open /eval
    impl_->group("eval", true);
    for (const SeriesSpec& s : kEvalSeries) impl_->open_series(std::string("eval/") + s.name, s.elem, 0, true);
    impl_->open_series("eval/acc_by_pos", Elem::F64, positions, true);
    impl_->coordinate("eval/step");  // like /steps/step: the rows' step numbers name the dimension
    for (const SeriesSpec& s : kEvalSeries)
      if (std::string(s.name) != "step") impl_->name_axes(std::string("eval/") + s.name, {"eval/step"});
    if (positions == layout_.block_size - 1 && impl_->dims.count("steps/block_position"))
      impl_->name_axes("eval/acc_by_pos", {"eval/step", "steps/block_position"});
    else
      impl_->name_axes("eval/acc_by_pos", {"eval/step"});
    for (const SeriesNote& n : kEvalNotes) {
      h5::write_attr_string(impl_->series.at(n.name), "units", n.units);
      h5::write_attr_string(impl_->series.at(n.name), "description", n.description);
    }
  }
  impl_->append("eval/step", H5T_NATIVE_INT64, &m.step, 0);
  impl_->append("eval/time_s", H5T_NATIVE_DOUBLE, &m.time_s, 0);
  impl_->append("eval/loss", H5T_NATIVE_DOUBLE, &m.loss, 0);
  impl_->append("eval/acc", H5T_NATIVE_DOUBLE, &m.acc, 0);
  impl_->append("eval/streak", H5T_NATIVE_DOUBLE, &m.streak, 0);
  impl_->append("eval/tokens", H5T_NATIVE_INT64, &m.tokens, 0);
  impl_->append("eval/anchors", H5T_NATIVE_INT64, &m.anchors, 0);
  impl_->append("eval/seqs", H5T_NATIVE_INT64, &m.seqs, 0);
  impl_->append("eval/seconds", H5T_NATIVE_DOUBLE, &m.seconds, 0);
  impl_->append("eval/acc_by_pos", H5T_NATIVE_DOUBLE, m.acc_by_pos.data(), positions);
  impl_->flush_or_stop("flushing");
  appends_since_flush_ = 0;
}

void MetricsWriter::drop_eval_after(int64_t last_step) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!h5::link_exists(impl_->file, "eval/step")) return;
  std::vector<std::string> names;
  for (const SeriesSpec& s : kEvalSeries) names.push_back(std::string("eval/") + s.name);
  names.push_back("eval/acc_by_pos");
  std::vector<Handle> ds;
  for (const std::string& n : names) {
    if (!h5::link_exists(impl_->file, n)) continue;
    ds.emplace_back(DF_H5(H5Dopen2(impl_->file, n.c_str(), H5P_DEFAULT), "opening " + n + " in " + path_), Handle::Kind::Dataset);
  }
  const hsize_t n = h5::dims(ds.front())[0];  // eval/step
  std::vector<int64_t> steps(n);
  if (n > 0) DF_H5(H5Dread(ds.front(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), "reading eval/step");
  hsize_t keep = 0;  // rows are appended in step order
  while (keep < n && steps[keep] <= last_step) ++keep;
  if (keep == n) return;
  for (const Handle& d : ds) {
    std::vector<hsize_t> dims = h5::dims(d);
    dims[0] = keep;
    DF_H5(H5Dset_extent(d, dims.data()), "shrinking eval in " + path_);
  }
  impl_->flush_or_stop("flushing");
}

void MetricsWriter::flush() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_->file.valid()) return;
  impl_->flush_or_stop("flushing");
  appends_since_flush_ = 0;
}

void MetricsWriter::close() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_ || !impl_->file.valid()) return;
  impl_->flush_or_stop("closing");
  impl_->series.clear();
  impl_->dims.clear();
  impl_->role_type.reset();
  impl_->file.reset();
  impl_->reserve.release();
}

}  // namespace dflash
