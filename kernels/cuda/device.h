// What CUDA devices this process can use.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace shardlm {

// Number of devices a context can be created on; 0 without a driver or a GPU (never throws).
int cuda_usable_device_count();

// "NVIDIA H200 (sm_90, 139.8 GiB)" for device `index`.
std::string cuda_device_description(int index);

// Theoretical memory bandwidth of the current device in GB/s: 2 (double data rate) x memory
// clock x bus width, from the device's attributes (e.g. about 4900 for an H200).
double cuda_peak_gbps();

// Whether kernels launch with programmatic dependent launch (kernels/cuda/launch.h): the current
// device is sm_90 or newer and SHARDLM_PDL is not "0" (read once per process).
bool pdl_enabled();

// A tuning variable of the CUDA code (SHARDLM_GEMV_R, SHARDLM_GEMV_GRID, SHARDLM_PREFILL_TC, SHARDLM_FUSED_ROPE, SHARDLM_GEMM_STAGE): its value when set to one of `allowed`, "" when unset or empty; any other
// value is an error naming the variable, `what` it sets and the values allowed. For A/B
// measurements, not for users.
std::string cuda_tuning_env(const char* name, std::initializer_list<const char*> allowed, const char* what);

// Whether attention's prefill tiles run on tensor cores (attention.h, AttentionKind::Flash): the
// current device is sm_80 or newer, its tensor cores pass mma_layout_holds() (mma_check.h), and
// SHARDLM_PREFILL_TC is not "0" (the A/B switch against the FP32-pipe kernel; any value but 0 and
// 1 is an error). Decided once per process, at the first call (the CUDA engine makes it when it is
// built, outside any stream capture).
bool prefill_tensor_cores();

// Whether decode steps fuse the RoPE prologue into the split-KV attention kernel (attention.h,
// AttentionCuda::rope) rather than running rope_kv_cuda before it: 1 or unset (the default since
// the H200 timed it on 2026-12-04: 0.97-1.00x the separate kernel's ms/token at batch 1 and 4,
// FP16 and INT8); SHARDLM_FUSED_ROPE=0: separate. Any other value is an error. Read once per
// process.
bool decode_rope_fused();

// Whether INT8 prefill products dequantize each matrix on a side stream while the product before
// it runs (gemm.h CublasGemm::stage): SHARDLM_GEMM_STAGE=1; 0 or unset: each just before its own
// product, the default until a GPU has timed it. Any other value is an error. Read once per process.
bool int8_gemm_staging();

// The current device's number of multiprocessors.
int cuda_sm_count();

}  // namespace shardlm
