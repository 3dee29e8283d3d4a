// Checkpoint directories: save (manifest last), discovery of the newest complete one, load, pruning.
//
// Commit protocol: state.safetensors (atomic: temp, fsync, rename, dir fsync) -> optional extra files
// (a release export) -> fsync of the step and checkpoint directories -> manifest.json (atomic). A crash
// at any point before the manifest's rename leaves a directory without a manifest, which discovery
// skips; the manifest records every file's size, so a file truncated after the fact is caught as well.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/safe_dir.h"
#include "dflash/safe_file.h"
#include "dflash/safetensors.h"
#include "io/json_file.h"

namespace fs = std::filesystem;

namespace dflash {
namespace {

constexpr const char* kFormat = "dflash-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "manifest.json";
constexpr const char* kStateFile = "state.safetensors";
constexpr const char* kStepPrefix = "step-";
// Written first into a step directory: the run (lineage) saving it, so a save interrupted before its
// manifest can be told apart from another run's leftover.
constexpr const char* kWriterFile = "writer.run_id";
constexpr const char* kCorruptHint =
    "the checkpoint is damaged: resume from an older one (--resume CHECKPOINT_DIR/step-XXXXXXXX) or "
    "move this directory away (mv DIR DIR.damaged) so --resume auto picks the previous one";

// Tensor names inside state.safetensors.
constexpr const char* kMaster = "drafter.master";
constexpr const char* kAdamM = "adam.m";
constexpr const char* kAdamV = "adam.v";
std::string consumed_tensor_name(int64_t epoch) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "data.consumed.epoch%08lld", static_cast<long long>(epoch));
  return buf;
}

