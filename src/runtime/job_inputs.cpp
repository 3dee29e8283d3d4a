// Before a job writes anything: every input checked (job.h validate_inputs), and the run's directories
// locked against a second job (lock_run_dirs).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <sstream>
#include <vector>

#include "dflash/checkpoint.h"
#include "dflash/error.h"
#include "dflash/safe_file.h"
#include "dflash/hf_config.h"
#include "dflash/metrics.h"  // metrics_reserve_bytes
#include "drafter_tau.h"
#include "job.h"
#include "report_sidecar.h"  // check_report_to
#include "run_resume.h"

namespace dflash {

void check_record_lengths(const Options& o, const std::string& path, const std::function<int64_t(size_t)>& length,
                          size_t records) {
  size_t longest = 0, fitting = 0;
  for (size_t r = 0; r < records; ++r) {
    if (length(r) > length(longest)) longest = r;
    if (length(r) <= o.token_budget) ++fitting;
  }
  const int64_t len = records ? length(longest) : 0;
  DF_CHECK_HINT(o.long_record != LongRecordPolicy::Error || len <= o.token_budget, BadOptions,
                "--token-budget " << o.token_budget << " is smaller than record " << longest << " of " << path
                                  << " (" << len << " tokens), and --long-record is error",
                "raise --token-budget to at least " + std::to_string(len) + ", or pass --long-record cut (keep the first " +
                    std::to_string(o.token_budget) + " tokens) or --long-record skip (drop such records)");
  DF_CHECK_HINT(o.long_record != LongRecordPolicy::Skip || fitting > 0, BadOptions,
                "--long-record skip drops every record of " << path << ": all are longer than --token-budget "
                                                        << o.token_budget,
                "raise --token-budget");
}

namespace {

// A record longer than --token-budget: refused (Error), cut or skipped; and skipping everything is refused.
void check_records_fit(const Options& o, const TokenDataset& ds) {
  check_record_lengths(o, ds.path(), [&](size_t r) { return ds.record_length(r); }, ds.num_records());
}

// A dataset whose loss mask allows no anchor (a position p with loss_mask[p] and loss_mask[p + 1]) would
// "train" a drafter on nothing: every loss 0, an export that learned nothing.
void check_trainable(const TokenDataset& ds) {
  DF_CHECK_HINT(ds.anchor_positions() > 0, BadInput,
                "dataset " << ds.path() << " has nothing to train on: " << ds.loss_tokens() << " of " << ds.num_tokens()
                           << " tokens have loss_mask 1, and no two consecutive ones in a record (an anchor needs "
                              "loss_mask[p] and loss_mask[p+1])",
                "mark the completions (the tokens the drafter should predict) with loss_mask 1 when converting "
                "(dflash-prep: \"loss_mask\" in the JSONL, or leave it out for all 1)");
}

}  // namespace

// --draft-layers against the target (a fresh drafter only: --drafter brings its own layers and ids; plan_job
// checked the other recipe options), and a note where its default layer ids repeat a layer.
void check_draft_layers(const Options& o, const ModelPlan& plan, bool print_note) {
  if (!o.drafter_dir.empty()) return;
  const int L = plan.target.text.num_hidden_layers;
  DF_CHECK_HINT(o.draft_layers <= L, BadOptions,
                "--draft-layers " << o.draft_layers << " is more than the target's " << L << " layers ("
                                  << o.target_dir << "/config.json num_hidden_layers)",
                "a drafter has fewer layers than its target (DFlash uses 5 on 28-64 layer targets): give "
                "--draft-layers in [1, " + std::to_string(L) + "]");
  if (!o.train.target_layer_ids.empty() || !print_note) return;  // chosen with --target-layers
  const std::vector<int>& ids = plan.capture_layers;
  bool repeats = false;
  for (size_t i = 1; i < ids.size(); ++i) repeats = repeats || ids[i] == ids[i - 1];
  if (!repeats) return;
  std::string list;
  for (int id : ids) list += (list.empty() ? "" : ", ") + std::to_string(id);
  std::printf("[dflash] note: --draft-layers %d on a %d-layer target: the drafter reads target layers [%s]; the "
              "default ids round(1 + i*(L-4)/(n-1)) repeat a layer when n > L-3 (a drafter of a real target has "
              "fewer layers than that)\n",
              o.draft_layers, L, list.c_str());
  std::fflush(stdout);
}

namespace {

// --token-budget against this rank's memory: the hidden-state buffers alone — a drafter's
// --hs-queue-depth receive slots, a target's two send buffers, each [T, H] per captured layer (+ the final
// norm for --loss kl) in the wire dtype — are a lower bound of what the rank allocates. A budget whose
// buffers do not fit even that is an option out of range (exit 2), not an out-of-memory failure (exit 8)
// after the models loaded. Memory: the node's RAM shared by its ranks (CPU backend), the GPU's (CUDA,
// when NVML read it at startup).
void check_token_budget_fits(const Options& o, const Topology& topo, const std::vector<RankCard>& cards,
                             const ModelPlan& plan) {
  DF_CHECK_HINT(o.token_budget <= INT32_MAX, BadOptions,
                "bad value " << o.token_budget << " for --token-budget: out of range (packed batches index tokens "
                             << "with 32-bit offsets)",
                "give --token-budget in [2, 2147483647]; 32768 is the DFlash recipe's");
  if (!topo.runs_target() && !topo.runs_drafter()) return;
  // A drafter's slots, a target's send buffers; a colocated rank holds both. With --hs-dtype fp8 each role
  // also holds one batch in the backend's dtype (its staging, dflash/hs_wire.h).
  const SlotShape& sh = plan.slot_shape;
  const int buffers = (topo.runs_drafter() ? o.hs_queue_depth : 0) + (topo.runs_target() ? kTargetSendBuffers : 0);
  const int stagings = sh.wire == HsDType::Fp8 ? (topo.runs_drafter() ? 1 : 0) + (topo.runs_target() ? 1 : 0) : 0;
  const double per_token = sh.wire_bytes_per_token() * buffers + static_cast<double>(sh.value_bytes(1)) * stagings;
  const double need = per_token * static_cast<double>(o.token_budget);
  double have = 0;
  std::string what;
  if (o.backend == Device::CUDA) {
    const GpuReading& g = cards[topo.world_rank].startup_gpu;
    if (!g.valid || g.mem_total_mib <= 0) return;  // unknown: the allocation will say
    have = g.mem_total_mib * 1048576.0;
    what = "its GPU's " + std::to_string(static_cast<int64_t>(g.mem_total_mib / 1024)) + " GiB";
  } else {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || page <= 0) return;
    have = static_cast<double>(pages) * static_cast<double>(page) / std::max(1, topo.ranks_per_node);
    what = "its share of the node's RAM (" + std::to_string(static_cast<int64_t>(have / 1073741824.0)) + " GiB of " +
           std::to_string(static_cast<int64_t>(static_cast<double>(pages) * page / 1073741824.0)) + " GiB over " +
           std::to_string(topo.ranks_per_node) + " ranks)";
  }
  if (need <= have) return;
  const int64_t fit = static_cast<int64_t>(have / per_token);
  char need_gib[32];
  std::snprintf(need_gib, sizeof(need_gib), "%.1f", need / 1073741824.0);
  DF_FAIL(BadOptions,
          "--token-budget " << o.token_budget << " is out of range for this machine: a " << role_name(topo.role)
                            << " rank's " << buffers << " hidden-state buffers alone need " << need_gib
                            << " GiB, more than " << what,
          "give --token-budget below " + std::to_string(fit) +
              (topo.runs_drafter() ? " (or a smaller --hs-queue-depth)" : std::string()) +
              "; the DFlash recipe uses 32768");
}

// The pid, host and start time a lock file's holder wrote into it ("" when it wrote nothing readable): read
// from the descriptor the lock was tried on, never the name again (a link swapped in meanwhile would print a
// line of another file into the error).
std::string read_holder(int fd) {
  char buf[256];
  const ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  const std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  return text.substr(0, text.find('\n'));
}

// Takes an exclusive flock on DIR/.dflash.lock for the rest of the process's life (the kernel releases it
// when the process ends, however it ends: no stale lock after a crash or kill -9). Returns false, with the
// holder's line, when another process holds it.
bool lock_dir(const std::string& dir, const std::string& what, std::string* holder) {
  create_dirs(dir, "give a writable " + what);  // through --out's descriptor when inside it (hold_run_dirs)
  const std::string path = dir + "/.dflash.lock";
  // Not unlinked and re-created as the reserve is: another job may hold a lock on this very inode. A link
  // planted at the name is refused (exit 2) instead of written through.
  const int fd = open_own_file(path, O_RDWR | O_CREAT);
  if (fd < 0 && (errno == ELOOP || errno == EINVAL || errno == EMLINK || errno == ENOTDIR || errno == EISDIR))
    DF_FAIL(BadOptions, "the lock file " << path << " cannot be used: " << own_file_error(errno),
            "remove " + path + " (the job makes its own lock file there; no job holds a lock through a link)");
  DF_CHECK_HINT(fd >= 0, SystemFailure, "cannot open the lock file " << path << ": " << std::strerror(errno),
                "give a writable " + what);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) *holder = read_holder(fd);
    ::close(fd);
    // A filesystem without locks (NFS mounted nolock, some FUSE): the job runs, unguarded, and says so.
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS) {
      std::printf("[dflash] warning: %s cannot be locked (%s): a second job on this %s would not be refused\n",
                  path.c_str(), std::strerror(err), what.c_str());
      std::fflush(stdout);
      return true;
    }
    DF_CHECK_HINT(err == EWOULDBLOCK, SystemFailure, "cannot lock " << path << ": " << std::strerror(err),
                  "check the permissions of " + what);
    return false;
  }
  // Ours now: say who holds it, for the error of a job that finds it taken. The fd stays open (and
  // locked) until the process exits.
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  char when[32];
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::ostringstream line;
  line << "pid " << ::getpid() << " on host " << host << ", since " << when << "\n";
  const std::string text = line.str();
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size()))
    std::fprintf(stderr, "[dflash] warning: could not write the holder into %s: %s\n", path.c_str(), std::strerror(errno));
  return true;
}

