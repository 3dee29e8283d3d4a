// metrics.h5 writer: extendible chunked series, flushed every N appends. Layout: include/dflash/metrics.h,
// docs/metrics.md. This file is the public API (rows, attributes, resume trimming, flush, close); the
// constructor (the file's schema) is in metrics_writer_open.cpp, Impl's members in metrics_writer_impl.cpp.
#include <cmath>
#include <cstring>
#include <mutex>

#include "data/h5_util.h"
#include "dflash/data.h"  // hdf5_mutex()
#include "dflash/error.h"
#include "dflash/metrics.h"
#include "metrics_writer_impl.h"

namespace dflash {

using h5::Handle;
using metrics_detail::Elem;
using metrics_detail::SeriesNote;
using metrics_detail::SeriesSpec;

const char* metrics_role_name(MetricsRole r) {
  switch (r) {
    case MetricsRole::Target: return "target";
    case MetricsRole::Drafter: return "drafter";
    case MetricsRole::Idle: return "idle";
  }
  return "unknown";
}

MetricsWriter::~MetricsWriter() { close(); }

void MetricsWriter::count_append() {
  if (++appends_since_flush_ >= layout_.flush_every) {
    impl_->flush_or_stop("flushing");
    appends_since_flush_ = 0;
  }
}

void MetricsWriter::append_step(const StepMetrics& s) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  impl_->append("steps/step", H5T_NATIVE_INT64, &s.step, 0);
  impl_->append("steps/time_s", H5T_NATIVE_DOUBLE, &s.time_s, 0);
  impl_->append("steps/loss", H5T_NATIVE_DOUBLE, &s.loss, 0);
  impl_->append("steps/acc", H5T_NATIVE_DOUBLE, &s.acc, 0);
  impl_->append("steps/agree", H5T_NATIVE_DOUBLE, &s.agree, 0);
  impl_->append("steps/streak", H5T_NATIVE_DOUBLE, &s.streak, 0);
  impl_->append("steps/lr", H5T_NATIVE_DOUBLE, &s.lr, 0);
  impl_->append("steps/noise", H5T_NATIVE_DOUBLE, &s.noise, 0);
  impl_->append("steps/grad_norm", H5T_NATIVE_DOUBLE, &s.grad_norm, 0);
  impl_->append("steps/tokens", H5T_NATIVE_INT64, &s.tokens, 0);
  impl_->append("steps/anchors", H5T_NATIVE_INT64, &s.anchors, 0);
  impl_->append("steps/epoch", H5T_NATIVE_DOUBLE, &s.epoch, 0);
  const int positions = layout_.block_size - 1;
  DF_CHECK(s.acc_by_pos.empty() || static_cast<int>(s.acc_by_pos.size()) == positions, Internal,
           "append_step: " << s.acc_by_pos.size() << " block positions for a layout of " << positions);
  const std::vector<double> acc = s.acc_by_pos.empty() ? std::vector<double>(positions, std::nan("")) : s.acc_by_pos;
  impl_->append("steps/acc_by_pos", H5T_NATIVE_DOUBLE, acc.data(), positions);
  if (layout_.selector_metrics) {
    impl_->append("steps/loss_sel", H5T_NATIVE_DOUBLE, &s.loss_sel, 0);
    impl_->append("steps/candidate_recall", H5T_NATIVE_DOUBLE, &s.candidate_recall, 0);
    impl_->append("steps/selector_acc", H5T_NATIVE_DOUBLE, &s.selector_acc, 0);
    impl_->append("steps/selector_alpha", H5T_NATIVE_DOUBLE, &s.selector_alpha, 0);
  }
  count_append();
}

int64_t MetricsWriter::begin_segment(const SegmentInfo& seg) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int64_t index = static_cast<int64_t>(h5::dims(impl_->series.at("segments/kind"))[0]);
  const int64_t kind = static_cast<int64_t>(seg.kind);
  impl_->append("segments/first_step", H5T_NATIVE_INT64, &seg.first_step, 0);
  impl_->append("segments/kind", H5T_NATIVE_INT64, &kind, 0);
  impl_->append("segments/nodes", H5T_NATIVE_INT64, &seg.nodes, 0);
  impl_->append("segments/targets_per_node", H5T_NATIVE_INT64, &seg.targets_per_node, 0);
  impl_->append("segments/drafters_per_node", H5T_NATIVE_INT64, &seg.drafters_per_node, 0);
  impl_->append("segments/world_size", H5T_NATIVE_INT64, &seg.world_size, 0);
  impl_->append("segments/grad_accum", H5T_NATIVE_INT64, &seg.grad_accum, 0);
  impl_->append("segments/unix_time_s", H5T_NATIVE_DOUBLE, &seg.unix_time_s, 0);
  count_append();
  return index;
}

