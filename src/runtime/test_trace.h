// Test hook --inject-trace-dir: which records a run trained on, for tests that compare runs by their data
// (tests/e2e/test_resume_resplit.sh: a run whose split changed trains every record of an epoch once).
// Each rank appends lines to DIR/trace.rankNNNNN (append: the segments of a resumed run add to them):
//   sent SEGMENT TARGET_RANK BATCH_INDEX EPOCH RECORD...   a target sent a training batch with these records
//   trained SEGMENT TARGET_RANK BATCH_INDEX STEP           a drafter's step STEP (applied) trained that batch
// SEGMENT is the step the job started from (0, or the checkpoint's): batch indices restart with a new split.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dflash {

class TestTrace {
 public:
  // Off (every call a no-op) when dir is empty.
  TestTrace(const std::string& dir, int world_rank, int64_t segment);
  ~TestTrace();
  TestTrace(const TestTrace&) = delete;
  TestTrace& operator=(const TestTrace&) = delete;
  bool on() const { return file_ != nullptr; }
  void sent(int target_rank, int64_t batch_index, int64_t epoch, const std::vector<int64_t>& records);
  // Drafters: trained() for each batch of the step in progress, applied(step) once the optimizer applied it
  // (a step cut short is not written: its batches are trained again after a resume).
  void trained(int target_rank, int64_t batch_index);
  void applied(int64_t step);

 private:
  std::FILE* file_ = nullptr;
  int64_t segment_ = 0;
  std::vector<std::pair<int, int64_t>> pending_;
};

}  // namespace dflash