std::string rng_tensor_name(size_t rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rng.rank%05zu", rank);
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The manifest's own hash: over its canonical text without the "manifest_hash" field (nlohmann::json keeps
// keys sorted and prints numbers in their shortest round-trip form, so a parsed manifest prints the text it
// was hashed as). It covers the step, the data positions and the schedule, which no tensor hash does: an
// edited manifest would resume with gaps or skipped data.
constexpr const char* kManifestHash = "manifest_hash";
std::string manifest_hash_of(nlohmann::json m) {
  m.erase(kManifestHash);
  const std::string text = m.dump();
  return hex64(content_hash64(text.data(), text.size()));
}

void note(const std::string& text) {
  const std::string line = "[dflash checkpoint] " + text + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}
bool is_first_rank() { return process_identity().world_rank <= 0; }

// "step-00001200" -> 1200; -1 for any other name.
int64_t parse_step_name(const std::string& name) {
  const size_t p = std::strlen(kStepPrefix);
  if (name.size() < p + 8 || name.compare(0, p, kStepPrefix) != 0) return -1;
  int64_t v = 0;
  for (size_t i = p; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// Step directories in checkpoint_dir, newest first. Listed through the held run directory's descriptor
// (include/dflash/safe_dir.h: a link at checkpoint_dir, or on its way under --out, lists nothing), each
// entry's own type, never followed: a step-XXXXXXXX that is a link (or a file) is not a checkpoint of this
// directory, and goes into `refused` (when given) for discovery to name.
std::vector<std::pair<int64_t, std::string>> list_step_dirs(const std::string& checkpoint_dir,
                                                            std::vector<std::string>* refused = nullptr) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::vector<DirEntry> entries;
  if (list_own_dir(checkpoint_dir, &entries) != 0) return out;
  for (const DirEntry& e : entries) {
    const int64_t step = parse_step_name(e.name);
    const std::string path = (fs::path(checkpoint_dir) / e.name).string();
    if (step >= 0 && e.type == S_IFDIR) out.emplace_back(step, path);
    else if (step >= 0 && refused != nullptr) refused->push_back(path);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

// Whether anything (a link included) is at `path`, looked at through the held descriptor.
bool entry_exists(const std::string& path) {
  struct stat st;
  return stat_own_entry(path, &st) == 0;
}

void fsync_dir(const std::string& dir) {
  const DirFd d = open_dir(dir, MissingDirs::Refuse);  // never through a link under --out (safe_dir.h)
  DF_CHECK(d.valid(), SystemFailure, "cannot open directory " << dir << " to fsync it: " << std::strerror(errno));
  const int rc = ::fsync(d.get());
  const int err = errno;
  // Some network filesystems refuse fsync on directories; that is not a write failure.
  DF_CHECK(rc == 0 || err == EINVAL || err == EROFS, SystemFailure,
           "fsync of directory " << dir << " failed: " << std::strerror(err));
}

// Made (or walked) from the held run directory's descriptor: a link on the way, planted before the start or
// swapped in mid-run, is refused instead of written through (include/dflash/safe_dir.h).
void make_dirs(const std::string& dir) {
  create_dirs(dir, "check that the parent of --checkpoint-dir exists and is writable");
}

// Through descriptors only: a link inside (or at) the step directory is unlinked, what it names untouched.
void remove_tree(const std::string& dir) {
  // The manifest goes first: a directory half-deleted by a crash must never look complete.
  int err = remove_tree_at((fs::path(dir) / kManifest).string());
  if (err == 0) err = remove_tree_at(dir);
  if (err != 0) note("warning: could not remove " + dir + ": " + std::strerror(err));
}

// Every regular file under step_dir (relative path -> size), temp files of atomic writes excluded; a link
// found there (planted mid-save) is not one of them, nor followed (the directory iterator does not descend
// into linked directories either).
std::map<std::string, uint64_t> list_files(const std::string& step_dir) {
  std::map<std::string, uint64_t> files;
  for (const auto& entry : fs::recursive_directory_iterator(step_dir)) {
    if (!entry.is_regular_file() || entry.is_symlink()) continue;
    const std::string rel = fs::relative(entry.path(), step_dir).string();
    if (rel == kManifest || rel.find(".tmp.") != std::string::npos) continue;
    files[rel] = static_cast<uint64_t>(entry.file_size());
  }
  return files;
}

std::string now_utc_iso() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool has_manifest(const std::string& step_dir) { return entry_exists((fs::path(step_dir) / kManifest).string()); }

// The parsed manifest, or a reason it is not a committed checkpoint.
bool read_manifest(const std::string& step_dir, nlohmann::json* out, std::string* why) {
  const std::string path = (fs::path(step_dir) / kManifest).string();
  // Through the held descriptor, never through a link (include/dflash/safe_file.h's LinkPolicy::Refuse): a
  // link planted at a manifest, or at a directory on its way, cannot make a resume read a file elsewhere.
  JsonFile manifest = try_read_json_file(path, JsonExpect::Object, LinkPolicy::Refuse);
  if (manifest.status == JsonFileStatus::Missing) {
    *why = "no " + std::string(kManifest) + " (never committed: interrupted while saving)";
    return false;
  }
  if (manifest.status == JsonFileStatus::Unreadable) {
    *why = manifest.error;
    return false;
  }
  if (!manifest.ok()) {
    *why = path + " is not valid JSON";
    return false;
  }
  nlohmann::json& j = manifest.value;
  if (j.value("format", "") != kFormat || j.value("format_version", 0) != kFormatVersion) {
    *why = path + " is not a " + std::string(kFormat) + " v" + std::to_string(kFormatVersion) + " manifest";
    return false;
  }
  if (!j.value("complete", false)) {
    *why = path + " does not say complete";
    return false;
  }
  if (!j.contains(kManifestHash) || !j[kManifestHash].is_string()) {
    *why = path + " has no '" + std::string(kManifestHash) + "' (edited, or written by a build before manifests were hashed)";
    return false;
  }
  if (j[kManifestHash].get<std::string>() != manifest_hash_of(j)) {
    *why = path + " does not match its recorded hash (edited or damaged: its step, data positions or schedule "
           "cannot be trusted)";
    return false;
  }
  if (!j.contains("files") || !j["files"].is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
    *why = path + " lacks 'files' or 'step'";
    return false;
  }
  for (const auto& [rel, size] : j["files"].items()) {
    const fs::path f = fs::path(step_dir) / rel;
    if (!size.is_number_unsigned()) {
      *why = path + ": bad size for " + rel;
      return false;
    }
    struct stat st;  // the entry itself, reached through the held descriptor: a link is not the file
    const int err = stat_own_entry(f.string(), &st);
    if (err != 0 || !S_ISREG(st.st_mode)) {
      *why = f.string() + (err == ENOENT ? std::string(" is missing")
                           : err != 0   ? ": " + own_file_error(err)
                           : S_ISLNK(st.st_mode) ? ": " + own_file_error(ELOOP)
                                                 : ": " + own_file_error(EINVAL));
      return false;
    }
    const uintmax_t actual = static_cast<uintmax_t>(st.st_size);
    if (actual != size.get<uint64_t>()) {
      *why = f.string() + " has " + std::to_string(actual) + " bytes, the manifest says " +
             std::to_string(size.get<uint64_t>()) + " (truncated or overwritten)";
      return false;
    }
  }
  *out = std::move(j);
  return true;
}

// Renames dir to dir + suffix (".2", ".3", ... appended when that exists): kept, but out of discovery's
// way (a name that is not step-XXXXXXXX is never listed).
void set_aside(const std::string& dir, const std::string& suffix, const std::string& why) {
  std::string aside = dir + suffix;
  int err = EEXIST;  // an entry that appears at the name meanwhile is never replaced: the next number
  for (int n = 2; err == EEXIST && n < 1000; ++n) {
    if (!entry_exists(aside)) err = rename_path(dir, aside, RenameOver::Never);
    if (err == EEXIST) aside = dir + suffix + "." + std::to_string(n);
  }
  note("set aside " + dir + " (" + why + ") as " + aside + (err ? std::string(": ") + std::strerror(err) : ""));
}

// The run that wrote step_dir: the manifest's run_id when committed, else the marker a save writes first
// ("" for checkpoints of builds before run ids). false when neither says (damaged, or not ours to judge).
bool lineage_of(const std::string& step_dir, bool complete, std::string* run_id) {
  if (complete) {
    nlohmann::json m;
    std::string why;
    if (!read_manifest(step_dir, &m, &why)) return false;
    *run_id = m.value("run_id", "");
    return true;
  }
  std::string text;  // through the held descriptor, never a link (a few bytes: 16 hex digits and a newline)
  if (read_own_text((fs::path(step_dir) / kWriterFile).string(), 4096, HardLinks::Accept, &text) != 0) return false;
  *run_id = text.substr(0, text.find('\n'));
  return true;
}

// Typed field access with a BadInput error naming the manifest.
template <class T> T field(const nlohmann::json& j, const char* key, const std::string& manifest) {
  DF_CHECK_HINT(j.contains(key), BadInput, manifest << " lacks the field '" << key << "'", kCorruptHint);
  try {
    return j.at(key).get<T>();
  } catch (const std::exception& e) {
    DF_FAIL(BadInput, manifest << ": field '" << key << "' has the wrong type: " << e.what(), kCorruptHint);
  }
}

const TensorInfo& state_tensor(const SafetensorsFile& f, const std::string& name, DType dtype) {
  DF_CHECK_HINT(f.has(name), BadInput, f.path() << " lacks the tensor " << name, kCorruptHint);
  const TensorInfo& t = f.get(name);
  DF_CHECK_HINT(t.dtype == dtype && t.shape.size() == 1, BadInput,
                f.path() << ": tensor " << name << " is " << dtype_name(t.dtype) << " " << t.shape_str()
                         << ", expected 1-D " << dtype_name(dtype),
                kCorruptHint);
  return t;
}

void check_hash(const nlohmann::json& hashes, const std::string& name, const void* data, size_t nbytes,
                const std::string& where) {
  DF_CHECK_HINT(hashes.contains(name) && hashes[name].is_string(), BadInput,
                where << ": the manifest has no content hash for " << name, kCorruptHint);
  const std::string want = hashes[name].get<std::string>();
  const std::string got = hex64(content_hash64(data, nbytes));
  DF_CHECK_HINT(want == got, BadInput,
                "corrupt checkpoint " << where << ": content hash of " << name << " is " << got
                                      << ", the manifest says " << want,
                kCorruptHint);
}

}  // namespace

// Data resume points as JSON: [{"position": "dflash-data-pos v1 ...", "done_after": [[index, "..."], ...]}]
nlohmann::json data_points_to_json(const std::vector<DataResumePoint>& data) {
  nlohmann::json a = nlohmann::json::array();
  for (const DataResumePoint& p : data) {
    nlohmann::json done = nlohmann::json::array();
    for (const auto& [index, next] : p.done_after) done.push_back({index, next.to_string()});
    a.push_back({{"position", p.position.to_string()}, {"done_after", done}});
  }
  return a;
}

std::vector<DataResumePoint> data_points_from_json(const nlohmann::json& a, const std::string& manifest) {
  DF_CHECK_HINT(a.is_array(), BadInput, manifest << ": 'data' is not an array", kCorruptHint);
  std::vector<DataResumePoint> out;
  for (const auto& e : a) {
    DataResumePoint p;
    p.position = DataPosition::parse(field<std::string>(e, "position", manifest));
    for (const auto& d : field<nlohmann::json>(e, "done_after", manifest)) {
      DF_CHECK_HINT(d.is_array() && d.size() == 2 && d[0].is_number_integer() && d[1].is_string(), BadInput,
                    manifest << ": malformed 'done_after' entry " << d.dump(), kCorruptHint);
      p.done_after.emplace_back(d[0].get<int64_t>(), DataPosition::parse(d[1].get<std::string>()));
    }
    out.push_back(std::move(p));
  }
  return out;
}


// ---- content hash: 4 independent 64-bit lanes (fast on multi-GB checkpoints), then a final mix ------

uint64_t content_hash64(const void* data, size_t nbytes) {
  constexpr uint64_t P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL, P3 = 0x165667B19E3779F9ULL;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto round = [&](uint64_t acc, uint64_t w) { return rotl(acc + w * P2, 31) * P1; };
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint64_t lane[4] = {P1 + P2, P2, 0, 0 - P1};
  size_t i = 0;
  for (; i + 32 <= nbytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = round(lane[k], w);
    }
  uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
  for (int k = 0; k < 4; ++k) h = (h ^ round(0, lane[k])) * P1 + P3;
  h += static_cast<uint64_t>(nbytes);
  for (; i + 8 <= nbytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = rotl(h ^ round(0, w), 27) * P1 + P3;
  }
  for (; i < nbytes; ++i) h = rotl(h ^ (p[i] * P1), 11) * P2;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

std::string checkpoint_step_dir(const std::string& checkpoint_dir, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return (fs::path(checkpoint_dir) / name).string();
}

// ---- save ---------------------------------------------------------------------------------------

std::string save_checkpoint(const std::string& checkpoint_dir, const CheckpointState& state,
                            const CheckpointTensors& tensors, const CheckpointSaveOptions& opt) {
  DF_ASSERT(opt.keep_last >= 1);
  DF_ASSERT(state.step >= 0);
  const size_t n = tensors.master.numel();
  for (const Tensor* t : {&tensors.master, &tensors.adam_m, &tensors.adam_v})
    DF_CHECK(t->dtype == DType::F32 && t->device == Device::CPU && t->numel() == n && t->data, Internal,
             "save_checkpoint: master/m/v must be CPU fp32 views of one length (" << n << "), got "
                                                                               << t->shape_str());
  make_dirs(checkpoint_dir);
  const std::string step_dir = checkpoint_step_dir(checkpoint_dir, state.step);

  std::string why, owner;
  bool complete = checkpoint_is_complete(step_dir, &why);
  if (entry_exists(step_dir)) {
    // This run's own (a resumed run saving the step it resumed at, or its interrupted save) is kept or
    // redone; anything else there is set aside, never deleted and never passed off as this run's state.
    const bool ours = lineage_of(step_dir, complete, &owner) && owner == state.run_id;
    if (complete && !ours) {
      set_aside(step_dir, ".other-run", "a checkpoint of another run at this step");
      complete = false;
    } else if (!complete && ours) {
      note("removing this run's incomplete " + step_dir + " (" + why + ")");
      remove_tree(step_dir);
    } else if (!complete) {
      set_aside(step_dir, has_manifest(step_dir) ? ".damaged" : ".incomplete", why);
    }
  }
  if (complete) {
    note("a complete checkpoint for step " + std::to_string(state.step) + " already exists; keeping " + step_dir);
  } else {
    make_dirs(step_dir);
    write_file_atomic((fs::path(step_dir) / kWriterFile).string(), state.run_id + "\n");

    std::vector<TensorToWrite> out;
    nlohmann::json hashes = nlohmann::json::object();
    const int64_t len = static_cast<int64_t>(n);
    out.push_back({kMaster, DType::F32, {len}, tensors.master.ptr<float>(), nullptr});
    out.push_back({kAdamM, DType::F32, {len}, tensors.adam_m.ptr<float>(), nullptr});
    out.push_back({kAdamV, DType::F32, {len}, tensors.adam_v.ptr<float>(), nullptr});
    for (const TensorToWrite& t : out) hashes[t.name] = hex64(content_hash64(t.f32, n * sizeof(float)));
    for (size_t r = 0; r < state.rng_states.size(); ++r) {
      const std::string& s = state.rng_states[r];
      out.push_back({rng_tensor_name(r), DType::U8, {static_cast<int64_t>(s.size())}, nullptr, s.data()});
      hashes[rng_tensor_name(r)] = hex64(content_hash64(s.data(), s.size()));
    }
    std::vector<std::string> consumed_names;  // alive until the write
    for (const auto& [epoch, set] : state.consumed) consumed_names.push_back(consumed_tensor_name(epoch));
    size_t ci = 0;
    for (const auto& [epoch, set] : state.consumed) {
      const std::vector<uint8_t>& b = set.bytes();
      out.push_back({consumed_names[ci], DType::U8, {static_cast<int64_t>(b.size())}, nullptr, b.data()});
      hashes[consumed_names[ci++]] = hex64(content_hash64(b.data(), b.size()));
    }
    write_safetensors((fs::path(step_dir) / kStateFile).string(), out,
                      {{"format", kFormat}, {"step", std::to_string(state.step)}});
    if (opt.also_write) opt.also_write(step_dir);
    // Everything the manifest will vouch for must be durable before the manifest is.
    fsync_dir(step_dir);
    fsync_dir(checkpoint_dir);

    nlohmann::json m;
    m["format"] = kFormat;
    m["format_version"] = kFormatVersion;
    m["step"] = state.step;
    m["created_utc"] = now_utc_iso();
    m["schedule"] = state.schedule;
    m["data"] = data_points_to_json(state.data);
    // Epochs begun under an earlier split: one U8 bit set per epoch (record r = bit r % 8 of byte r / 8).
    m["consumed"] = nlohmann::json::array();
    for (const auto& [epoch, set] : state.consumed)
      m["consumed"].push_back({{"epoch", epoch}, {"records", set.size()}, {"tensor", consumed_tensor_name(epoch)}});
    m["num_rng_states"] = state.rng_states.size();
    m["num_params"] = n;
    m["run_id"] = state.run_id;
    m["options_hash"] = options_hash(state.options);
    m["options"] = state.options;
    m["state_file"] = kStateFile;
    m["content_hashes"] = hashes;
    m["files"] = list_files(step_dir);
    m["complete"] = true;
    m[kManifestHash] = manifest_hash_of(m);
    write_file_atomic((fs::path(step_dir) / kManifest).string(), m.dump(2) + "\n");
  }

  // Prune, this run's own checkpoints only (its run_id: written by it or by the earlier segments it
  // resumed from): the newest keep_last complete ones up to this step stay, older ones and its own
  // interrupted saves go. Another run's checkpoints, and damaged ones, are never deleted: a manifest
  // that does not parse may still be repaired by hand. Complete ones newer than this step belong to a
  // timeline abandoned by resuming from an older checkpoint: set aside (renamed, not deleted) so
  // --resume auto never jumps back onto it.
  int kept = 0;
  for (const auto& [step, dir] : list_step_dirs(checkpoint_dir)) {
    const bool is_complete = checkpoint_is_complete(dir);
    if (step > state.step) {
      if (is_complete) set_aside(dir, ".superseded", "newer than the resumed run's step " + std::to_string(state.step));
      continue;
    }
    std::string run_id;
    if (!lineage_of(dir, is_complete, &run_id) || run_id != state.run_id) continue;
    if (is_complete && kept < opt.keep_last) {
      ++kept;
      continue;
    }
    remove_tree(dir);
  }
  return step_dir;
}

// ---- discovery ----------------------------------------------------------------------------------

bool checkpoint_is_complete(const std::string& step_dir, std::string* why) {
  nlohmann::json m;
  std::string reason;
  const bool ok = read_manifest(step_dir, &m, &reason);
  if (why) *why = reason;
  return ok;
}

std::string find_latest_checkpoint(const std::string& checkpoint_dir) {
  // A link at the checkpoint directory (or on its way under --out) would silently list nothing, and a
  // requeue would start from scratch: refused, naming it.
  if (const DirFd d = open_dir(checkpoint_dir, MissingDirs::Refuse); !d.valid() && errno != ENOENT)
    DF_FAIL(BadOptions, "cannot look for checkpoints in " << checkpoint_dir << ": "
                            << (errno == ELOOP ? "it, or a directory on its way in the run directory, is a symbolic link "
                                                 "(refused: a resume reads only the run directory's own files)"
                                               : std::string(std::strerror(errno))),
            "remove the link (or the file in its place); if the checkpoints are elsewhere, give --checkpoint-dir there");
  std::vector<std::string> refused;
  const auto dirs = list_step_dirs(checkpoint_dir, &refused);
  if (is_first_rank())
    for (const std::string& r : refused)
      note("skipping " + r + ": it is a symbolic link or not a directory (refused: a resume reads only the "
           "checkpoint directory's own step directories)");
  for (const auto& [step, dir] : dirs) {
    std::string why;
    if (checkpoint_is_complete(dir, &why)) return dir;
    // No manifest: a save interrupted before its commit, which the protocol expects. A manifest that is
    // there but does not vouch for the directory (not JSON, files missing or of other sizes) is damage
    // after the commit: falling back to an older checkpoint, or to a fresh start, would silently throw
    // away the training since, so it is refused like a corrupt state file.
    DF_CHECK_HINT(!has_manifest(dir), BadInput,
                  "damaged checkpoint " << dir << ": " << why << " (--resume would skip it and lose the steps since the "
                                        << "previous checkpoint)",
                  kCorruptHint);
    if (is_first_rank()) note("skipping " + dir + ": " + why);
  }
  return "";
}

std::string resolve_resume(const std::string& resume, const std::string& checkpoint_dir) {
  if (resume.empty()) return "";
  std::error_code ec;
  if (resume == "auto") {
    const std::string dir = find_latest_checkpoint(checkpoint_dir);
    if (is_first_rank())
      note(dir.empty() ? "--resume auto: no complete checkpoint in " + checkpoint_dir + "; starting fresh"
                       : "--resume auto: resuming from " + dir);
    return dir;
  }
  DF_CHECK_HINT(fs::is_directory(resume, ec), BadInput, "--resume " << resume << ": no such directory",
                "give a checkpoint directory, one of its step-XXXXXXXX directories, or auto");
  const bool is_step_dir = parse_step_name(fs::path(resume).lexically_normal().filename().string()) >= 0 ||
                           fs::exists(fs::path(resume) / kManifest, ec);
  std::string dir = resume;
  if (!is_step_dir) {
    dir = find_latest_checkpoint(resume);
    DF_CHECK_HINT(!dir.empty(), BadInput, "--resume " << resume << ": no complete checkpoint in it",
                  "use --resume auto to start fresh when there is none");
  }
  std::string why;
  DF_CHECK_HINT(checkpoint_is_complete(dir, &why), BadInput,
                "--resume " << dir << " is not a complete checkpoint: " << why, kCorruptHint);
  if (is_first_rank()) note("resuming from " + dir);
  return dir;
}

// ---- load ---------------------------------------------------------------------------------------

CheckpointState read_checkpoint_state(const std::string& step_dir) {
  const std::string manifest = (fs::path(step_dir) / kManifest).string();
  nlohmann::json m;
  std::string why;
  DF_CHECK_HINT(read_manifest(step_dir, &m, &why), BadInput, "not a complete checkpoint: " << step_dir << ": " << why,
                kCorruptHint);
  CheckpointState st;
  st.step = field<int64_t>(m, "step", manifest);
  st.run_id = m.contains("run_id") ? field<std::string>(m, "run_id", manifest) : "";
  DF_CHECK_HINT(st.step >= 0, BadInput, manifest << ": negative step " << st.step, kCorruptHint);
  st.schedule = field<nlohmann::json>(m, "schedule", manifest);
  st.data = data_points_from_json(field<nlohmann::json>(m, "data", manifest), manifest);
  st.options = field<OptionMap>(m, "options", manifest);
  DF_CHECK_HINT(field<std::string>(m, "options_hash", manifest) == options_hash(st.options), BadInput,
                manifest << ": the options do not match their recorded hash", kCorruptHint);
  const size_t num_rng = field<size_t>(m, "num_rng_states", manifest);
  const auto hashes = field<nlohmann::json>(m, "content_hashes", manifest);

  SafetensorsFile f((fs::path(step_dir) / field<std::string>(m, "state_file", manifest)).string(), LinkPolicy::Refuse);
  for (size_t r = 0; r < num_rng; ++r) {
    const TensorInfo& t = state_tensor(f, rng_tensor_name(r), DType::U8);
    check_hash(hashes, t.name, t.data, t.nbytes, step_dir);
    st.rng_states.emplace_back(static_cast<const char*>(t.data), t.nbytes);
  }
  if (m.contains("consumed")) {  // checkpoints of builds before resplits have none
    for (const auto& e : field<nlohmann::json>(m, "consumed", manifest)) {
      const int64_t epoch = field<int64_t>(e, "epoch", manifest);
      const size_t records = field<size_t>(e, "records", manifest);
      DF_CHECK_HINT(epoch >= 0 && !st.consumed.count(epoch), BadInput, manifest << ": bad 'consumed' entry " << e.dump(), kCorruptHint);
      const TensorInfo& t = state_tensor(f, consumed_tensor_name(epoch), DType::U8);
      check_hash(hashes, t.name, t.data, t.nbytes, step_dir);
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      st.consumed[epoch] = RecordSet::from_bytes(records, std::vector<uint8_t>(p, p + t.nbytes));
    }
  }
  return st;
}

void load_checkpoint_tensors(const std::string& step_dir, const CheckpointTensors& into) {
  const std::string manifest = (fs::path(step_dir) / kManifest).string();
  nlohmann::json m;
  std::string why;
  DF_CHECK_HINT(read_manifest(step_dir, &m, &why), BadInput, "not a complete checkpoint: " << step_dir << ": " << why,
                kCorruptHint);
  const auto hashes = field<nlohmann::json>(m, "content_hashes", manifest);
  const size_t n = into.master.numel();
  SafetensorsFile f((fs::path(step_dir) / field<std::string>(m, "state_file", manifest)).string(), LinkPolicy::Refuse);
  const std::pair<const char*, const Tensor*> parts[] = {
      {kMaster, &into.master}, {kAdamM, &into.adam_m}, {kAdamV, &into.adam_v}};
  for (const auto& [name, dst] : parts) {
    DF_CHECK(dst->dtype == DType::F32 && dst->device == Device::CPU && dst->numel() == n && dst->data, Internal,
             "load_checkpoint_tensors: destinations must be CPU fp32 views of one length");
    const TensorInfo& t = state_tensor(f, name, DType::F32);
    DF_CHECK_HINT(t.numel() == n, BadInput,
                  "checkpoint " << step_dir << " holds " << t.numel() << " drafter parameters (" << name
                                << "), this drafter has " << n,
                  "the drafter's shape changed since the checkpoint (layers, widths, target): resume with the "
                  "original --target/--drafter/--draft-layers or start a new run");
    std::memcpy(dst->data, t.data, t.nbytes);  // the mapping may be unaligned for float: copy bytes
    check_hash(hashes, name, dst->data, t.nbytes, step_dir);
  }
}

}  // namespace dflash
