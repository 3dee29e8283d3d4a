// The distributed job (docs/pipeline.md): what dflash-train's main calls after MPI_Init.
#pragma once
#include "dflash/options.h"

namespace dflash {

// Runs this rank's part of the job: topology, startup table, input checks, its role (target, drafter or
// idle), orderly shutdown. Every failure ends the job through fatal(); returns 0 on success. The caller
// owns MPI_Init/MPI_Finalize.
int run_job(const Options& options);

}  // namespace dflash