void MetricsWriter::append_rank_timing(const RankTiming& r) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int64_t rank = r.rank, role = static_cast<int64_t>(r.role);
  const int8_t role8 = static_cast<int8_t>(r.role);
  impl_->append("ranks/interval", H5T_NATIVE_INT64, &r.interval, 0);
  impl_->append("ranks/segment", H5T_NATIVE_INT64, &r.segment, 0);
  impl_->append("ranks/time_s", H5T_NATIVE_DOUBLE, &r.time_s, 0);
  impl_->append("ranks/rank", H5T_NATIVE_INT64, &rank, 0);
  if (impl_->role_is_enum) impl_->append("ranks/role", impl_->role_mem, &role8, 0);
  else impl_->append("ranks/role", H5T_NATIVE_INT64, &role, 0);  // a resumed format-1 file
  impl_->append("ranks/batches", H5T_NATIVE_INT64, &r.batches, 0);
  impl_->append("ranks/busy_s", H5T_NATIVE_DOUBLE, &r.busy_s, 0);
  impl_->append("ranks/wait_s", H5T_NATIVE_DOUBLE, &r.wait_s, 0);
  impl_->append("ranks/compute_s", H5T_NATIVE_DOUBLE, &r.compute_s, 0);
  impl_->append("ranks/credit_wait_s", H5T_NATIVE_DOUBLE, &r.credit_wait_s, 0);
  impl_->append("ranks/data_wait_s", H5T_NATIVE_DOUBLE, &r.data_wait_s, 0);
  impl_->append("ranks/allreduce_s", H5T_NATIVE_DOUBLE, &r.allreduce_s, 0);
  impl_->append("ranks/optimizer_s", H5T_NATIVE_DOUBLE, &r.optimizer_s, 0);
  impl_->append("ranks/eval_s", H5T_NATIVE_DOUBLE, &r.eval_s, 0);
  count_append();
}

void MetricsWriter::append_queues(double time_s, const std::vector<int>& q_pre, const std::vector<int>& q_hs) {
  DF_CHECK(static_cast<int>(q_pre.size()) == layout_.num_targets && static_cast<int>(q_hs.size()) == layout_.num_drafters,
           Internal, "append_queues: " << q_pre.size() << " q_pre and " << q_hs.size() << " q_hs values for a layout of "
                                       << layout_.num_targets << " targets and " << layout_.num_drafters << " drafters");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  std::vector<int32_t> pre(q_pre.begin(), q_pre.end()), hs(q_hs.begin(), q_hs.end());
  impl_->append("queues/time_s", H5T_NATIVE_DOUBLE, &time_s, 0);
  impl_->append("queues/q_pre", H5T_NATIVE_INT32, pre.data(), layout_.num_targets);
  impl_->append("queues/q_hs", H5T_NATIVE_INT32, hs.data(), layout_.num_drafters);
  count_append();
}

void MetricsWriter::append_gpus(double time_s, const std::vector<double>& power_w, const std::vector<double>& util_pct,
                                const std::vector<double>& mem_used_mib) {
  const size_t g = static_cast<size_t>(layout_.num_gpus);
  DF_CHECK(layout_.gpu_available && impl_->series.count("gpus/time_s"), Internal,
           "append_gpus on a metrics file without GPU readings (" << path_ << ")");
  DF_CHECK(power_w.size() == g && util_pct.size() == g && mem_used_mib.size() == g, Internal,
           "append_gpus: expected " << g << " values per series");
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  impl_->append("gpus/time_s", H5T_NATIVE_DOUBLE, &time_s, 0);
  impl_->append("gpus/power_w", H5T_NATIVE_DOUBLE, power_w.data(), layout_.num_gpus);
  impl_->append("gpus/util_pct", H5T_NATIVE_DOUBLE, util_pct.data(), layout_.num_gpus);
  impl_->append("gpus/mem_used_mib", H5T_NATIVE_DOUBLE, mem_used_mib.data(), layout_.num_gpus);
  count_append();
}

namespace {
// The group for set_group_attribute (created when missing). Called with hdf5_mutex() held.
Handle attribute_group(hid_t file, const std::string& group, const std::string& path) {
  if (h5::link_exists(file, group))
    return Handle(DF_H5(H5Gopen2(file, group.c_str(), H5P_DEFAULT), "opening group " + group + " in " + path),
                  Handle::Kind::Group);
  return Handle(DF_H5(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      "creating group " + group + " in " + path),
                Handle::Kind::Group);
}
}  // namespace

