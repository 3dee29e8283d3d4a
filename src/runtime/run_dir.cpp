// See run_dir.h.
#include "run_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "dflash/error.h"
#include "dflash/safe_dir.h"
#include "dflash/safetensors.h"  // write_file_atomic

namespace dflash {
namespace {

constexpr const char* kCompleteFile = ".dflash-complete";

// The record's text, read only from a regular file at the name (--out may be shared: a link or a FIFO
// planted there must neither redirect the read nor block it); "" otherwise.
std::string read_record(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size < 4096) {
    text.resize(static_cast<size_t>(st.st_size));
    const ssize_t got = ::read(fd, text.data(), text.size());
    text.resize(got > 0 ? static_cast<size_t>(got) : 0);
  }
  ::close(fd);
  return text;
}

}  // namespace

void set_aside_previous_drafter(const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(out_dir) / "drafter";
  std::error_code ec;
  // lock_run_dirs refused a link at the name already; only a real directory with something in it is an export.
  if (!fs::is_directory(fs::symlink_status(dir, ec)) || fs::is_empty(dir, ec)) return;
  int64_t highest = 0;
  for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("drafter.", 0) != 0) continue;
    const std::string digits = name.substr(8);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    highest = std::max<int64_t>(highest, std::stoll(digits));
  }
  const fs::path aside = fs::path(out_dir) / ("drafter." + std::to_string(highest + 1));
  // No other job writes here meanwhile (rank 0 holds the --out lock), so nothing can appear at `aside`.
  // Renamed relative to --out's descriptor (include/dflash/safe_dir.h).
  const int err = fs::exists(fs::symlink_status(aside, ec)) ? EEXIST : rename_path(dir.string(), aside.string());
  DF_CHECK_HINT(err == 0,
                SystemFailure,
                "cannot move the previous run's exported drafter " << dir.string() << " to " << aside.string() << ": "
                                                                   << std::strerror(err),
                "check that the --out directory is writable; the previous drafter is left as it was");
  std::printf("[dflash] the previous run's %s is kept as %s (a fresh run exports its own)\n", dir.c_str(),
              aside.c_str());
  std::fflush(stdout);
}

void record_run_complete(const std::string& out_dir, const std::string& run_id, int64_t step) {
  const nlohmann::json j = {{"run_id", run_id}, {"step", step}, {"export", "drafter"}};
  write_file_atomic(out_dir + "/" + kCompleteFile, j.dump() + "\n");
}

RunState run_state_at(const std::string& out_dir, const std::string& run_id, int64_t step) {
  const std::string text = read_record(out_dir + "/" + kCompleteFile);
  if (text.empty() || run_id.empty()) return RunState::GoesOn;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string() || !j.contains("step") ||
      !j["step"].is_number_integer())
    return RunState::GoesOn;
  struct stat st;
  const bool exported = ::lstat((out_dir + "/drafter/model.safetensors").c_str(), &st) == 0 && S_ISREG(st.st_mode);
  const bool same = j["run_id"].get<std::string>() == run_id && j["step"].get<int64_t>() == step;
  return same && exported ? RunState::AlreadyComplete : RunState::GoesOn;
}

}  // namespace dflash
