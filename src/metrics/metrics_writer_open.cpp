// Opening metrics.h5: the constructor of MetricsWriter lays out the file's groups and series (a new file),
// brings a resumed file of an earlier format up to this one, and keeps a previous run's file aside.
// Layout: include/dflash/metrics.h, docs/metrics.md; the members of Impl it calls: metrics_writer_impl.h.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "data/h5_util.h"
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/metrics.h"
#include "dflash/safe_file.h"
#include "disk_reserve.h"
#include "metrics_writer_impl.h"

namespace dflash {

using h5::Handle;
using metrics_detail::Elem;
using metrics_detail::SeriesNote;
using metrics_detail::SeriesSpec;

// 1: the first layout; 2: dimension scales, /ranks/role an enum, /steps/epoch and /steps/acc_by_pos,
// /options. A resume of a format-1 file adds what 2 has (NaN over the rows written before).
constexpr int kMetricsFormatVersion = 2;

namespace {

// Column order of each group (one 1-D dataset per entry).
// Format 1's /steps (a resumed format-1 file has them; epoch and acc_by_pos are added to it).
const SeriesSpec kStepSeries[] = {{"step", Elem::I64},   {"time_s", Elem::F64}, {"loss", Elem::F64},
                                  {"acc", Elem::F64},    {"agree", Elem::F64},  {"streak", Elem::F64},
                                  {"lr", Elem::F64},     {"noise", Elem::F64},  {"grad_norm", Elem::F64},
                                  {"tokens", Elem::I64}, {"anchors", Elem::I64}};
const SeriesSpec kRankSeries[] = {{"interval", Elem::I64},  {"time_s", Elem::F64},        {"rank", Elem::I64},
                                  {"role", Elem::Role},     {"batches", Elem::I64},       {"busy_s", Elem::F64},
                                  {"wait_s", Elem::F64},    {"compute_s", Elem::F64},     {"credit_wait_s", Elem::F64},
                                  {"data_wait_s", Elem::F64}, {"allreduce_s", Elem::F64}, {"optimizer_s", Elem::F64}};

const SeriesSpec kSegmentSeries[] = {{"first_step", Elem::I64},        {"kind", Elem::I64},
                                     {"nodes", Elem::I64},             {"targets_per_node", Elem::I64},
                                     {"drafters_per_node", Elem::I64}, {"world_size", Elem::I64},
                                     {"grad_accum", Elem::I64},        {"unix_time_s", Elem::F64}};

// Columns of a 2-D series in the file (-1 when it is not there).
int64_t columns_of(hid_t file, const std::string& name) {
  if (!h5::link_exists(file, name)) return -1;
  Handle ds(DF_H5(H5Dopen2(file, name.c_str(), H5P_DEFAULT), "opening " + name), Handle::Kind::Dataset);
  const std::vector<hsize_t> d = h5::dims(ds);
  return d.size() == 2 ? static_cast<int64_t>(d[1]) : -1;
}

// Whether the file's per-target/drafter/GPU series have other widths than this job's.
bool split_series_differ(hid_t file, const MetricsLayout& layout) {
  if (columns_of(file, "queues/q_pre") != layout.num_targets) return true;
  if (columns_of(file, "queues/q_hs") != layout.num_drafters) return true;
  const int64_t gpu_cols = columns_of(file, "gpus/power_w");
  return gpu_cols >= 0 && layout.gpu_available && gpu_cols != layout.num_gpus;
}

// /queues and /gpus -> /segments/K/ (K: the first segment of the split they hold: the last /segments row
// that is not a resume on the same split; "earlier" in a file of a build before segments).
void move_split_series(hid_t file, const std::string& path) {
  int64_t k = -1;  // -1: a file of a build before segments, whose rows are not in /segments
  if (h5::link_exists(file, "segments/kind")) {
    Handle ds(DF_H5(H5Dopen2(file, "segments/kind", H5P_DEFAULT), "opening segments/kind"), Handle::Kind::Dataset);
    const hsize_t rows = h5::dims(ds)[0];
    std::vector<int64_t> kinds(rows);
    if (rows > 0) DF_H5(H5Dread(ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, kinds.data()), "reading segments/kind");
    for (hsize_t i = rows; i-- > 0;)
      if (kinds[i] != static_cast<int64_t>(SegmentKind::Resume)) {
        k = static_cast<int64_t>(i);
        break;
      }
  }
  Handle lcpl(DF_H5(H5Pcreate(H5P_LINK_CREATE), "link properties"), Handle::Kind::PropList);
  DF_H5(H5Pset_create_intermediate_group(lcpl, 1), "link properties");
  for (const char* g : {"queues", "gpus"}) {
    if (!h5::link_exists(file, g)) continue;
    const std::string base = "segments/" + (k >= 0 ? std::to_string(k) : std::string("earlier"));
    std::string to = base + "/" + g;
    for (int n = 1; h5::link_exists(file, to); ++n) to = base + "." + std::to_string(n) + "/" + g;
    DF_H5(H5Lmove(file, g, file, to.c_str(), lcpl, H5P_DEFAULT), "moving /" + std::string(g) + " to /" + to + " in " + path);
  }
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// The existing metrics file, checked through a descriptor before any HDF5 call touches its name
// (include/dflash/safe_file.h's PinnedPath): a link, a hard link or a FIFO planted at the name (H5Fis_hdf5
// and H5Fopen would block on a FIFO for ever) is refused, naming the file.
PinnedPath pin_metrics_file(const std::string& path) {
  PinnedPath p = pin_existing_file(path);
  if (!p.fd.valid())
    DF_FAIL(BadInput, "metrics file " << path << " cannot be used: " << own_file_error(errno),
            "remove it (or move it away), or use a new --out directory");
  return p;
}

// Rows of /steps/step in an existing metrics file; -1 when it cannot be read as one (then it is kept:
// nobody knows what it holds). Called with hdf5_mutex() held; `path` as pin_metrics_file gives it.
int64_t stored_steps(const std::string& path) {
  if (H5Fis_hdf5(path.c_str()) <= 0) return -1;
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), Handle::Kind::File);
  if (!file.valid() || !h5::link_exists(file, "steps/step")) return -1;
  Handle ds(H5Dopen2(file, "steps/step", H5P_DEFAULT), Handle::Kind::Dataset);
  const std::vector<hsize_t> d = ds.valid() ? h5::dims(ds) : std::vector<hsize_t>{};
  return d.size() == 1 ? static_cast<int64_t>(d[0]) : -1;
}

// A new run in a directory that already has `path` (DIR/metrics.h5). A file that holds steps (or
// cannot be read) is renamed to DIR/metrics.N.h5, N one more than the highest already there, so every
// earlier run's file survives however many runs follow, in the order they ran. A file without any step
// (a start that failed before its first step) holds nothing worth keeping and is replaced.
void set_aside_previous(const std::string& path) {
  namespace fs = std::filesystem;
  if (!file_exists(path)) return;
  const int64_t steps = stored_steps(pin_metrics_file(path).path);
  if (steps == 0) {
    const int err = remove_tree_at(path);
    DF_CHECK_HINT(err == 0, SystemFailure,
                  "cannot remove the step-less " << path << " of a failed start: " << std::strerror(err),
                  "check that the --out directory is writable");
    return;
  }
  const fs::path p(path);
  const std::string stem = p.stem().string(), ext = p.extension().string();  // "metrics", ".h5"
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  int64_t highest = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() <= stem.size() + 1 + ext.size() || name.compare(0, stem.size() + 1, stem + ".") != 0 ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
      continue;
    const std::string digits = name.substr(stem.size() + 1, name.size() - stem.size() - 1 - ext.size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    highest = std::max<int64_t>(highest, std::stoll(digits));
  }
  const std::string aside = (dir / (stem + "." + std::to_string(highest + 1) + ext)).string();
  // No other job writes here meanwhile (the run holds the --out lock), so nothing can appear at `aside`.
  // Renamed relative to --out's descriptor (include/dflash/safe_dir.h).
  const int err = file_exists(aside) ? EEXIST : rename_path(path, aside, RenameOver::Never);
  DF_CHECK_HINT(err == 0, SystemFailure,
                "cannot move the previous run's " << path << " (" << (steps < 0 ? std::string("unreadable") : std::to_string(steps) + " steps")
                                                  << ") to " << aside << ": " << std::strerror(err),
                "check that the --out directory is writable; the previous file is left as it was");
  std::fprintf(stderr, "[dflash] the previous run's %s (%s) is kept as %s\n", path.c_str(),
               steps < 0 ? "not readable as a metrics file" : (std::to_string(steps) + " steps").c_str(), aside.c_str());
}

// The notes (metrics_detail::SeriesNote) of the series every file has; /eval's are in metrics_writer.cpp.
const SeriesNote kSeriesNotes[] = {
    {"steps/step", "1", "optimizer step, absolute (continues across resumes)"},
    {"steps/time_s", "s", "when the step finished, seconds since this segment's job start (restarts at a resume)"},
    {"steps/loss", "1", "training loss of the step (nats; position-weighted, over all drafters)"},
    {"steps/acc", "1", "share of trained positions whose drafter argmax equals the label"},
    {"steps/agree", "1", "share of trained positions whose drafter argmax equals the target's argmax"},
    {"steps/streak", "tokens", "mean leading run of correct predictions per block (acceptance-length estimate)"},
    {"steps/lr", "1", "learning rate of the step (AdamW)"},
    {"steps/noise", "1", "std of the Gaussian noise added to the target features"},
    {"steps/grad_norm", "1", "global L2 norm of the gradients"},
    {"steps/tokens", "tokens", "tokens in the step's batches (all drafters)"},
    {"steps/anchors", "1", "anchors (blocks) trained on in the step (all drafters)"},
    {"steps/epoch", "1", "fractional epochs done after the step (mean over the targets' loaders, as the status line's epoch~)"},
    {"steps/acc_by_pos", "1", "[step, block_position] share of trained positions at each block position whose drafter argmax equals the label (mean over drafters)"},
    {"steps/block_position", "1", "position in the block: 1 = the token right after the anchor"},
    {"steps/loss_sel", "1", "DFlash2: the selector's CE over its training candidates (--selector-candidates), position-weighted over every trained position (0 for a label outside the strict top-K); loss = unary + selector_alpha * loss_sel"},
    {"steps/candidate_recall", "1", "DFlash2: share of trained positions whose label is among the drafter's unary top-K"},
    {"steps/selector_acc", "1", "DFlash2: share of trained positions where the selector, given the true predecessor, picks the label from the unary top-K"},
    {"steps/selector_alpha", "1", "DFlash2: the selector term's weight at the step: --selector-loss-alpha through --selector-warmup-ratio and --selector-ramp-ratio"},
    {"ranks/interval", "1", "report interval (every --log-every steps; restarts at 0 in a resumed segment)"},
    {"ranks/time_s", "s", "end of the interval, seconds since this segment's job start"},
    {"ranks/rank", "1", "world rank"},
    {"ranks/role", "1", "role of the rank (enum role_t: target 0, drafter 1, idle 2)"},
    {"ranks/batches", "batches", "batches the rank finished in the interval"},
    {"ranks/busy_s", "s", "time working in the interval (target: forward; drafter: forward+backward+optimizer)"},
    {"ranks/wait_s", "s", "time blocked in the interval (credit, data, sends, allreduce)"},
    {"ranks/compute_s", "s", "target: forward; drafter: forward+backward"},
    {"ranks/credit_wait_s", "s", "target: waiting for a drafter's credit (a free receive slot)"},
    {"ranks/data_wait_s", "s", "target: waiting for its loader; drafter: waiting for a batch"},
    {"ranks/allreduce_s", "s", "drafter: gradient allreduce"},
    {"ranks/optimizer_s", "s", "drafter: AdamW step"},
    {"ranks/eval_s", "s", "drafter: evaluating --eval-data and decoding the --eval-tau-every prompts (in neither busy_s nor wait_s; NaN: written before it was recorded)"},
    {"ranks/segment", "1", "the /segments row of the job that measured the interval (-1: written before segments were recorded)"},
    {"segments/first_step", "1", "the step the segment continued from (0: a fresh start; else the checkpoint's)"},
    {"segments/kind", "1", "0 start, 1 resume on the same split, 2 resume on another split, 3 live rebalance"},
    {"segments/nodes", "1", "nodes of the segment's job"},
    {"segments/targets_per_node", "1", "target ranks per node (the T of --topology T-D)"},
    {"segments/drafters_per_node", "1", "drafter ranks per node (the D of --topology T-D)"},
    {"segments/world_size", "1", "ranks of the segment's job"},
    {"segments/grad_accum", "1", "micro-batches per optimizer step (--grad-accum, resolved)"},
    {"segments/unix_time_s", "s", "wall clock (Unix time) at the segment's start"},
    {"queues/time_s", "s", "sample time, seconds since this segment's job start"},
    {"queues/q_pre", "batches", "[sample, target] batches ready in each target's prefetch queue (capacity --prefetch-depth)"},
    {"queues/q_hs", "batches", "[sample, drafter] receive slots holding an untrained batch (capacity --hs-queue-depth)"},
    {"gpus/time_s", "s", "sample time, seconds since this segment's job start"},
    {"gpus/power_w", "W", "[sample, gpu] board power; column g = world rank gpu_ranks[g] (root attribute)"},
    {"gpus/util_pct", "%", "[sample, gpu] GPU utilisation"},
    {"gpus/mem_used_mib", "MiB", "[sample, gpu] device memory used"},
};

// Writes (or rewrites: files of earlier versions get them on a resume) the notes of the open datasets.
void annotate_series(const std::map<std::string, Handle>& series) {
  for (const SeriesNote& n : kSeriesNotes) {
    const auto it = series.find(n.name);
    if (it == series.end()) continue;
    h5::write_attr_string(it->second, "units", n.units);
    h5::write_attr_string(it->second, "description", n.description);
  }
}

}  // namespace