void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_string(attribute_group(impl_->file, group, path_), name, value);
}
void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, double value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_double(attribute_group(impl_->file, group, path_), name, value);
}
void MetricsWriter::set_group_attribute(const std::string& group, const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_int64(attribute_group(impl_->file, group, path_), name, value);
}

void MetricsWriter::set_attribute(const std::string& name, const std::string& value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_string(impl_->file, name, value);
}
void MetricsWriter::set_attribute(const std::string& name, double value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_double(impl_->file, name, value);
}
void MetricsWriter::set_attribute(const std::string& name, int64_t value) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  h5::write_attr_int64(impl_->file, name, value);
}

int64_t MetricsWriter::num_steps() const {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  return static_cast<int64_t>(h5::dims(impl_->series.at("steps/step"))[0]);
}

void MetricsWriter::drop_steps_after(int64_t last_step) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  hid_t step_ds = impl_->series.at("steps/step");
  const hsize_t n = h5::dims(step_ds)[0];
  std::vector<int64_t> steps(n);
  if (n > 0) DF_H5(H5Dread(step_ds, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), "reading steps/step");
  // Rows are appended in step order; keep the prefix with step <= last_step.
  hsize_t keep = 0;
  while (keep < n && steps[keep] <= last_step) ++keep;
  if (keep == n) return;
  for (const auto& [name, ds] : impl_->series) {
    if (name.compare(0, 6, "steps/") != 0) continue;
    std::vector<hsize_t> d = h5::dims(ds);
    d[0] = keep;
    DF_H5(H5Dset_extent(ds, d.data()), "shrinking steps in " + path_);
  }
  impl_->flush_or_stop("flushing");
}

// ---- /eval (--eval-data): one row per evaluation of the held-out set ------------------------------
namespace {
const SeriesSpec kEvalSeries[] = {{"step", Elem::I64},   {"time_s", Elem::F64},  {"loss", Elem::F64},
                                  {"acc", Elem::F64},    {"streak", Elem::F64},  {"tokens", Elem::I64},
                                  {"anchors", Elem::I64}, {"seqs", Elem::I64},   {"seconds", Elem::F64},
                                  // --eval-tau-every (NaN / 0 in rows that did not measure tau)
                                  {"tau", Elem::F64},    {"tau_prompts", Elem::I64}, {"tau_new_tokens", Elem::I64},
                                  {"tau_steps", Elem::I64}, {"tau_seconds", Elem::F64}};
const SeriesNote kEvalNotes[] = {
    {"eval/step", "1", "optimizer steps done when the eval set was evaluated (every --eval-every and --eval-tau-every steps and after the last)"},
    {"eval/time_s", "s", "when the evaluation finished, seconds since this segment's job start"},
    {"eval/loss", "1", "held-out loss over the whole eval set (nats; position-weighted as the training loss)"},
    {"eval/acc", "1", "share of the eval set's loss positions whose drafter argmax equals the label"},
    {"eval/streak", "tokens", "mean leading run of correct predictions per block on the eval set (acceptance-length estimate)"},
    {"eval/acc_by_pos", "1", "[step, block_position] accuracy at each block position on the eval set (NaN: no position there)"},
    {"eval/tokens", "tokens", "tokens of the eval set"},
    {"eval/anchors", "1", "blocks evaluated (fixed anchors: the same every evaluation)"},
    {"eval/seqs", "1", "sequences of the eval set"},
    {"eval/seconds", "s", "wall time of the evaluation"},
    {"eval/tau", "tokens", "acceptance length tau by greedy speculative decoding of the eval set's prompts, as dflash-eval reports it: the mean over prompts of each prompt's mean accepted drafts + 1 per target verification (--eval-tau-every; NaN: not measured in this row)"},
    {"eval/tau_prompts", "1", "prompts decoded for tau (0: not measured)"},
    {"eval/tau_new_tokens", "tokens", "tokens generated over those prompts"},
    {"eval/tau_steps", "1", "target verifications over those prompts"},
    {"eval/tau_seconds", "s", "decoding wall time for tau, summed over the drafters (NaN: not measured)"},
};
}  // namespace

