// CHECK macros for CUDA-side calls; every failure goes through dflash::fatal (DeviceFailure).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dflash/error.h"

#define DF_CUDA(call)                                                                                  \
  do {                                                                                                 \
    cudaError_t df_e_ = (call);                                                                        \
    if (df_e_ != cudaSuccess)                                                                          \
      DF_FAIL(DeviceFailure, "CUDA call failed: " #call " -> " << cudaGetErrorString(df_e_) << " ("    \
                                                           << __FILE__ << ":" << __LINE__ << ")",      \
              "check the GPU is visible (nvidia-smi), not out of memory, and the build arch matches"); \
  } while (0)
// After a kernel launch: DF_CUDA_LAUNCH();
#define DF_CUDA_LAUNCH() DF_CUDA(cudaGetLastError())
#define DF_CUBLAS(call)                                                                               \
  do {                                                                                                \
    cublasStatus_t df_s_ = (call);                                                                    \
    if (df_s_ != CUBLAS_STATUS_SUCCESS)                                                               \
      DF_FAIL(DeviceFailure, "cuBLAS call failed: " #call " -> " << cublasGetStatusString(df_s_) << " (" \
                                                              << __FILE__ << ":" << __LINE__ << ")", ""); \
  } while (0)
