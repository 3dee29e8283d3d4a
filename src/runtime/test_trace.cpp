// See test_trace.h.
#include "test_trace.h"

#include <cerrno>
#include <cstring>

#include "dflash/error.h"

namespace dflash {

TestTrace::TestTrace(const std::string& dir, int world_rank, int64_t segment) : segment_(segment) {
  if (dir.empty()) return;
  char name[32];
  std::snprintf(name, sizeof(name), "/trace.rank%05d", world_rank);
  const std::string path = dir + name;
  file_ = std::fopen(path.c_str(), "a");
  DF_CHECK_HINT(file_ != nullptr, SystemFailure, "--inject-trace-dir: cannot open " << path << ": " << std::strerror(errno),
                "give an existing, writable directory");
}

TestTrace::~TestTrace() {
  if (file_) std::fclose(file_);
}

void TestTrace::sent(int target_rank, int64_t batch_index, int64_t epoch, const std::vector<int64_t>& records) {
  if (!file_) return;
  std::fprintf(file_, "sent %lld %d %lld %lld", static_cast<long long>(segment_), target_rank,
               static_cast<long long>(batch_index), static_cast<long long>(epoch));
  for (int64_t r : records) std::fprintf(file_, " %lld", static_cast<long long>(r));
  std::fputc('\n', file_);
  std::fflush(file_);
}

void TestTrace::trained(int target_rank, int64_t batch_index) {
  if (file_) pending_.emplace_back(target_rank, batch_index);
}

void TestTrace::applied(int64_t step) {
  if (!file_) return;
  for (const auto& [rank, index] : pending_)
    std::fprintf(file_, "trained %lld %d %lld %lld\n", static_cast<long long>(segment_), rank,
                 static_cast<long long>(index), static_cast<long long>(step));
  pending_.clear();
  std::fflush(file_);
}

}  // namespace dflash
