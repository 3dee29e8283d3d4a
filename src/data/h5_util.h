// Small HDF5 helpers shared by the dataset and metrics code (internal header).
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dflash::h5 {

// Turns off HDF5's automatic error-stack printing once per process: every failure is reported through
// dflash::fatal with a message that names the file, which is what an operator needs.
void quiet_errors();

// A hid_t closed by the right H5*close when it goes out of scope.
class Handle {
 public:
  enum class Kind { File, Group, Dataset, Dataspace, Datatype, Attribute, PropList, Object };
  Handle() = default;
  Handle(hid_t id, Kind kind) : id_(id), kind_(kind) {}
  Handle(Handle&& o) noexcept : id_(o.id_), kind_(o.kind_) { o.id_ = -1; }
  Handle& operator=(Handle&& o) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { reset(); }
  void reset();
  hid_t get() const { return id_; }
  hid_t release() { hid_t i = id_; id_ = -1; return i; }
  bool valid() const { return id_ >= 0; }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  Kind kind_ = Kind::File;
};

// File access properties: no file locking, so h5py can read a metrics file while the job writes it.
hid_t fapl_no_locking();

bool link_exists(hid_t loc, const std::string& path);  // every component checked
// Dimensions of a dataset ({} on failure).
std::vector<hsize_t> dims(hid_t dataset);

// Attributes of `obj` (overwritten if present).
void write_attr_string(hid_t obj, const std::string& name, const std::string& value);
void write_attr_int64(hid_t obj, const std::string& name, int64_t value);
void write_attr_double(hid_t obj, const std::string& name, double value);
// Reads a string attribute (fixed or variable length, as h5py writes it). False if absent or not a string.
bool read_attr_string(hid_t obj, const std::string& name, std::string* value);
// Reads a numeric attribute as double. False if absent or not numeric.
bool read_attr_number(hid_t obj, const std::string& name, double* value);

// ---- dimension scales (hdf5_hl's H5DS), as netCDF-4 lays them out --------------------------------
// xarray (h5netcdf, netCDF4) names a dataset's axes after the dimension scales attached to them, the
// dimension's name being the scale dataset's own name; an axis without one becomes phony_dim_N.
//
// A coordinate: `ds` (e.g. /steps/step) becomes the scale of the dimension of its own name and holds
// its values. Idempotent.
void make_coordinate_scale(hid_t ds);
// A dimension without values: the dataset group/name, created when missing as netCDF-4 creates one
// (float32, never written, NAME = "This is a netCDF dimension but not a netCDF variable."). Length
// `size`, or unlimited (length 0: readers take the longest attached axis) with kUnlimitedDimension.
constexpr int64_t kUnlimitedDimension = -1;
Handle dimension_only_scale(hid_t group, const std::string& name, int64_t size);
// Attaches `scale` to axis `axis` of `ds` unless it already is. Every axis of a dataset needs one: a
// dataset with some axes named and others not is refused by h5netcdf.
void attach_scale(hid_t ds, hid_t scale, unsigned axis);

}  // namespace dflash::h5
