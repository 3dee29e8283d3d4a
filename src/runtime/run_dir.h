// What a run leaves in --out besides metrics and checkpoints: the exported drafter of an earlier run set
// aside before a fresh one writes its own (issue 48 item 7), and the record that a run ended with its
// export, which tells a finished run resumed again that there is nothing to do (item 6).
#pragma once
#include <cstdint>
#include <string>

namespace dflash {

// World rank 0, a fresh run (no checkpoint resumed), holding --out's lock: a non-empty OUT/drafter
// directory (an earlier run's export) is renamed to OUT/drafter.N, N one more than the highest there, as
// metrics.h5 is set aside (src/metrics/metrics_writer_open.cpp); says so. A regular file or an empty
// directory at the name is left (the export says what is in its way; an empty mount point stays usable).
// Fatal SystemFailure when the rename fails.
void set_aside_previous_drafter(const std::string& out_dir);

// The run of lineage `run_id` ended at `step` with OUT/drafter exported: OUT/.dflash-complete (JSON),
// written atomically after the export.
void record_run_complete(const std::string& out_dir, const std::string& run_id, int64_t step);

// Whether resuming the checkpoint of (run_id, step) has nothing left to do: OUT/.dflash-complete names that
// run and step, and OUT/drafter/model.safetensors is there. (The caller checks that the resume does not
// extend the run.) A missing or unreadable record: false (the resume exports again).
enum class RunState { GoesOn, AlreadyComplete };
RunState run_state_at(const std::string& out_dir, const std::string& run_id, int64_t step);

}  // namespace dflash
