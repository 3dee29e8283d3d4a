#pragma once
#include "dflash/tensor.h"

namespace dflash::test {
// Enqueues on ctx's stream a kernel that waits about `microseconds` and does nothing else.
void gpu_spin(const Ctx& ctx, unsigned microseconds);
}  // namespace dflash::test
