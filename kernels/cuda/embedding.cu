#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/interleave.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;

// Element c of row r of the table as f32; the dtype is a template parameter so each variant is a
// straight load (+ convert) with no per-element branch.
template <DType D>
__device__ __forceinline__ float table_at(const DeviceMatrix& t, int64_t r, int64_t c) {
    // A tied table is also lm_head, which may be stored in the GEMV's interleaved order.
    const int64_t i = r * t.cols + (t.interleaved ? interleaved_col(c, interleave_chunk_cols(D)) : c);
    if constexpr (D == DType::F32) {
        return static_cast<const float*>(t.data)[i];
    } else if constexpr (D == DType::F16) {
        return __half2float(static_cast<const __half*>(t.data)[i]);
    } else if constexpr (D == DType::BF16) {
        return __bfloat162float(static_cast<const __nv_bfloat16*>(t.data)[i]);
    } else {
        // I8: q * scale of its group; scales are [rows, cols / group_size].
        const float q = float(static_cast<const int8_t*>(t.data)[i]);
        return q * t.scales[r * (t.cols / t.group_size) + c / t.group_size];
    }
}

// One block per token: the block copies (converts) the token's row with coalesced strided loads,
// or writes zeros when the row belongs to another rank. The table is passed by value (kernel
// parameter space), so every thread reads the same few fields from the constant bank.
template <DType D>
__global__ void embedding_kernel(DeviceMatrix t, const int32_t* __restrict__ ids, int64_t vocab0,
                                 float* __restrict__ out) {
    pdl_wait();
    pdl_launch_dependents();
    const int64_t r = int64_t(ids[blockIdx.x]) - vocab0;
    float* o = out + int64_t(blockIdx.x) * t.cols;
    if (r >= 0 && r < t.rows) {
        for (int64_t c = threadIdx.x; c < t.cols; c += blockDim.x) o[c] = table_at<D>(t, r, c);
    } else {
        for (int64_t c = threadIdx.x; c < t.cols; c += blockDim.x) o[c] = 0.0f;
    }
}

}  // namespace

void embedding_cuda(const DeviceMatrix& table, const int32_t* ids, int64_t n, int64_t vocab0, float* out,
                    cudaStream_t stream) {
    if (n == 0 || table.cols == 0) return;
    SHARDLM_CHECK(n > 0 && n <= INT_MAX, "embedding_cuda: ", n, " tokens do not fit one grid");
    if (table.dtype == DType::I8)
        SHARDLM_CHECK(table.scales && table.group_size > 0 && table.cols % table.group_size == 0,
                      "embedding_cuda: int8 table needs scales and a group size dividing ", table.cols);
    const dim3 grid(static_cast<unsigned>(n));
    auto run = [&](auto kernel) {
        launch_kernel("embedding_kernel", kernel, grid, dim3(kThreads), 0, stream, table, ids, vocab0, out);
    };
    switch (table.dtype) {
        case DType::F32: run(embedding_kernel<DType::F32>); break;
        case DType::F16: run(embedding_kernel<DType::F16>); break;
        case DType::BF16: run(embedding_kernel<DType::BF16>); break;
        case DType::I8: run(embedding_kernel<DType::I8>); break;
        default: fail("embedding_cuda: unsupported table dtype ", dtype_name(table.dtype));
    }
}

}  // namespace shardlm