// Free bytes for an unprivileged writer on the filesystem of `dir`, and its device (to tell whether two
// directories share one). False when statvfs fails.
bool free_space(const std::string& dir, double* bytes, uint64_t* device) {
  struct statvfs vfs;
  struct stat st;
  if (::statvfs(dir.c_str(), &vfs) != 0 || ::stat(dir.c_str(), &st) != 0) return false;
  *bytes = static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize);
  *device = static_cast<uint64_t>(st.st_dev);
  return true;
}

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), bytes < 1073741824.0 ? "%.1f MiB" : "%.2f GiB",
                bytes < 1073741824.0 ? bytes / 1048576.0 : bytes / 1073741824.0);
  return buf;
}

}  // namespace

DiskNeed disk_need(size_t drafter_params, const Options& o) {
  const double p = static_cast<double>(drafter_params);
  const double export_bytes = p * (o.export_dtype == DType::BF16 ? 2.0 : 4.0);
  DiskNeed n;
  n.export_bytes = export_bytes + 65536;  // + config.json and the safetensors header
  // fp32 master weights and both AdamW moments, the RNG states and manifest, the optional export.
  n.checkpoint_bytes = 3.0 * p * 4.0 + 65536 + (o.export_checkpoints ? n.export_bytes : 0.0);
  n.best_bytes = o.eval_data.empty() ? 0.0 : 2.0 * n.export_bytes;
  // The metrics writer allocates its reserve at open, after the models loaded: a disk without room for it
  // failed there, late, instead of here.
  n.metrics_reserve_bytes = static_cast<double>(metrics_reserve_bytes(o.metrics_flush_every, 0));
  // With periodic checkpoints, keep_last complete ones plus the one being written before the oldest goes.
  n.checkpoints_kept = parse_checkpoint_every(o.checkpoint_every).unit == CheckpointUnit::Off ? 1 : o.keep_checkpoints + 1;
  return n;
}

