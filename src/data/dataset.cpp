// Token dataset: writing (atomic) and opening with full validation. Layout: include/dflash/data.h,
// docs/data.md.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>

#include "data/h5_util.h"
#include "dflash/data.h"
#include "dflash/error.h"
#include "dflash/safe_file.h"

namespace dflash {

using h5::Handle;

void TokenRecords::add(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  DF_CHECK(mask.empty() || mask.size() == ids.size(), BadInput,
           "record " << num_records() << ": loss_mask has " << mask.size() << " entries for " << ids.size()
                     << " tokens");
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  if (mask.empty()) loss_mask.insert(loss_mask.end(), ids.size(), uint8_t{1});
  else loss_mask.insert(loss_mask.end(), mask.begin(), mask.end());
  offsets.push_back(static_cast<int64_t>(tokens.size()));
}

namespace {

// A 1-D contiguous dataset (chunked + deflate would cost a decompression per record read; the data
// is small next to the model and read randomly).
void write_1d(hid_t file, const char* name, hid_t file_type, hid_t mem_type, const void* data, size_t n,
              const std::string& path) {
  hsize_t dim = n;
  Handle space(DF_H5(H5Screate_simple(1, &dim, nullptr), "dataspace for " + path), Handle::Kind::Dataspace);
  Handle ds(DF_H5(H5Dcreate2(file, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  std::string("creating ") + name + " in " + path),
            Handle::Kind::Dataset);
  DF_H5(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), std::string("writing ") + name + " to " + path);
}

}  // namespace

void write_token_dataset(const std::string& path, const TokenRecords& records, int vocab_size,
                         const std::string& tokenizer) {
  DF_CHECK(records.num_records() > 0, BadInput, "refusing to write an empty dataset to " << path);
  DF_CHECK(records.offsets.front() == 0 && records.offsets.back() == records.num_tokens() &&
               records.loss_mask.size() == records.tokens.size(),
           Internal, "inconsistent TokenRecords for " << path);
  for (size_t r = 0; r < records.num_records(); ++r)
    DF_CHECK(records.offsets[r + 1] > records.offsets[r], BadInput, "record " << r << " is empty (writing " << path << ")");
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  // mkstemp's unpredictable name, created O_EXCL: a link planted at a guessable name cannot redirect the
  // write (include/dflash/safe_file.h); H5F_ACC_TRUNC then reopens the file it made.
  TempFile temp = create_temp_next_to(path);
  ::close(temp.fd);
  const std::string tmp = temp.path;
  {
    Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
    Handle file(DF_H5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), "creating " + tmp),
                Handle::Kind::File);
    write_1d(file, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, records.tokens.data(), records.tokens.size(), path);
    write_1d(file, "offsets", H5T_STD_I64LE, H5T_NATIVE_INT64, records.offsets.data(), records.offsets.size(), path);
    write_1d(file, "loss_mask", H5T_STD_U8LE, H5T_NATIVE_UINT8, records.loss_mask.data(), records.loss_mask.size(),
             path);
    h5::write_attr_int64(file, "vocab_size", vocab_size);
    h5::write_attr_string(file, "tokenizer", tokenizer);
    h5::write_attr_int64(file, "format_version", kTokenDatasetFormatVersion);
    DF_H5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flushing " + tmp);
  }
  DF_CHECK_HINT(std::rename(tmp.c_str(), path.c_str()) == 0, SystemFailure, "cannot rename " << tmp << " to " << path,
                "check that the output directory exists and is writable");
}

// ---- opening -------------------------------------------------------------------------------------