void MetricsWriter::append_eval(const EvalMetrics& m) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  DF_ASSERT(impl_->file.valid());
  const int positions = static_cast<int>(m.acc_by_pos.size());
  DF_CHECK(positions >= 1, Internal, "append_eval: no block positions");
  if (!impl_->series.count("eval/step")) {  // the first evaluation of this segment: make or open /eval
    impl_->group("eval", true);
    impl_->open_series("eval/step", Elem::I64, 0, true);
    // A series a resumed file lacks (tau, from a build before it) starts with its rows' fill value.
    const hsize_t rows = h5::dims(impl_->series.at("eval/step"))[0];
    for (const SeriesSpec& s : kEvalSeries) impl_->open_series(std::string("eval/") + s.name, s.elem, 0, true, rows);
    impl_->open_series("eval/acc_by_pos", Elem::F64, positions, true, rows);
    impl_->coordinate("eval/step");  // like /steps/step: the rows' step numbers name the dimension
    for (const SeriesSpec& s : kEvalSeries)
      if (std::string(s.name) != "step") impl_->name_axes(std::string("eval/") + s.name, {"eval/step"});
    if (positions == layout_.block_size - 1 && impl_->dims.count("steps/block_position"))
      impl_->name_axes("eval/acc_by_pos", {"eval/step", "steps/block_position"});
    else
      impl_->name_axes("eval/acc_by_pos", {"eval/step"});
    for (const SeriesNote& n : kEvalNotes) {
      h5::write_attr_string(impl_->series.at(n.name), "units", n.units);
      h5::write_attr_string(impl_->series.at(n.name), "description", n.description);
    }
  }
  impl_->append("eval/step", H5T_NATIVE_INT64, &m.step, 0);
  impl_->append("eval/time_s", H5T_NATIVE_DOUBLE, &m.time_s, 0);
  impl_->append("eval/loss", H5T_NATIVE_DOUBLE, &m.loss, 0);
  impl_->append("eval/acc", H5T_NATIVE_DOUBLE, &m.acc, 0);
  impl_->append("eval/streak", H5T_NATIVE_DOUBLE, &m.streak, 0);
  impl_->append("eval/tokens", H5T_NATIVE_INT64, &m.tokens, 0);
  impl_->append("eval/anchors", H5T_NATIVE_INT64, &m.anchors, 0);
  impl_->append("eval/seqs", H5T_NATIVE_INT64, &m.seqs, 0);
  impl_->append("eval/seconds", H5T_NATIVE_DOUBLE, &m.seconds, 0);
  impl_->append("eval/tau", H5T_NATIVE_DOUBLE, &m.tau, 0);
  impl_->append("eval/tau_prompts", H5T_NATIVE_INT64, &m.tau_prompts, 0);
  impl_->append("eval/tau_new_tokens", H5T_NATIVE_INT64, &m.tau_new_tokens, 0);
  impl_->append("eval/tau_steps", H5T_NATIVE_INT64, &m.tau_steps, 0);
  impl_->append("eval/tau_seconds", H5T_NATIVE_DOUBLE, &m.tau_seconds, 0);
  impl_->append("eval/acc_by_pos", H5T_NATIVE_DOUBLE, m.acc_by_pos.data(), positions);
  impl_->flush_or_stop("flushing");
  appends_since_flush_ = 0;
}

void MetricsWriter::drop_eval_after(int64_t last_step) {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!h5::link_exists(impl_->file, "eval/step")) return;
  std::vector<std::string> names;
  for (const SeriesSpec& s : kEvalSeries) names.push_back(std::string("eval/") + s.name);
  names.push_back("eval/acc_by_pos");
  std::vector<Handle> ds;
  for (const std::string& n : names) {
    if (!h5::link_exists(impl_->file, n)) continue;
    ds.emplace_back(DF_H5(H5Dopen2(impl_->file, n.c_str(), H5P_DEFAULT), "opening " + n + " in " + path_), Handle::Kind::Dataset);
  }
  const hsize_t n = h5::dims(ds.front())[0];  // eval/step
  std::vector<int64_t> steps(n);
  if (n > 0) DF_H5(H5Dread(ds.front(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()), "reading eval/step");
  hsize_t keep = 0;  // rows are appended in step order
  while (keep < n && steps[keep] <= last_step) ++keep;
  if (keep == n) return;
  for (const Handle& d : ds) {
    std::vector<hsize_t> dims = h5::dims(d);
    dims[0] = keep;
    DF_H5(H5Dset_extent(d, dims.data()), "shrinking eval in " + path_);
  }
  impl_->flush_or_stop("flushing");
}

void MetricsWriter::flush() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_->file.valid()) return;
  impl_->flush_or_stop("flushing");
  appends_since_flush_ = 0;
}

void MetricsWriter::close() {
  std::lock_guard<std::mutex> lock(hdf5_mutex());
  if (!impl_ || !impl_->file.valid()) return;
  impl_->flush_or_stop("closing");
  impl_->series.clear();
  impl_->dims.clear();
  impl_->role_type.reset();
  impl_->file.reset();
  impl_->reserve.release();
}

}  // namespace dflash