MetricsWriter::MetricsWriter(const std::string& path, const MetricsLayout& layout, MetricsOpen mode)
    : path_(path), layout_(layout), impl_(std::make_unique<Impl>()) {
  DF_CHECK(layout.num_targets >= 0 && layout.num_drafters >= 0 && layout.num_gpus >= 0, Internal,
           "negative metrics layout for " << path);
  DF_CHECK(layout.block_size >= 2, Internal, "metrics layout for " << path << ": block size " << layout.block_size);
  DF_CHECK(layout.flush_every >= 1, BadOptions,
           "--metrics-flush-every must be at least 1 (got " << layout.flush_every << ")");
  h5::quiet_errors();
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  impl_->path = path;
  const bool append = mode == MetricsOpen::Append && file_exists(path);
  // The reserve first: a disk too full for it is reported before metrics.h5 is touched.
  const std::string reserve_path = impl_->dir() + "/." + std::filesystem::path(path).filename().string() + ".reserve";
  const int reserve_err = impl_->reserve.create(reserve_path, impl_->reserve_bytes(layout.flush_every));
  DF_CHECK_HINT(reserve_err == 0, SystemFailure,
                "cannot reserve " << (impl_->reserve_bytes(layout.flush_every) >> 10) << " KiB for " << path << " ("
                                  << reserve_path << "): " << std::strerror(reserve_err),
                io_failure_hint(reserve_err, impl_->dir()));
  Handle fapl(h5::fapl_no_locking(), Handle::Kind::PropList);
  if (append) {
    // HDF5 is handed the very file checked (a hard link written through on resume would change a file
    // elsewhere; a FIFO would block H5Fis_hdf5).
    const PinnedPath pinned = pin_metrics_file(path);
    DF_CHECK_HINT(H5Fis_hdf5(pinned.path.c_str()) > 0, BadInput, "metrics file " << path << " is not an HDF5 file",
                  "move it away or use a new --out directory");
    impl_->file = Handle(H5Fopen(pinned.path.c_str(), H5F_ACC_RDWR, fapl), Handle::Kind::File);
    DF_CHECK_HINT(impl_->file.valid(), BadInput, "cannot open metrics file " << path << " for appending",
                  "move it away or use a new --out directory");
  } else {
    set_aside_previous(path);
    // Created O_EXCL (never through a link at the name) in the directory reached through --out's descriptor.
    const PinnedPath pinned = pin_new_file(path);
    impl_->file = Handle(H5Fcreate(pinned.path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl), Handle::Kind::File);
    if (!impl_->file.valid()) {
      const int err = hdf5_failure_errno();
      fatal(ExitCode::SystemFailure, "cannot create " + path + (err ? std::string(": ") + std::strerror(err) : ""),
            io_failure_hint(err, impl_->dir()));
    }
  }
  // A resumed file of an earlier format is brought up to this one (what it lacks is added).
  h5::write_attr_int64(impl_->file, "format_version", kMetricsFormatVersion);
  const bool create = !append;
  impl_->group("steps", create);
  for (const SeriesSpec& s : kStepSeries) impl_->open_series(std::string("steps/") + s.name, s.elem, 0, create);
  {
    // Added in format 2: NaN over the rows of a resumed format-1 file.
    const hsize_t rows = h5::dims(impl_->series.at("steps/step"))[0];
    impl_->open_series("steps/epoch", Elem::F64, 0, true, rows);
    impl_->block_positions(layout.block_size);  // first: another block size is named as such
    impl_->open_series("steps/acc_by_pos", Elem::F64, layout.block_size - 1, true, rows);
    if (layout.selector_metrics)  // DFlash2 (issue 29): NaN over rows of a file that had none
      for (const char* n : {"steps/loss_sel", "steps/candidate_recall", "steps/selector_acc", "steps/selector_alpha"})
        impl_->open_series(n, Elem::F64, 0, true, rows);
  }
  {
    Handle ranks = impl_->group("ranks", create);
    if (create) h5::write_attr_string(ranks, "role_legend", "0=target 1=drafter 2=idle");
    impl_->open_role_type(ranks);
    for (const SeriesSpec& s : kRankSeries) impl_->open_series(std::string("ranks/") + s.name, s.elem, 0, create);
  }
  {
    // A resumed file of an earlier format lacks the segment table and /ranks/segment (-1 over its rows).
    const hsize_t rank_rows = h5::dims(impl_->series.at("ranks/interval"))[0];
    impl_->open_series("ranks/segment", Elem::I64, 0, true, rank_rows, /*int_fill=*/-1);
    // Added after format 2 without a new version (a reader takes it as absent or NaN = not recorded):
    // NaN over the rows of a resumed file that had none.
    impl_->open_series("ranks/eval_s", Elem::F64, 0, true, rank_rows);
    impl_->group("segments", true);
    for (const SeriesSpec& s : kSegmentSeries) impl_->open_series(std::string("segments/") + s.name, s.elem, 0, true);
  }
  // Another split than the file's (a resume on another topology): the earlier split's per-column series
  // move to /segments/K/ and this one's start anew.
  const bool new_split = !create && split_series_differ(impl_->file, layout);
  if (new_split) move_split_series(impl_->file, path);
  const bool fresh = create || new_split;
  impl_->group("queues", fresh);
  impl_->open_series("queues/time_s", Elem::F64, 0, fresh);
  impl_->open_series("queues/q_pre", Elem::I32, layout.num_targets, fresh);
  impl_->open_series("queues/q_hs", Elem::I32, layout.num_drafters, fresh);
  {
    Handle gpus = impl_->group("gpus", fresh);
    if (fresh) {
      h5::write_attr_int64(gpus, "available", layout.gpu_available ? 1 : 0);
      h5::write_attr_string(gpus, "reason", layout.gpu_available ? "" : layout.gpu_unavailable_reason);
    }
    if (fresh ? layout.gpu_available : h5::link_exists(impl_->file, "gpus/time_s")) {
      impl_->open_series("gpus/time_s", Elem::F64, 0, fresh);
      impl_->open_series("gpus/power_w", Elem::F64, layout.num_gpus, fresh);
      impl_->open_series("gpus/util_pct", Elem::F64, layout.num_gpus, fresh);
      impl_->open_series("gpus/mem_used_mib", Elem::F64, layout.num_gpus, fresh);
    }
  }
  impl_->name_all_axes(layout_);
  annotate_series(impl_->series);
  annotate_series(impl_->dims);
  // The whole structure is on disk before the first row: a later failure cannot make the file unreadable.
  impl_->flush_or_stop("writing its structure");
}

}  // namespace dflash
