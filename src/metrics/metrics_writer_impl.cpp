// MetricsWriter::Impl's members (metrics_writer_impl.h): the extendible series, dimension scales and the
// crash-safe flush that the writer's public API (metrics_writer.cpp) and its opening
// (metrics_writer_open.cpp) write metrics.h5 with. Layout: include/dflash/metrics.h, docs/metrics.md.
#include "metrics_writer_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dflash/error.h"

namespace dflash {

using h5::Handle;
using metrics_detail::Elem;
using metrics_detail::role_enum;

namespace metrics_detail {

Handle role_enum(hid_t base) {
  Handle t(DF_H5(H5Tenum_create(base), "creating the role enum"), Handle::Kind::Datatype);
  for (MetricsRole r : {MetricsRole::Target, MetricsRole::Drafter, MetricsRole::Idle}) {
    const int8_t v = static_cast<int8_t>(r);
    DF_H5(H5Tenum_insert(t, metrics_role_name(r), &v), "role enum member");
  }
  return t;
}

}  // namespace metrics_detail

namespace {

hid_t file_type(Elem e) {
  switch (e) {
    case Elem::I64: return H5T_STD_I64LE;
    case Elem::I32: return H5T_STD_I32LE;
    case Elem::F64: return H5T_IEEE_F64LE;
    case Elem::Role: break;  // the committed enum (MetricsWriter::Impl::role_type)
  }
  return H5T_IEEE_F64LE;
}

// The dimension of axis 0 of a group's series: what one row is.
const char* row_dimension(const std::string& group) {
  if (group == "steps") return "steps/step";  // a coordinate: the step numbers themselves
  if (group == "ranks") return "ranks/row";   // (interval, rank)
  if (group == "segments") return "segments/row";  // one per job start
  return nullptr;                             // queues, gpus: GROUP/sample
}

}  // namespace

std::string MetricsWriter::Impl::dir() const {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

size_t metrics_reserve_bytes(int flush_every, size_t num_series) {
  const size_t chunks = static_cast<size_t>(std::max<int>(flush_every, 1)) / 16 + 1;
  return std::min<size_t>(64u << 20, (512u << 10) + std::max<size_t>(num_series, 40) * (8u << 10) * chunks);
}

size_t MetricsWriter::Impl::reserve_bytes(int flush_every) const { return metrics_reserve_bytes(flush_every, series.size()); }

void MetricsWriter::Impl::flush_or_stop(const std::string& when) {
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
void MetricsWriter::Impl::stop(const std::string& when, int err, const std::string& state) {
  series.clear();
  dims.clear();
  role_type.reset();
  file.reset();
  reserve.release();
  fatal(ExitCode::SystemFailure,
        "cannot write " + path + " (" + when + "): " + (err ? std::strerror(err) : "HDF5 flush failed") + state,
        io_failure_hint(err, dir()));
}

Handle MetricsWriter::Impl::group(const std::string& name, bool create) {
  if (h5::link_exists(file, name)) {
    return Handle(DF_H5(H5Gopen2(file, name.c_str(), H5P_DEFAULT), "opening group " + name + " in " + path),
                  Handle::Kind::Group);
  }
  DF_CHECK(create, BadInput, "metrics file " << path << " has no group /" << name);
  return Handle(DF_H5(H5Gcreate2(file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating group " + name + " in " + path),
                Handle::Kind::Group);
}

void MetricsWriter::Impl::open_series(const std::string& name, Elem e, int cols, bool create, hsize_t rows,
                                      int64_t int_fill) {
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
  if (e == Elem::I64 && int_fill != 0)  // e.g. -1, "not known", over the rows of a resumed older file
    DF_H5(H5Pset_fill_value(dcpl, H5T_NATIVE_INT64, &int_fill), "fill value of " + name);
  const hid_t type = e == Elem::Role ? role_type.get() : file_type(e);
  Handle ds(DF_H5(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                  "creating " + name + " in " + path),
            Handle::Kind::Dataset);
  series[name] = std::move(ds);
}

// ---- dimensions (netCDF-4 dimension scales; xarray's dimension names): see metrics_writer_impl.h ----
void MetricsWriter::Impl::coordinate(const std::string& name) {
  const auto it = series.find(name);
  hid_t ds = it != series.end() ? it->second.get() : dims.at(name).get();
  h5::make_coordinate_scale(ds);
  if (it != series.end() && !dims.count(name))
    dims[name] = Handle(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name), Handle::Kind::Dataset);
}
void MetricsWriter::Impl::dimension_only(const std::string& name, int64_t size) {
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
void MetricsWriter::Impl::name_axes(const std::string& name, const std::vector<std::string>& axis_dims) {
  hid_t ds = series.at(name);
  for (size_t axis = 0; axis < axis_dims.size(); ++axis)
    if (axis_dims[axis] != name) h5::attach_scale(ds, dims.at(axis_dims[axis]), static_cast<unsigned>(axis));
}

void MetricsWriter::Impl::name_all_axes(const MetricsLayout& layout) {
  coordinate("steps/step");
  coordinate("steps/block_position");
  dimension_only("ranks/row", h5::kUnlimitedDimension);
  dimension_only("segments/row", h5::kUnlimitedDimension);
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

void MetricsWriter::Impl::block_positions(int block_size) {
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

void MetricsWriter::Impl::open_role_type(hid_t ranks) {
  if (h5::link_exists(ranks, "role_t")) {
    role_type = Handle(DF_H5(H5Topen2(ranks, "role_t", H5P_DEFAULT), "opening /ranks/role_t in " + path),
                       Handle::Kind::Datatype);
    return;
  }
  role_type = role_enum(H5T_STD_I8LE);
  DF_H5(H5Tcommit2(ranks, "role_t", role_type, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        "committing /ranks/role_t in " + path);
}

void MetricsWriter::Impl::append(const std::string& name, hid_t mem, const void* row, int cols) {
  auto it = series.find(name);
  DF_ASSERT(it != series.end());
  hid_t ds = it->second;
  std::vector<hsize_t> d = h5::dims(ds);
  const int rank = static_cast<int>(d.size());
  DF_ASSERT(rank >= 1);
  hsize_t new_dims[2] = {d[0] + 1, rank == 2 ? d[1] : 0};
  DF_H5(H5Dset_extent(ds, new_dims), "growing " + name + " in " + path);
  // Re-read the dataspace after extending (docs/metrics.md "Writing a row").
  Handle fs(DF_H5(H5Dget_space(ds), "dataspace of " + name), Handle::Kind::Dataspace);
  hsize_t start[2] = {d[0], 0};
  hsize_t count[2] = {1, rank == 2 ? static_cast<hsize_t>(cols) : 0};
  DF_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, nullptr, count, nullptr), "selecting a row of " + name);
  Handle ms(DF_H5(H5Screate_simple(rank, count, nullptr), "row dataspace"), Handle::Kind::Dataspace);
  DF_H5(H5Dwrite(ds, mem, ms, fs, H5P_DEFAULT, row), "appending to " + name + " in " + path);
}

}  // namespace dflash
