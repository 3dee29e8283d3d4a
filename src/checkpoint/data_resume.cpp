// Where this job's targets start: as saved, or -- on another number of targets -- the saved split's
// consumed records collected per epoch and the rest dealt over the new targets (checkpoint.h, DataResume).
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <memory>
#include <cstring>
#include <set>
#include <sstream>

#include "dflash/checkpoint.h"
#include "dflash/error.h"

namespace dflash {
namespace {

DataPosition start_of(int64_t epoch, int shard, int num_shards, uint64_t seed) {
  DataPosition p;
  p.epoch = epoch;
  p.seed = seed;
  p.shard_index = shard;
  p.num_shards = num_shards;
  return p;
}

// The records one saved target consumed: its shard of every epoch from `from_epoch` up to its position,
// the part of its position's epoch before the cursor, and the batches listed as trained after it (found by
// replaying the loader's packing from the position). `mark(epoch, record)` receives each.
template <class Mark>
void collect_consumed(const RecordSource& ds, const LoaderOptions& lo, int max_epochs, const DataResumePoint& saved,
                      int64_t from_epoch, Mark mark) {
  const size_t n = ds.num_records();
  const DataPosition& p = saved.position;
  for (int64_t e = from_epoch; e < p.epoch; ++e)
    for (int64_t r : Loader::shard_order(n, lo.seed, e, lo.shard_index, lo.num_shards, lo.consumed.get())) mark(e, r);
  std::vector<int64_t> order = Loader::shard_order(n, lo.seed, p.epoch, lo.shard_index, lo.num_shards, lo.consumed.get());
  DF_CHECK_HINT(p.cursor <= static_cast<int64_t>(order.size()), BadInput,
                "the checkpoint's data position " << p.to_string() << " is past the end of its shard ("
                                                  << order.size() << " records in epoch " << p.epoch << ")",
                "the dataset is not the one the checkpoint was trained on");
  for (int64_t c = 0; c < p.cursor; ++c) mark(p.epoch, order[static_cast<size_t>(c)]);
  if (saved.done_after.empty()) return;
  std::set<int64_t> listed;
  for (const auto& [index, next] : saved.done_after) listed.insert(index);
  const int64_t last = *listed.rbegin();
  int64_t epoch = p.epoch, cursor = p.cursor, index = p.batches;
  while (index <= last) {
    if (cursor >= static_cast<int64_t>(order.size())) {  // the loader goes on with the next epoch
      ++epoch;
      cursor = 0;
      DF_CHECK_HINT(max_epochs == 0 || epoch < max_epochs, BadInput,
                    "the checkpoint lists batch " << last << " of target " << lo.shard_index
                                                  << " as trained, but its data ends at batch " << index,
                    "the dataset or --epochs is not what the checkpoint was trained with");
      order = Loader::shard_order(n, lo.seed, epoch, lo.shard_index, lo.num_shards, lo.consumed.get());
      continue;
    }
    const BatchExtent ext = pack_extent(ds, order, cursor, lo.token_budget, lo.long_record);
    if (!ext.taken.empty()) {
      if (listed.count(index))
        for (int64_t c = cursor; c < ext.end; ++c) mark(epoch, order[static_cast<size_t>(c)]);
      ++index;
    }
    cursor = ext.end;
  }
}

}  // namespace

DataResume fresh_data_resume(int num_targets, uint64_t seed) {
  DataResume d;
  for (int t = 0; t < num_targets; ++t) d.points.push_back(DataResumePoint{start_of(0, t, num_targets, seed), {}});
  return d;
}

int64_t data_batches_left(const RecordSource& ds, const LoaderOptions& base, int max_epochs, const DataResume& d) {
  DF_CHECK(max_epochs > 0, Internal, "data_batches_left without an end of the data");
  const int n = static_cast<int>(d.points.size());
  auto consumed = std::make_shared<const ConsumedRecords>(d.consumed);
  int64_t left = 0;
  for (int t = 0; t < n; ++t) {
    const DataResumePoint& p = d.points[t];
    for (int64_t epoch = p.position.epoch; epoch < max_epochs; ++epoch) {
      const std::vector<int64_t> order =
          Loader::shard_order(ds.num_records(), base.seed, epoch, t, n, consumed.get());
      for (int64_t cursor = epoch == p.position.epoch ? p.position.cursor : 0; cursor < static_cast<int64_t>(order.size());) {
        const BatchExtent e = pack_extent(ds, order, cursor, base.token_budget, base.long_record);
        if (!e.taken.empty()) ++left;
        cursor = e.end;
      }
    }
    left -= static_cast<int64_t>(p.done_after.size());
  }
  return left;
}

ConsumedRecords consumed_still_needed(const ConsumedRecords& consumed, const std::vector<DataResumePoint>& points) {
  int64_t lowest = INT64_MAX;
  for (const DataResumePoint& p : points) lowest = std::min(lowest, p.position.epoch);
  ConsumedRecords keep;
  for (const auto& [epoch, set] : consumed)
    if (epoch >= lowest) keep.emplace(epoch, set);
  return keep;
}

DataResume plan_data_resume(const RecordSource& ds, const LoaderOptions& base, int max_epochs,
                            const std::vector<DataResumePoint>& saved, const ConsumedRecords& saved_consumed,
                            int num_targets) {
  DF_CHECK(num_targets >= 1 && !saved.empty(), Internal, "plan_data_resume: " << saved.size() << " -> " << num_targets);
  const int old_targets = static_cast<int>(saved.size());
  const size_t n = ds.num_records();
  for (int i = 0; i < old_targets; ++i) {
    const DataPosition& p = saved[i].position;
    DF_CHECK_HINT(p.seed == base.seed && p.shard_index == i && p.num_shards == old_targets, BadInput,
                  "the checkpoint's data position of target " << i << " (" << p.to_string() << ") is not of its shard "
                                                              << i << "/" << old_targets << " with seed " << base.seed,
                  "resume with the --seed the checkpoint was made with");
  }
  for (const auto& [epoch, set] : saved_consumed)
    DF_CHECK_HINT(set.size() == n, BadInput,
                  "the checkpoint's consumed records of epoch " << epoch << " cover " << set.size()
                                                                << " records, the dataset has " << n,
                  "the dataset is not the one the checkpoint was trained on");
  DataResume d;
  d.consumed = saved_consumed;
  if (old_targets == num_targets) {  // the same split of the data: go on as saved
    d.points = saved;
    d.first_epoch = INT64_MAX;
    for (const DataResumePoint& p : saved) d.first_epoch = std::min(d.first_epoch, p.position.epoch);
    d.consumed = consumed_still_needed(saved_consumed, saved);
    return d;
  }

  // Another number of targets. Every saved target's position, its end of epoch read as the next epoch's start.
  auto shared_consumed = std::make_shared<const ConsumedRecords>(saved_consumed);
  std::vector<DataResumePoint> points = saved;
  int64_t first = INT64_MAX;
  for (int i = 0; i < old_targets; ++i) {
    DataPosition& p = points[i].position;
    const size_t in_epoch =
        Loader::shard_order(n, base.seed, p.epoch, i, old_targets, shared_consumed.get()).size();
    if (p.cursor == static_cast<int64_t>(in_epoch)) {  // (the listed batches' replay starts there too)
      p.epoch++;
      p.cursor = 0;
    }
    first = std::min(first, p.epoch);
  }
  ConsumedRecords marks;
  for (const auto& [epoch, set] : saved_consumed)
    if (epoch >= first) marks.emplace(epoch, set);
  int64_t marked = 0;
  auto mark = [&](int64_t epoch, int64_t r) {
    auto it = marks.find(epoch);
    if (it == marks.end()) it = marks.emplace(epoch, RecordSet(n)).first;
    DF_CHECK(!it->second.test(static_cast<size_t>(r)), Internal,
             "record " << r << " of epoch " << epoch << " was consumed twice by the checkpoint's targets");
    it->second.set(static_cast<size_t>(r));
    ++marked;
  };
  for (int i = 0; i < old_targets; ++i) {
    LoaderOptions lo = base;
    lo.shard_index = i;
    lo.num_shards = old_targets;
    lo.consumed = shared_consumed;
    collect_consumed(ds, lo, max_epochs, points[i], first, mark);
  }
  // The new targets start at the first epoch not finished; complete epochs after it stay listed (their
  // order is empty: the loaders pass over them).
  int64_t start = first;
  while (marks.count(start) && marks.at(start).count() == n) ++start;
  for (auto it = marks.begin(); it != marks.end();) it = it->first < start ? marks.erase(it) : std::next(it);
  d.consumed = std::move(marks);
  d.resplit = true;
  d.first_epoch = start;
  d.points.clear();
  for (int t = 0; t < num_targets; ++t) d.points.push_back(DataResumePoint{start_of(start, t, num_targets, base.seed), {}});
  std::ostringstream os;
  os << "data re-partitioned from " << old_targets << " to " << num_targets << " target(s): ";
  const auto it = d.consumed.find(start);
  if (max_epochs > 0 && start >= max_epochs)
    os << "every epoch is done";
  else if (it != d.consumed.end())
    os << "epoch " << start << " goes on with its " << (n - it->second.count()) << " record(s) not yet trained ("
       << it->second.count() << " of " << n << " consumed before)";
  else
    os << "epoch " << start << " starts whole";
  d.summary = os.str();
  return d;
}

// ---- as bytes: a JSON header line, then every consumed set's bytes -------------------------------------

std::string serialize_data_resume(const DataResume& d) {
  nlohmann::json h;
  h["points"] = data_points_to_json(d.points);
  h["resplit"] = d.resplit;
  h["first_epoch"] = d.first_epoch;
  h["summary"] = d.summary;
  h["consumed"] = nlohmann::json::array();
  for (const auto& [epoch, set] : d.consumed) h["consumed"].push_back({epoch, set.size()});
  std::string out = h.dump() + "\n";
  for (const auto& [epoch, set] : d.consumed) out.append(reinterpret_cast<const char*>(set.bytes().data()), set.bytes().size());
  return out;
}

DataResume deserialize_data_resume(const std::string& bytes) {
  const size_t nl = bytes.find('\n');
  DF_CHECK(nl != std::string::npos, Internal, "a data resume without its header");
  const nlohmann::json h = nlohmann::json::parse(bytes.substr(0, nl));
  DataResume d;
  d.points = data_points_from_json(h.at("points"), "the job's data resume");
  d.resplit = h.at("resplit").get<bool>();
  d.first_epoch = h.at("first_epoch").get<int64_t>();
  d.summary = h.at("summary").get<std::string>();
  size_t off = nl + 1;
  for (const auto& e : h.at("consumed")) {
    const int64_t epoch = e.at(0).get<int64_t>();
    const size_t n = e.at(1).get<size_t>();
    const size_t len = (n + 7) / 8;
    DF_CHECK(off + len <= bytes.size(), Internal, "a data resume shorter than its header says");
    d.consumed[epoch] = RecordSet::from_bytes(n, std::vector<uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(off),
                                                                      bytes.begin() + static_cast<std::ptrdiff_t>(off + len)));
    off += len;
  }
  DF_CHECK(off == bytes.size(), Internal, "a data resume longer than its header says");
  return d;
}

}  // namespace dflash