void check_disk_space(const Options& o, const DiskNeed& need) {
  const std::string ckpt = checkpoint_dir_of(o);
  double out_free = 0, ckpt_free = 0;
  uint64_t out_dev = 0, ckpt_dev = 1;
  if (!free_space(o.out_dir, &out_free, &out_dev)) return;  // unknown: nothing to say
  std::error_code ec;
  // The checkpoint directory may not exist yet (OUT/checkpoints before the first save): its parent's
  // filesystem is the one it will be made on.
  std::string probe = ckpt;
  while (!std::filesystem::exists(probe, ec) && std::filesystem::path(probe).has_parent_path())
    probe = std::filesystem::path(probe).parent_path().string();
  if (!free_space(probe, &ckpt_free, &ckpt_dev)) return;
  const bool shared = out_dev == ckpt_dev;
  // At least: the final export, and one checkpoint (a stop signal always writes one).
  const double out_min =
      need.export_bytes + need.best_bytes + need.metrics_reserve_bytes + (shared ? need.checkpoint_bytes : 0.0);
  const double ckpt_min = need.checkpoint_bytes + (shared ? need.export_bytes : 0.0);
  const std::string where = shared ? "--out " + o.out_dir + " (checkpoints in " + ckpt + " on the same filesystem)"
                                   : "--out " + o.out_dir;
  DF_CHECK_HINT(out_free >= out_min, SystemFailure,
                "not enough free space on " << where << ": " << mib(out_free) << " free, the final drafter export needs "
                                            << mib(need.export_bytes)
                                            << (need.best_bytes > 0 ? ", OUT/drafter-best (two while one replaces the other) " + mib(need.best_bytes) : std::string())
                                            << ", the metrics reserve (--metrics-flush-every " << o.metrics_flush_every
                                            << ") " << mib(need.metrics_reserve_bytes)
                                            << (shared ? " and one checkpoint " + mib(need.checkpoint_bytes) : std::string())
                                            << "; the run would train and then lose its weights when the disk is full",
                "free space there, or give --out (and --checkpoint-dir) on a filesystem with room");
  DF_CHECK_HINT(shared || ckpt_free >= ckpt_min, SystemFailure,
                "not enough free space on --checkpoint-dir " << ckpt << ": " << mib(ckpt_free) << " free, one checkpoint needs "
                                                             << mib(need.checkpoint_bytes),
                "free space there, or give --checkpoint-dir on a filesystem with room");
  const double all = need.checkpoint_bytes * need.checkpoints_kept + (shared ? need.export_bytes : 0.0);
  const double free_for_ckpt = shared ? out_free : ckpt_free;
  if (free_for_ckpt < all) {
    std::printf("[dflash] warning: %s free on the checkpoint filesystem (%s); --keep-checkpoints %d keeps up to %d "
                "checkpoints of %s each%s = %s: the disk may fill before the run ends (lower --keep-checkpoints, or "
                "free space)\n",
                mib(free_for_ckpt).c_str(), ckpt.c_str(), o.keep_checkpoints, need.checkpoints_kept,
                mib(need.checkpoint_bytes).c_str(), shared ? " plus the export" : "", mib(all).c_str());
    std::fflush(stdout);
  }
}

