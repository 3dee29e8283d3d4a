// Reads metrics.h5 series and attributes back (tests, dflash-report).
#include <hdf5_hl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "data/h5_util.h"
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/safe_file.h"
#include "dflash/metrics.h"

namespace dflash {

using h5::Handle;

MetricsReader::MetricsReader(const std::string& path) : path_(path) {
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_CHECK(access(path.c_str(), R_OK) == 0, BadInput, "cannot read metrics file " << path);
  check_regular_input(path, "metrics file");  // a FIFO would block H5Fis_hdf5 for ever
  DF_CHECK(H5Fis_hdf5(path.c_str()) > 0, BadInput, "metrics file " << path << " is not an HDF5 file");
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  file_ = H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl);
  DF_CHECK(file_ >= 0, BadInput, "cannot open metrics file " << path);
}

MetricsReader::~MetricsReader() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (file_ >= 0) H5Fclose(file_);
}

bool MetricsReader::has(const std::string& series) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return h5::link_exists(file_, series);
}

namespace {
Handle open_dataset(hid_t file, const std::string& name, const std::string& path) {
  DF_CHECK(h5::link_exists(file, name), BadInput, "metrics file " << path << " has no series /" << name);
  Handle ds(H5Dopen2(file, name.c_str(), H5P_DEFAULT), Handle::Kind::Dataset);
  DF_CHECK(ds.valid(), BadInput, "metrics file " << path << ": /" << name << " is not a dataset");
  return ds;
}

Handle open_object(hid_t file, const std::string& object, const std::string& path) {
  DF_CHECK(object == "/" || h5::link_exists(file, object), BadInput,
           "metrics file " << path << " has no object " << object);
  Handle obj(H5Oopen(file, object.c_str(), H5P_DEFAULT), Handle::Kind::Object);
  DF_CHECK(obj.valid(), BadInput, "metrics file " << path << ": cannot open " << object);
  return obj;
}
}  // namespace

int64_t MetricsReader::rows(const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle ds = open_dataset(file_, name, path_);
  std::vector<hsize_t> d = h5::dims(ds);
  return d.empty() ? 0 : static_cast<int64_t>(d[0]);
}

std::vector<double> MetricsReader::series(const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle ds = open_dataset(file_, name, path_);
  std::vector<hsize_t> d = h5::dims(ds);
  DF_CHECK(d.size() == 1, BadInput, "metrics file " << path_ << ": /" << name << " is not 1-D");
  std::vector<double> out(d[0]);
  if (d[0] == 0) return out;
  Handle type(DF_H5(H5Dget_type(ds), "type of " + name), Handle::Kind::Datatype);
  if (H5Tget_class(type) == H5T_ENUM) {
    // HDF5 converts an enum only to an enum: read the values as the same enum over int64.
    Handle mem(DF_H5(H5Tenum_create(H5T_NATIVE_INT64), "enum type"), Handle::Kind::Datatype);
    const int members = DF_H5(H5Tget_nmembers(type), "enum members of " + name);
    Handle base(DF_H5(H5Tget_super(type), "enum base of " + name), Handle::Kind::Datatype);
    for (int i = 0; i < members; ++i) {
      char* member = H5Tget_member_name(type, static_cast<unsigned>(i));
      int64_t v = 0;
      std::vector<unsigned char> raw(std::max<size_t>(H5Tget_size(base), sizeof(v)));
      DF_H5(H5Tget_member_value(type, static_cast<unsigned>(i), raw.data()), "enum value of " + name);
      DF_H5(H5Tconvert(base, H5T_NATIVE_INT64, 1, raw.data(), nullptr, H5P_DEFAULT), "enum value of " + name);
      std::memcpy(&v, raw.data(), sizeof(v));
      DF_H5(H5Tenum_insert(mem, member, &v), "enum member of " + name);
      H5free_memory(member);
    }
    std::vector<int64_t> values(d[0]);
    DF_H5(H5Dread(ds, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "reading " + name + " of " + path_);
    for (size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(values[i]);
    return out;
  }
  DF_H5(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "reading " + name + " of " + path_);
  return out;
}

std::vector<std::string> MetricsReader::dimensions(const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle ds = open_dataset(file_, name, path_);
  const size_t rank = h5::dims(ds).size();
  std::vector<std::string> out(rank);
  for (size_t axis = 0; axis < rank; ++axis) {
    if (H5DSis_scale(ds) > 0) {  // a coordinate: its own dimension
      out[axis] = name.substr(name.rfind('/') + 1);
      continue;
    }
    auto scale_name = [](hid_t, unsigned, hid_t scale, void* op_data) -> herr_t {
      char full[256] = {};
      if (H5Iget_name(scale, full, sizeof(full)) < 0) return -1;
      const char* base = std::strrchr(full, '/');
      *static_cast<std::string*>(op_data) = base ? base + 1 : full;
      return 0;  // on: the last one attached names the dimension (as netCDF-C and h5netcdf take it)
    };
    if (H5DSget_num_scales(ds, static_cast<unsigned>(axis)) > 0)
      DF_H5(H5DSiterate_scales(ds, static_cast<unsigned>(axis), nullptr, scale_name, &out[axis]),
            "dimension scales of " + name);
  }
  return out;
}

std::vector<double> MetricsReader::matrix(const std::string& name, int64_t* cols) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle ds = open_dataset(file_, name, path_);
  std::vector<hsize_t> d = h5::dims(ds);
  DF_CHECK(d.size() == 2, BadInput, "metrics file " << path_ << ": /" << name << " is not 2-D");
  if (cols) *cols = static_cast<int64_t>(d[1]);
  std::vector<double> out(d[0] * d[1]);
  if (!out.empty())
    DF_H5(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), "reading " + name + " of " + path_);
  return out;
}

bool MetricsReader::has_attribute(const std::string& object, const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (object != "/" && !h5::link_exists(file_, object)) return false;
  Handle obj = open_object(file_, object, path_);
  return H5Aexists(obj, name.c_str()) > 0;
}

std::string MetricsReader::attribute_string(const std::string& object, const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle obj = open_object(file_, object, path_);
  std::string v;
  DF_CHECK(h5::read_attr_string(obj, name, &v), BadInput,
           "metrics file " << path_ << ": " << object << " has no string attribute " << name);
  return v;
}

double MetricsReader::attribute_number(const std::string& object, const std::string& name) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle obj = open_object(file_, object, path_);
  double v = 0;
  DF_CHECK(h5::read_attr_number(obj, name, &v), BadInput,
           "metrics file " << path_ << ": " << object << " has no numeric attribute " << name);
  return v;
}

std::vector<std::string> MetricsReader::attribute_names(const std::string& object) const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle obj = open_object(file_, object, path_);
  std::vector<std::string> names;
  hsize_t idx = 0;
  auto collect = [](hid_t, const char* attr_name, const H5A_info_t*, void* op_data) -> herr_t {
    static_cast<std::vector<std::string>*>(op_data)->push_back(attr_name);
    return 0;
  };
  DF_H5(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, &idx, collect, &names), "listing attributes of " + object);
  return names;
}

}  // namespace dflash
