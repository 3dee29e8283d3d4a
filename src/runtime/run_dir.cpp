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
#include "dflash/safe_file.h"
#include "dflash/safetensors.h"  // write_file_atomic

namespace dflash {
namespace {

constexpr const char* kCompleteFile = ".dflash-complete";

// The record's text, read only from a regular file of one link at the name, through --out's descriptor
// (--out may be shared: a link or a FIFO planted there must neither redirect the read nor block it;
// include/dflash/safe_file.h); "" otherwise.
std::string read_record(const std::string& path) {
  std::string text;
  return read_own_text(path, 4096, HardLinks::Refuse, &text) == 0 ? text : std::string();
}

}  // namespace

void set_aside_previous_drafter(const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(out_dir) / "drafter";
  // Listed through --out's descriptor (lock_run_dirs refused a link at the name already, and a link swapped
  // in since lists as nothing): only a real directory with something in it is an export.
  std::vector<DirEntry> inside, names;
  if (list_own_dir(dir.string(), &inside) != 0 || inside.empty()) return;
  int64_t highest = 0;
  if (list_own_dir(out_dir, &names) != 0) names.clear();
  for (const DirEntry& entry : names) {
    const std::string& name = entry.name;
    if (name.rfind("drafter.", 0) != 0) continue;
    const std::string digits = name.substr(8);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    highest = std::max<int64_t>(highest, std::stoll(digits));
  }
  const fs::path aside = fs::path(out_dir) / ("drafter." + std::to_string(highest + 1));
  // No other job writes here meanwhile (rank 0 holds the --out lock), so nothing can appear at `aside`.
  // Renamed relative to --out's descriptor (include/dflash/safe_dir.h).
  struct stat st;
  const int err = stat_own_entry(aside.string(), &st) == 0 ? EEXIST : rename_path(dir.string(), aside.string(), RenameOver::Never);
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
  struct stat st;  // through --out's descriptor: a link at drafter/ or at the file is no export
  const bool exported = stat_own_entry(out_dir + "/drafter/model.safetensors", &st) == 0 && S_ISREG(st.st_mode);
  const bool same = j["run_id"].get<std::string>() == run_id && j["step"].get<int64_t>() == step;
  return same && exported ? RunState::AlreadyComplete : RunState::GoesOn;
}

}  // namespace dflash
