// The distributed job (docs/pipeline.md): what dflash-train's main calls after MPI_Init.
#pragma once
#include "dflash/options.h"

namespace dflash {

// Runs this rank's part of the job: topology, startup table, input checks, its role (target, drafter or
// idle), orderly shutdown. Every failure ends the job through fatal(); returns 0 on success. The caller
// owns MPI_Init/MPI_Finalize.
int run_job(const Options& options);

// --dry-run: rank 0 prints the resolved options, every rank's role (the real topology code over this MPI
// world) and the schedule (epoch size from the dataset's shape), loading no model and reading no tokens.
// Collective over MPI_COMM_WORLD; returns 0, or ends through fatal() as the job would (bad paths, a world
// that does not fit --topology).
int dry_run(const Options& options);

}  // namespace dflash
