// MetricsWriter::Impl: the open metrics.h5 and its datasets (internal header of src/metrics/).
//
// The writer is three files: metrics_writer_open.cpp opens or creates the file and lays out its groups
// (the schema, the format upgrade of a resumed file, setting aside a previous run's file);
// metrics_writer.cpp is the public API (rows, attributes, resume trimming, flush, close);
// metrics_writer_impl.cpp is this struct's members: extendible series, dimension scales, and the
// flush that survives a full disk. Every member is called with hdf5_mutex() held.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "data/h5_util.h"
#include "dflash/metrics.h"
#include "disk_reserve.h"

namespace dflash {

namespace metrics_detail {

enum class Elem { I64, F64, I32, Role };  // Role: the enum /ranks/role_t
struct SeriesSpec {
  const char* name;
  Elem elem;
};

// units + description of every series, as attributes of its dataset: xarray/netCDF tools and h5py users see
// what a column means without docs/metrics.md ([n, T] etc. name the dimensions of the 2-D series).
struct SeriesNote {
  const char* name;
  const char* units;
  const char* description;
};

// The role enum over a one-byte signed integer: H5T_STD_I8LE in the file, H5T_NATIVE_INT8 in memory
// (one byte: the same value bytes in both; HDF5 converts between the two enums by member name).
h5::Handle role_enum(hid_t base);

}  // namespace metrics_detail

struct MetricsWriter::Impl {
  using Elem = metrics_detail::Elem;

  std::string path;
  h5::Handle file;
  std::map<std::string, h5::Handle> series;  // "steps/loss" -> dataset: the row-indexed series
  std::map<std::string, h5::Handle> dims;    // "queues/target" -> its dimension scale (coordinates too)
  h5::Handle role_type;                      // the committed /ranks/role_t (file type of /ranks/role)
  h5::Handle role_mem = metrics_detail::role_enum(H5T_NATIVE_INT8);
  bool role_is_enum = true;                  // false in a resumed format-1 file (int64 roles)
  DiskReserve reserve;                       // room for a flush to complete on a full disk (disk_reserve.h)

  std::string dir() const;  // the directory of `path`

  // ---- the crash-safe flush ----------------------------------------------------------------------
  // Sized for what one flush can write: a new chunk (<= 8 KiB) per series for every 16 rows appended,
  // plus metadata; at most 64 MiB.
  size_t reserve_bytes(int flush_every) const;
  // H5Fflush that does not run out of space half-way (disk_reserve.h): with less than two reserves free,
  // the flush writes into the reserve's room and the reserve is allocated again after it; when that
  // fails, the file just flushed is whole: it is closed and the job stops, naming the cause.
  void flush_or_stop(const std::string& when);
  // Closes everything and stops the job (fatal SystemFailure) naming `when`, the errno and the file's state.
  [[noreturn]] void stop(const std::string& when, int err, const std::string& state);

  // ---- groups and series -------------------------------------------------------------------------
  // Opens group /name; a missing one is created when `create`, else fatal BadInput.
  h5::Handle group(const std::string& name, bool create);
  // Opens or creates an extendible dataset [rows (x cols)], chunked along the row dimension. A new one
  // starts with `rows` rows of its fill value (NaN for floats): a series a resumed older file lacks.
  // int_fill: the fill value of an integer series (0 unless given).
  void open_series(const std::string& name, Elem e, int cols, bool create, hsize_t rows = 0, int64_t int_fill = 0);
  // /steps/block_position: the coordinate 1 .. block_size-1 of acc_by_pos's columns (made once).
  void block_positions(int block_size);
  // /ranks/role_t, committed so that netCDF readers (h5netcdf's EnumType) find it by name.
  void open_role_type(hid_t ranks);
  // Appends one row (cols values; cols = 0 for a scalar) to series `name`.
  void append(const std::string& name, hid_t mem, const void* row, int cols);

  // ---- dimensions (netCDF-4 dimension scales; xarray's dimension names) ----------------------------
  // A group's series each name their axes with name_axes(series, {dim of axis 0, dim of axis 1}); a
  // dimension is a coordinate series (its own values, e.g. steps/step) or one made by dimension_only().
  // All are idempotent, so a resume names the axes of an older file too. A new group does the same:
  // coordinate("eval/step"), then name_axes("eval/loss", {"eval/step"}) for each of its series.
  void coordinate(const std::string& name);
  void dimension_only(const std::string& name, int64_t size);
  void name_axes(const std::string& name, const std::vector<std::string>& axis_dims);
  // Every series of the file gets its dimensions: [step (, block_position)], [row], [sample (, target |
  // drafter | gpu)].
  void name_all_axes(const MetricsLayout& layout);
};

}  // namespace dflash