namespace {

// --eval-data on the ranks that use it (targets forward it, drafters keep its features): a valid dataset
// of the target's vocabulary, records that fit --token-budget (or the --long-record policy), something to
// evaluate, and the records of it whose features the drafters' hosts can hold (--eval-max-tokens). Packed
// here, once (include/dflash/eval_set.h).
void load_eval_data(const Options& o, const Topology& topo, const ModelPlan& plan, JobInputs& in) {
  const TokenDataset ds(o.eval_data, plan.target.text.vocab_size);  // fatal BadInput naming the file
  check_records_fit(o, ds);
  DF_CHECK_HINT(ds.anchor_positions() > 0, BadInput,
                "--eval-data " << ds.path() << " has nothing to evaluate: " << ds.loss_tokens() << " of " << ds.num_tokens()
                               << " tokens have loss_mask 1, and no two consecutive ones in a record",
                "mark the completions with loss_mask 1 (as in --data), or give another held-out file");
  // What a drafter's host keeps: its share's features (+ final norm for --loss kl) in the wire dtype. A file
  // larger than --eval-max-tokens is evaluated on a fixed sample of its records (every rank draws the same).
  const EvalBudget budget = plan.eval_budget(o);
  const int drafters = static_cast<int>(topo.drafters.size());
  std::vector<int64_t> lengths(ds.num_records());
  for (size_t r = 0; r < lengths.size(); ++r) lengths[r] = ds.record_length(r);
  EvalSelection chosen = select_eval_records(lengths, o.token_budget, plan.loader.long_record,
                                             resolve_eval_max_tokens(o.eval_max_tokens, budget, drafters), ds.path());
  auto eval = std::make_shared<EvalSet>(load_eval_set(ds, o.token_budget, plan.loader.long_record, std::move(chosen)));
  check_eval_share_fits(eval->batch_tokens(), drafters, budget, ds.path());
  in.eval = std::move(eval);
  // --eval-tau-every: the drafters decode the set's prompts (src/runtime/drafter_tau.h)
  if (o.eval_tau_every > 0 && topo.runs_drafter()) in.tau_prompts = load_tau_prompts(o, plan.drafter.block_size, ds);
}

}  // namespace

