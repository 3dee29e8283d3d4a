#include "data/h5_util.h"

#include <hdf5_hl.h>

#include <cstring>
#include <mutex>

#include "dflash/data.h"
#include "dflash/error.h"

namespace dflash {

std::mutex& hdf5_mutex() {
  static std::mutex mu;
  return mu;
}

namespace h5 {

void quiet_errors() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

Handle& Handle::operator=(Handle&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    kind_ = o.kind_;
    o.id_ = -1;
  }
  return *this;
}

void Handle::reset() {
  if (id_ < 0) return;
  switch (kind_) {
    case Kind::File: H5Fclose(id_); break;
    case Kind::Group: H5Gclose(id_); break;
    case Kind::Dataset: H5Dclose(id_); break;
    case Kind::Dataspace: H5Sclose(id_); break;
    case Kind::Datatype: H5Tclose(id_); break;
    case Kind::Attribute: H5Aclose(id_); break;
    case Kind::PropList: H5Pclose(id_); break;
    case Kind::Object: H5Oclose(id_); break;
  }
  id_ = -1;
}

hid_t fapl_no_locking() {
  hid_t fapl = DF_H5(H5Pcreate(H5P_FILE_ACCESS), "creating a file access property list");
#if H5_VERSION_GE(1, 10, 7)
  // use_file_locking = false, ignore_when_disabled = true (file systems without flock, e.g. some NFS).
  // Older libraries lock; readers then need HDF5_USE_FILE_LOCKING=FALSE while the job runs.
  DF_H5(H5Pset_file_locking(fapl, false, true), "disabling HDF5 file locking");
#endif
  return fapl;
}

bool link_exists(hid_t loc, const std::string& path) {
  // H5Lexists needs every intermediate component to exist, so walk the path.
  size_t pos = 0;
  while (true) {
    size_t next = path.find('/', pos);
    std::string prefix = next == std::string::npos ? path : path.substr(0, next);
    if (!prefix.empty() && prefix != "/") {
      if (H5Lexists(loc, prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    }
    if (next == std::string::npos) return true;
    pos = next + 1;
  }
}

std::vector<hsize_t> dims(hid_t dataset) {
  Handle space(H5Dget_space(dataset), Handle::Kind::Dataspace);
  if (!space.valid()) return {};
  int nd = H5Sget_simple_extent_ndims(space);
  if (nd < 0) return {};
  std::vector<hsize_t> d(static_cast<size_t>(nd));
  if (nd > 0) H5Sget_simple_extent_dims(space, d.data(), nullptr);
  return d;
}

static void delete_attr_if_present(hid_t obj, const std::string& name) {
  if (H5Aexists(obj, name.c_str()) > 0) DF_H5(H5Adelete(obj, name.c_str()), "replacing attribute " + name);
}

void write_attr_string(hid_t obj, const std::string& name, const std::string& value) {
  delete_attr_if_present(obj, name);
  // Variable-length UTF-8: h5py returns it as str (fixed-length strings come back as bytes).
  Handle type(DF_H5(H5Tcopy(H5T_C_S1), "string type"), Handle::Kind::Datatype);
  DF_H5(H5Tset_size(type, H5T_VARIABLE), "string size");
  DF_H5(H5Tset_cset(type, H5T_CSET_UTF8), "string charset");
  Handle space(DF_H5(H5Screate(H5S_SCALAR), "scalar space"), Handle::Kind::Dataspace);
  Handle attr(DF_H5(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), "creating attribute " + name),
              Handle::Kind::Attribute);
  const char* text = value.c_str();
  DF_H5(H5Awrite(attr, type, &text), "writing attribute " + name);
}

void write_attr_int64(hid_t obj, const std::string& name, int64_t value) {
  delete_attr_if_present(obj, name);
  Handle space(DF_H5(H5Screate(H5S_SCALAR), "scalar space"), Handle::Kind::Dataspace);
  Handle attr(DF_H5(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT),
                    "creating attribute " + name),
              Handle::Kind::Attribute);
  DF_H5(H5Awrite(attr, H5T_NATIVE_INT64, &value), "writing attribute " + name);
}

void write_attr_double(hid_t obj, const std::string& name, double value) {
  delete_attr_if_present(obj, name);
  Handle space(DF_H5(H5Screate(H5S_SCALAR), "scalar space"), Handle::Kind::Dataspace);
  Handle attr(DF_H5(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT),
                    "creating attribute " + name),
              Handle::Kind::Attribute);
  DF_H5(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value), "writing attribute " + name);
}