namespace {

Handle open_1d(hid_t file, const char* name, H5T_class_t cls, const std::string& path) {
  DF_CHECK_HINT(H5Lexists(file, name, H5P_DEFAULT) > 0, BadInput, "dataset " << path << " has no /" << name,
                "token datasets need /tokens, /offsets and /loss_mask (docs/data.md); convert JSONL with dflash-prep");
  // Only the file's own bytes: a soft or external link, external storage (raw data in other files) or a
  // virtual dataset would read whatever file it names, a path a dataset's author chose (docs/data.md).
  H5L_info_t link;
  DF_CHECK_HINT(H5Lget_info(file, name, &link, H5P_DEFAULT) >= 0 && link.type == H5L_TYPE_HARD, BadInput,
                "dataset " << path << ": /" << name << " is a soft or external link: refused (it would read another "
                           << "object or file)", "write the arrays into the file itself (dflash-prep, dflash-tokenize)");
  Handle ds(H5Dopen2(file, name, H5P_DEFAULT), Handle::Kind::Dataset);
  DF_CHECK(ds.valid(), BadInput, "dataset " << path << ": /" << name << " is not a dataset");
  Handle dcpl(H5Dget_create_plist(ds), Handle::Kind::PropList);
  DF_CHECK_HINT(dcpl.valid() && H5Pget_external_count(dcpl) == 0 && H5Pget_layout(dcpl) != H5D_VIRTUAL, BadInput,
                "dataset " << path << ": /" << name << " keeps its data outside the file (external storage or a "
                           << "virtual dataset): refused", "write the arrays into the file itself (dflash-prep, dflash-tokenize)");
  Handle type(H5Dget_type(ds), Handle::Kind::Datatype);
  DF_CHECK(H5Tget_class(type) == cls, BadInput, "dataset " << path << ": /" << name << " must be an integer array");
  DF_CHECK(h5::dims(ds).size() == 1, BadInput, "dataset " << path << ": /" << name << " must be 1-D");
  return ds;
}

constexpr hsize_t kScanChunk = 1 << 20;  // tokens read at once while validating

// An array must be stored in the file: a chunked dataset whose chunks were never written reads as fill
// values, so a 16 KB file can declare 2^34 tokens and keep the validation scan busy for hours (or its
// offsets fill memory). Unfiltered, the stored bytes are the declared bytes; compressed (someone's own
// writer: ours write contiguous arrays), at most 256 times fewer. Checked before anything is read.
void check_stored(hid_t ds, const char* name, const std::string& path) {
  Handle type(H5Dget_type(ds), Handle::Kind::Datatype);
  const hsize_t n = h5::dims(ds)[0];
  const double declared = static_cast<double>(n) * static_cast<double>(H5Tget_size(type));
  const double stored = static_cast<double>(H5Dget_storage_size(ds));
  Handle dcpl(H5Dget_create_plist(ds), Handle::Kind::PropList);
  const bool filtered = dcpl.valid() && H5Pget_nfilters(dcpl) > 0;
  DF_CHECK_HINT(filtered ? stored * 256 >= declared : stored >= declared, BadInput,
                "dataset " << path << ": /" << name << " declares " << n << " entries (" << declared
                           << " bytes) but the file stores " << stored << " bytes of it (unwritten chunks read as "
                           << "fill values): refused before reading",
                "write the arrays in full (dflash-prep, dflash-tokenize)");
}

// Identity, size and modification time of the file at `path` (false when it cannot be stat'ed).
bool stat_file(const std::string& path, uint64_t* dev, uint64_t* ino, int64_t* size, int64_t* mtime_ns) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *dev = static_cast<uint64_t>(st.st_dev);
  *ino = static_cast<uint64_t>(st.st_ino);
  *size = static_cast<int64_t>(st.st_size);
  *mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return true;
}

}  // namespace

// The attribute is the vocabulary the ids were made for. A target's embedding has that many rows or a few
// padding rows more (Qwen3: 151669 tokenizer ids, 151936 rows); a dataset made for another vocabulary passes
// the id check whenever its ids happen to be smaller, and trains on the wrong tokens.
void check_dataset_vocabulary(const std::string& path, int dataset_vocab, int target_vocab) {
  const int64_t padding = static_cast<int64_t>(target_vocab) - dataset_vocab;
  const int64_t max_padding = std::min<int64_t>(2048, target_vocab / 16);
  DF_CHECK_HINT(padding >= 0 && padding <= max_padding, BadInput,
                "dataset " << path << " was tokenized for a vocabulary of " << dataset_vocab << " ids (its vocab_size"
                           << " attribute), the target has " << target_vocab << " embedding rows"
                           << (padding < 0 ? "" : " (more padding rows than any tokenizer leaves)"),
                "tokenize the data with the target's own tokenizer (dflash-tokenize TARGET_DIR IN.jsonl OUT.h5, "
                "dflash-prep --target TARGET_DIR)");
}