CheckedInputs validate_inputs(const Options& o, const Topology& topo, const std::vector<RankCard>& cards,
                              std::optional<ModelPlan> planned) {
  check_input_paths(o);
  CheckedInputs c{planned ? std::move(*planned) : plan_job(o), JobInputs{}};
  const ModelPlan& plan = c.model;
  check_draft_layers(o, plan, topo.world_rank == 0);
  if (topo.world_rank == 0) {  // the exporters --report-to needs, before hours of training (one rank asks)
    const std::string line = check_report_to(o);
    if (!line.empty()) std::printf("%s\n", line.c_str());
  }
  check_token_budget_fits(o, topo, cards, plan);
  if (!o.eval_data.empty() && topo.role != Role::Idle) load_eval_data(o, topo, plan, c.handles);
  if (!topo.runs_target()) return c;
  // Only the targets read the data; they keep it open for the loader. Every file of a mix is checked as a
  // whole (a record too long for the budget is refused even where the mix leaves it out: one rule per file).
  auto dataset = std::make_shared<DatasetMix>(o.data, o.train.seed, plan.target.text.vocab_size);
  for (size_t i = 0; i < dataset->num_files(); ++i) {
    check_records_fit(o, dataset->file(i));
    check_trainable(dataset->file(i));
  }
  if (dataset->is_mix() && topo.world_rank == topo.targets.front()) {
    std::printf("[dflash] data: %s\n", dataset->summary().c_str());
    std::fflush(stdout);
  }
  c.handles.dataset = std::move(dataset);
  return c;
}