bool read_attr_string(hid_t obj, const std::string& name, std::string* value) {
  if (H5Aexists(obj, name.c_str()) <= 0) return false;
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), Handle::Kind::Attribute);
  if (!attr.valid()) return false;
  Handle type(H5Aget_type(attr), Handle::Kind::Datatype);
  if (H5Tget_class(type) != H5T_STRING) return false;
  Handle space(H5Aget_space(attr), Handle::Kind::Dataspace);
  if (H5Sget_simple_extent_npoints(space) != 1) return false;
  if (H5Tis_variable_str(type) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), Handle::Kind::Datatype);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5Tget_cset(type));
    char* s = nullptr;
    if (H5Aread(attr, mem, &s) < 0) return false;
    *value = s ? s : "";
    H5free_memory(s);
    return true;
  }
  size_t n = H5Tget_size(type);
  std::string buf(n, '\0');
  if (H5Aread(attr, type, buf.data()) < 0) return false;
  size_t end = buf.find('\0');
  *value = end == std::string::npos ? buf : buf.substr(0, end);
  return true;
}

bool read_attr_number(hid_t obj, const std::string& name, double* value) {
  if (H5Aexists(obj, name.c_str()) <= 0) return false;
  Handle attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), Handle::Kind::Attribute);
  if (!attr.valid()) return false;
  Handle type(H5Aget_type(attr), Handle::Kind::Datatype);
  H5T_class_t cls = H5Tget_class(type);
  if (cls != H5T_INTEGER && cls != H5T_FLOAT) return false;
  Handle space(H5Aget_space(attr), Handle::Kind::Dataspace);
  if (H5Sget_simple_extent_npoints(space) != 1) return false;
  return H5Aread(attr, H5T_NATIVE_DOUBLE, value) >= 0;
}

void make_coordinate_scale(hid_t ds) {
  if (H5DSis_scale(ds) > 0) return;
  char name[256] = {};
  DF_H5(H5Iget_name(ds, name, sizeof(name)), "naming a dimension scale");
  const char* base = std::strrchr(name, '/');
  DF_H5(H5DSset_scale(ds, base ? base + 1 : name), std::string("making ") + name + " a dimension scale");
}

Handle dimension_only_scale(hid_t group, const std::string& name, int64_t size) {
  if (link_exists(group, name))
    return Handle(DF_H5(H5Dopen2(group, name.c_str(), H5P_DEFAULT), "opening dimension " + name), Handle::Kind::Dataset);
  const bool unlimited = size == kUnlimitedDimension;
  const hsize_t dim = unlimited ? 0 : static_cast<hsize_t>(size), maxdim = unlimited ? H5S_UNLIMITED : dim;
  Handle space(DF_H5(H5Screate_simple(1, &dim, &maxdim), "dataspace of dimension " + name), Handle::Kind::Dataspace);
  Handle dcpl(DF_H5(H5Pcreate(H5P_DATASET_CREATE), "dataset properties"), Handle::Kind::PropList);
  if (unlimited) {
    const hsize_t chunk = 1024;
    DF_H5(H5Pset_chunk(dcpl, 1, &chunk), "chunking dimension " + name);
  }
  Handle ds(DF_H5(H5Dcreate2(group, name.c_str(), H5T_IEEE_F32BE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT),
                  "creating dimension " + name),
            Handle::Kind::Dataset);
  // The words netCDF-4 writes (and h5netcdf looks for) on a dimension that is not also a variable.
  DF_H5(H5DSset_scale(ds, "This is a netCDF dimension but not a netCDF variable."), "making " + name + " a dimension");
  return ds;
}

void attach_scale(hid_t ds, hid_t scale, unsigned axis) {
  if (DF_H5(H5DSis_attached(ds, scale, axis), "checking a dimension scale") > 0) return;
  DF_H5(H5DSattach_scale(ds, scale, axis), "attaching a dimension scale");
}

}  // namespace h5
}  // namespace dflash