TokenDataset::TokenDataset(const std::string& path, int target_vocab_size) : path_(path) {
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_CHECK_HINT(access(path.c_str(), R_OK) == 0, BadInput, "cannot read dataset " << path,
                "check --data; convert JSONL with dflash-prep");
  check_regular_input(path, "dataset");  // before HDF5 touches it: a FIFO would block H5Fis_hdf5 for ever
  DF_CHECK_HINT(H5Fis_hdf5(path.c_str()) > 0, BadInput, "dataset " << path << " is not an HDF5 file",
                "convert JSONL records with dflash-prep IN.jsonl OUT.h5 (docs/data.md)");
  // Stamped before it is opened: a change during the validation below is caught by the first read.
  DF_CHECK_HINT(stat_file(path, &stamp_.dev, &stamp_.ino, &stamp_.size, &stamp_.mtime_ns), BadInput,
                "cannot stat dataset " << path << ": " << std::strerror(errno), "check --data");
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), Handle::Kind::File);
  DF_CHECK(file.valid(), BadInput, "cannot open dataset " << path << " (corrupt HDF5 file?)");

  double attr = 0;
  DF_CHECK(h5::read_attr_number(file, "vocab_size", &attr), BadInput,
           "dataset " << path << " has no vocab_size attribute");
  vocab_size_ = static_cast<int>(attr);
  format_version_ = h5::read_attr_number(file, "format_version", &attr) ? static_cast<int>(attr) : 0;
  DF_CHECK_HINT(format_version_ == kTokenDatasetFormatVersion, BadInput,
                "dataset " << path << " has format_version " << format_version_ << ", this build reads "
                           << kTokenDatasetFormatVersion,
                "re-convert the data with this build's dflash-prep");
  h5::read_attr_string(file, "tokenizer", &tokenizer_);
  const int vocab = target_vocab_size > 0 ? target_vocab_size : vocab_size_;
  DF_CHECK(vocab > 0, BadInput, "dataset " << path << ": vocab_size " << vocab_size_ << " is not positive");
  if (target_vocab_size > 0) check_dataset_vocabulary(path, vocab_size_, target_vocab_size);

  Handle tokens = open_1d(file, "tokens", H5T_INTEGER, path);
  Handle offsets = open_1d(file, "offsets", H5T_INTEGER, path);
  Handle mask = open_1d(file, "loss_mask", H5T_INTEGER, path);
  check_stored(tokens, "tokens", path);
  check_stored(offsets, "offsets", path);
  check_stored(mask, "loss_mask", path);
  const int64_t n_tokens = static_cast<int64_t>(h5::dims(tokens)[0]);
  const int64_t n_mask = static_cast<int64_t>(h5::dims(mask)[0]);
  const size_t n_offsets = h5::dims(offsets)[0];
  DF_CHECK(n_offsets >= 2 && n_tokens > 0, BadInput,
           "dataset " << path << " is empty (" << (n_offsets ? n_offsets - 1 : 0) << " records, " << n_tokens
                      << " tokens)");
  DF_CHECK(n_mask == n_tokens, BadInput,
           "dataset " << path << ": /loss_mask has " << n_mask << " entries but /tokens has " << n_tokens);

  offsets_.resize(n_offsets);
  DF_H5(H5Dread(offsets, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, offsets_.data()), "reading /offsets of " + path);
  DF_CHECK(offsets_[0] == 0, BadInput, "dataset " << path << ": offsets[0] is " << offsets_[0] << ", must be 0");
  for (size_t r = 0; r + 1 < n_offsets; ++r) {
    DF_CHECK(offsets_[r + 1] >= offsets_[r], BadInput,
             "dataset " << path << ": offsets decrease at record " << r << " (" << offsets_[r] << " -> "
                        << offsets_[r + 1] << ")");
    DF_CHECK(offsets_[r + 1] > offsets_[r], BadInput, "dataset " << path << ": record " << r << " is empty");
  }
  DF_CHECK(offsets_.back() == n_tokens, BadInput,
           "dataset " << path << ": offsets end at " << offsets_.back() << " but /tokens has " << n_tokens
                      << " entries (record " << n_offsets - 2 << ")");

  // Scan ids and mask values chunk by chunk (bounded memory for large datasets), counting loss tokens
  // and anchor positions (pairs of masked tokens inside one record) on the way.
  std::vector<int32_t> ids;
  std::vector<uint8_t> m;
  size_t scan_rec = 0;       // record of the position being scanned
  bool prev_masked = false;  // loss_mask of the previous position, when it is in the same record
  for (hsize_t begin = 0; begin < static_cast<hsize_t>(n_tokens); begin += kScanChunk) {
    hsize_t count = std::min<hsize_t>(kScanChunk, static_cast<hsize_t>(n_tokens) - begin);
    ids.resize(count);
    m.resize(count);
    Handle mem(H5Screate_simple(1, &count, nullptr), Handle::Kind::Dataspace);
    Handle fs(H5Dget_space(tokens), Handle::Kind::Dataspace);
    DF_H5(H5Sselect_hyperslab(fs, H5S_SELECT_SET, &begin, nullptr, &count, nullptr), "selecting tokens");
    DF_H5(H5Dread(tokens, H5T_NATIVE_INT32, mem, fs, H5P_DEFAULT, ids.data()), "reading /tokens of " + path);
    Handle ms(H5Dget_space(mask), Handle::Kind::Dataspace);
    DF_H5(H5Sselect_hyperslab(ms, H5S_SELECT_SET, &begin, nullptr, &count, nullptr), "selecting loss_mask");
    DF_H5(H5Dread(mask, H5T_NATIVE_UINT8, mem, ms, H5P_DEFAULT, m.data()), "reading /loss_mask of " + path);
    for (hsize_t i = 0; i < count; ++i) {
      const int64_t p = static_cast<int64_t>(begin + i);
      if (p == offsets_[scan_rec + 1]) {
        ++scan_rec;
        prev_masked = false;
      }
      loss_tokens_ += m[i] == 1;
      anchor_positions_ += prev_masked && m[i] == 1;
      prev_masked = m[i] == 1;
      if (ids[i] >= 0 && ids[i] < vocab && m[i] <= 1) continue;
      const int64_t pos = static_cast<int64_t>(begin + i);
      const size_t rec = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), pos) - offsets_.begin()) - 1;
      DF_CHECK(m[i] <= 1, BadInput,
               "dataset " << path << ": record " << rec << " has loss_mask value " << int(m[i]) << " (must be 0 or 1)");
      DF_FAIL(BadInput,
              "dataset " << path << ": record " << rec << " has token id " << ids[i] << " at position "
                         << pos - offsets_[rec] << ", outside the target's vocab [0, " << vocab << ")",
              "the dataset must be tokenized with the target's tokenizer");
    }
  }
  tokens_ds_ = tokens.release();
  mask_ds_ = mask.release();
  file_ = file.release();
}