// Leftovers of a write that was killed half-way (write_atomically's PATH.tmp.XXXXXX files next to the
// export, the best drafter's staging directories): nothing will ever rename them, so the job that holds
// --out's lock removes them before it writes. Only mkstemp's pattern is matched: ".tmp." and six characters.
static void remove_stale_temp_files(const Options& o) {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  auto is_temp_name = [](const std::string& name) {
    const size_t at = name.rfind(".tmp.");
    return at != std::string::npos && at > 0 && name.size() == at + 5 + 6;
  };
  // Listed through --out's descriptor (include/dflash/safe_file.h: a link at drafter/ lists nothing).
  std::vector<DirEntry> entries;
  for (const char* sub : {"drafter", "drafter-best"}) {
    const fs::path dir = fs::path(o.out_dir) / sub;
    if (list_own_dir(dir.string(), &entries) != 0) continue;
    for (const DirEntry& e : entries)
      if (e.type == S_IFREG && is_temp_name(e.name) && remove_tree_at((dir / e.name).string()) == 0)
        removed.push_back((dir / e.name).string());
  }
  // The best drafter's staging directories (.drafter-best.XXXXXX, src/runtime/drafter_best.cpp; the fixed
  // names of builds before them): removed through descriptors, a link among them unlinked, never followed.
  if (list_own_dir(o.out_dir, &entries) != 0) entries.clear();
  for (const DirEntry& e : entries) {
    const std::string& name = e.name;
    const bool staging = name.rfind(".drafter-best.", 0) == 0 && (name.size() == 14 + 6 || name == ".drafter-best.tmp" ||
                                                                  name == ".drafter-best.old");
    const std::string path = (fs::path(o.out_dir) / name).string();
    if (staging && remove_tree_at(path) == 0) removed.push_back(path);
  }
  if (removed.empty()) return;
  std::printf("[dflash] removed %zu stale temp file(s) of an interrupted write: %s%s\n", removed.size(),
              removed.front().c_str(), removed.size() > 1 ? ", ..." : "");
  std::fflush(stdout);
}

void hold_run_dirs(const Options& o) {
  hold_run_dir(o.out_dir, "--out");
  if (!o.checkpoint_dir.empty()) hold_run_dir(o.checkpoint_dir, "--checkpoint-dir");
}

void lock_run_dirs(const Options& o) {
  const std::string hint = "two jobs writing one --out mix their checkpoints and metrics: wait for the other job to "
                           "end, or give this one another --out (and --checkpoint-dir)";
  hold_run_dirs(o);  // made, and held by their descriptors from now on (include/dflash/safe_dir.h)
  std::string holder;
  DF_CHECK_HINT(lock_dir(o.out_dir, "--out", &holder), BadOptions,
                "--out " << o.out_dir << " is in use by another job (" << (holder.empty() ? "holder unknown" : holder)
                         << ")",
                hint);
  // The names the job writes under --out, refused before anything starts when something else sits there: a
  // link would carry the writes elsewhere, a hard link write into a file elsewhere, a FIFO block the open.
  // Each write also checks again when it happens, relative to --out's descriptor (include/dflash/safe_dir.h):
  // these only make the common case an early, plain refusal.
  for (const char* name : {"metrics.h5", "train.log", ".dflash-complete"})
    refuse_planted(o.out_dir + "/" + name, EntryKind::File, "--out's entry");
  for (const char* name : {"drafter", "drafter-best"})
    refuse_planted(o.out_dir + "/" + name, EntryKind::Directory, "--out's entry");
  if (!parse_report_to(o.report_to).empty()) {  // what dflash-report writes (tools/dflash_report/safe_out.py)
    refuse_planted(o.out_dir + "/report-to.log", EntryKind::File, "--out's entry");
    for (const char* name : {"csv", "tensorboard", "wandb"})
      refuse_planted(o.out_dir + "/" + name, EntryKind::Directory, "--out's entry");
  }
  if (o.checkpoint_dir.empty()) refuse_planted(o.out_dir + "/checkpoints", EntryKind::Directory, "--out's entry");
  remove_stale_temp_files(o);
  const std::string ckpt = checkpoint_dir_of(o);
  auto absolute = [](const std::string& p) {
    std::error_code ec;
    std::string s = std::filesystem::weakly_canonical(p, ec).lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  };
  const std::string out_abs = absolute(o.out_dir), ckpt_abs = absolute(ckpt);
  // The checkpoint directory has a lock of its own even inside --out: another job's --checkpoint-dir may
  // name this job's OUT/checkpoints, and the --out lock alone would not stop it.
  if (ckpt_abs == out_abs) return;  // the --out lock covers it
  // A --checkpoint-dir inside --out is reached through --out's descriptor; one elsewhere is held on its own.
  DF_CHECK_HINT(lock_dir(ckpt, "--checkpoint-dir", &holder), BadOptions,
                "--checkpoint-dir " << ckpt << " is in use by another job ("
                                    << (holder.empty() ? "holder unknown" : holder) << ")",
                hint);
}

}  // namespace dflash
