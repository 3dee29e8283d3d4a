// main() of the multi-rank test binaries (tests/mpi/, tests/gpu_mpi/): GoogleTest under MPI. Every rank
// runs every test (each test runs the same collectives in the same order on every rank, and checks its own
// rank's results); only the first rank prints the per-test lines, every rank prints its failures. The
// exit code is agreed: 1 when any rank failed, 77 when every test was skipped (ctest: SKIP_RETURN_CODE),
// else 0.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>

namespace {

// Keeps only the failure output on ranks other than the first.
class FailuresOnly : public testing::EmptyTestEventListener {
 public:
  explicit FailuresOnly(int rank) : rank_(rank) {}
  void OnTestPartResult(const testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    testing::TestEventListeners& l = testing::UnitTest::GetInstance()->listeners();
    delete l.Release(l.default_result_printer());
    l.Append(new FailuresOnly(rank));
  }
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& u = *testing::UnitTest::GetInstance();
  int failed = rc != 0 ? 1 : 0, all_skipped = u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &all_skipped, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Finalize();
  return failed ? 1 : (all_skipped ? 77 : 0);
}
