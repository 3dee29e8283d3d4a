// See remembered_split.h.
#include "remembered_split.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>

#include "dflash/checkpoint.h"   // find_latest_checkpoint
#include "dflash/error.h"
#include "dflash/mpi_typed.h"
#include "dflash/safe_dir.h"
#include "dflash/safe_file.h"
#include "dflash/safetensors.h"  // write_file_atomic
#include "run_resume.h"          // checkpoint_dir_of

namespace dflash {

namespace {

constexpr const char* kFile = "next-topology";
constexpr size_t kMostBytes = 256;  // one line T-D or colocated; more is not a split

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// What is shown of the file: [0-9A-Za-z_. -] only, as jobs/next-topology.sh shows it (no terminal escape,
// no quote into the log; anything else is '?', a newline a space), at most 60 characters.
std::string shown(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (out.size() >= 60) break;
    const bool allowed = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == ' ' || c == '-';
    out += allowed && static_cast<unsigned char>(c) < 128 ? c : c == '\n' ? ' ' : '?';
  }
  return trim(out);
}

bool is_split(const std::string& s) {
  const size_t dash = s.find('-');
  auto digits = [](const std::string& d) {
    return !d.empty() && d.size() <= 6 && d.find_first_not_of("0123456789") == std::string::npos;
  };
  return dash != std::string::npos && digits(s.substr(0, dash)) && digits(s.substr(dash + 1));
}

}  // namespace

RememberedSplit read_remembered_split(const std::string& out_dir) {
  RememberedSplit r;
  const std::string path = out_dir + "/" + kFile;
  struct stat lst;
  if (stat_own_entry(path, &lst) == ENOENT) return r;  // no file
  r.kind = RememberedSplit::Kind::Malformed;
  // Through --out's descriptor, a regular file of one link only (include/dflash/safe_file.h): a link or hard
  // link planted at the name would print someone else's file into the log, a FIFO block the read. As
  // jobs/next-topology.sh refuses them.
  std::string text;
  const int err = read_own_text(path, kMostBytes, HardLinks::Refuse, &text);
  if (err == EFBIG) {
    r.text = "(over " + std::to_string(kMostBytes) + " bytes)";
    return r;
  }
  if (err != 0) {
    r.text = "(unread: " + own_file_error(err) + ")";
    return r;
  }
  std::string line;
  int lines = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t nl = text.find('\n', start);
    const std::string l = trim(text.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
    if (!l.empty() && ++lines == 1) line = l;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  r.text = lines == 0 ? "nothing" : "\"" + shown(text) + "\"";
  if (lines != 1) return r;
  if (line == "auto") {
    r.kind = RememberedSplit::Kind::Auto;
  } else if (line == "colocated" || (is_split(line) && line[0] != '0' && line[line.find('-') + 1] != '0')) {
    r.kind = RememberedSplit::Kind::Split;
    r.split = parse_topology_spec(line);
  }
  r.text = line == "auto" || r.kind == RememberedSplit::Kind::Split ? line : r.text;
  return r;
}

void remember_split(const std::string& out_dir, const TopologySpec& split) {
  const std::string path = out_dir + "/" + kFile;
  write_file_atomic(path, split.to_string() + "\n");
  std::printf("[rebalance] %s now holds %s: a kill or requeue resumes on it, through the launch scripts or "
              "--resume; delete the file to go back to the command's --topology\n",
              path.c_str(), split.to_string().c_str());
  std::fflush(stdout);
}

TopologySpec split_at_start(const Options& o) {
  int rank = 0;
  DF_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  int32_t split[3] = {o.topology.targets_per_node, o.topology.drafters_per_node, o.topology.colocated() ? 1 : 0};
  // A resume: --resume auto that finds a checkpoint (found again, without printing, by resolve_resume later),
  // or a checkpoint named (checked there).
  // World rank 0 reads the run directory before the job holds it (src/runtime/job.cpp): an existing --out
  // (and --checkpoint-dir) is held by its descriptor now, nothing created, so these reads never follow a link
  // planted under it (include/dflash/safe_dir.h).
  if (rank == 0) {
    hold_run_dir(o.out_dir, "--out", MissingDirs::Refuse);
    if (!o.checkpoint_dir.empty()) hold_run_dir(o.checkpoint_dir, "--checkpoint-dir", MissingDirs::Refuse);
  }
  const bool resuming =
      rank == 0 && (o.resume == "auto" ? !find_latest_checkpoint(checkpoint_dir_of(o)).empty() : !o.resume.empty());
  if (rank == 0 && resuming) {
    const RememberedSplit r = read_remembered_split(o.out_dir);
    const std::string path = o.out_dir + "/" + kFile;
    const std::string command = o.topology.to_string();
    DF_CHECK_HINT(r.kind != RememberedSplit::Kind::Malformed, BadOptions,
                  path << " holds " << r.text << ": it should hold one line T-D (e.g. 6-2), colocated or auto",
                  "fix it, or delete it to use the --topology of the command");
    if (r.kind == RememberedSplit::Kind::Split && r.split.to_string() != command) {
      std::printf("[dflash] split: %s from %s, the run's remembered split (--rebalance auto or the operator wrote it): "
                  "at a resume it wins over the command's --topology %s; delete the file to train on the command's\n",
                  r.text.c_str(), path.c_str(), command.c_str());
      split[0] = r.split.targets_per_node;
      split[1] = r.split.drafters_per_node;
      split[2] = r.split.colocated() ? 1 : 0;
    } else if (r.kind == RememberedSplit::Kind::Split) {
      std::printf("[dflash] split: %s, as %s remembers it\n", command.c_str(), path.c_str());
    } else if (r.kind == RememberedSplit::Kind::Auto) {
      std::printf("[dflash] split: %s holds auto, which the launch scripts start as --topology auto; this start "
                  "keeps the command's --topology %s\n", path.c_str(), command.c_str());
    }
    std::fflush(stdout);
  }
  MPI_Request req = mpi::ibcast(split, 3, 0, MPI_COMM_WORLD);
  mpi::wait(req, 10 * o.peer_timeout_s, [] { return std::string("world rank 0 did not say which split this start trains on (lost?)"); });
  return split[2] ? colocated_spec() : TopologySpec{split[0], split[1]};
}

}  // namespace dflash