TokenDataset::~TokenDataset() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (tokens_ds_ >= 0) H5Dclose(tokens_ds_);
  if (mask_ds_ >= 0) H5Dclose(mask_ds_);
  if (file_ >= 0) H5Fclose(file_);
}

void TokenDataset::read_record(size_t r, std::vector<int32_t>& tokens, std::vector<uint8_t>& loss_mask,
                               int64_t max_tokens, bool check_file) const {
  DF_ASSERT(r < num_records());
  int64_t len = record_length(r);
  if (max_tokens >= 0) len = std::min(len, max_tokens);
  if (len == 0) return;
  hsize_t begin = static_cast<hsize_t>(offsets_[r]), count = static_cast<hsize_t>(len);
  size_t at = tokens.size();
  tokens.resize(at + count);
  loss_mask.resize(at + count);
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  Handle mem(DF_H5(H5Screate_simple(1, &count, nullptr), "record dataspace"), Handle::Kind::Dataspace);
  Handle ts(DF_H5(H5Dget_space(tokens_ds_), "tokens dataspace"), Handle::Kind::Dataspace);
  DF_H5(H5Sselect_hyperslab(ts, H5S_SELECT_SET, &begin, nullptr, &count, nullptr), "selecting a record");
  DF_H5(H5Dread(tokens_ds_, H5T_NATIVE_INT32, mem, ts, H5P_DEFAULT, tokens.data() + at),
        "reading record " + std::to_string(r) + " of " + path_);
  Handle ms(DF_H5(H5Dget_space(mask_ds_), "loss_mask dataspace"), Handle::Kind::Dataspace);
  DF_H5(H5Sselect_hyperslab(ms, H5S_SELECT_SET, &begin, nullptr, &count, nullptr), "selecting a record");
  DF_H5(H5Dread(mask_ds_, H5T_NATIVE_UINT8, mem, ms, H5P_DEFAULT, loss_mask.data() + at),
        "reading record " + std::to_string(r) + " of " + path_);
  // After the read: a change before or during it is caught here, before the record is used.
  if (check_file) check_unchanged();
}

void TokenDataset::check_unchanged() const {
  FileStamp now;
  const bool readable = stat_file(path_, &now.dev, &now.ino, &now.size, &now.mtime_ns);
  if (readable && now.dev == stamp_.dev && now.ino == stamp_.ino && now.size == stamp_.size &&
      now.mtime_ns == stamp_.mtime_ns)
    return;
  std::ostringstream what;
  if (!readable) what << "was removed";
  else if (now.dev != stamp_.dev || now.ino != stamp_.ino) what << "was replaced by another file";
  else if (now.size != stamp_.size) what << "changed size from " << stamp_.size << " to " << now.size << " bytes";
  else what << "was rewritten (its modification time changed)";
  DF_FAIL(BadInput, "dataset " << path_ << " " << what.str() << " while this job reads it",
          "never rewrite or truncate a dataset a job is reading: write a new file, and start a new run on it (or "
          "resume this one on the original)");
}

TokenRecords TokenDataset::read_all() const {
  TokenRecords out;
  out.tokens.reserve(static_cast<size_t>(num_tokens()));
  out.loss_mask.reserve(static_cast<size_t>(num_tokens()));
  for (size_t r = 0; r < num_records(); ++r) read_record(r, out.tokens, out.loss_mask);
  out.offsets = offsets_;
  return out;
}

}  // namespace dflash
