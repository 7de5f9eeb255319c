// Prefill products through cuBLAS. Row-major y[T, rows] = x[T, cols] * W^T in cuBLAS's
// column-major terms: W row-major [rows, cols] is column-major A [cols, rows] (lda = cols), x is
// B [cols, T] (ldb = cols) and y is C [rows, T] (ldc = rows), so C = A^T * B with OP_T, OP_N,
// m = rows, n = T, k = cols.
//
// Everything runs on the handle's stream with a workspace we own, so a product can be captured
// in a CUDA graph (no allocation, no synchronisation inside run()).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/align.h"
#include "kernels/cuda/cublas_check.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/interleave.h"
#include "kernels/cuda/launch.h"

namespace shardlm {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;                  // grid-stride loops cover the rest
constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLAS's recommendation for Hopper

unsigned blocks_for(int64_t count) {
    return unsigned(std::max<int64_t>(1, std::min<int64_t>((count + kThreads - 1) / kThreads, kMaxBlocks)));
}

__device__ __forceinline__ void store_as(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_as(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// out[i] = x[i] rounded to the weights' 16-bit type, for i < count; with interleaved weights
// (interleave_c = their chunk columns, else 0) each row's columns go where the weights keep theirs,
// so the product over the columns is the same.
template <typename H>
__global__ void convert_kernel(const float* __restrict__ x, H* __restrict__ out, int64_t count, int64_t cols,
                               int interleave_c) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        const int64_t o = interleave_c ? (i / cols) * cols + interleaved_col(i % cols, interleave_c) : i;
        store_as(out + o, x[i]);
    }
}

// convert_kernel four columns at a time (cols % 4 == 0, x 16-byte and out 8-byte aligned): one
// float4 load and one 8-byte store per thread and step, instead of a 64-bit division per element;
// the store is store_half_input4's, the same the norms and SwiGLU use when they write this input
// themselves (half_input.h).
__global__ void convert_vec_kernel(const float* __restrict__ x, HalfInput out, int64_t quads, int64_t row_quads) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < quads; i += stride) {
        const int64_t r = i / row_quads, c = (i - r * row_quads) * 4;
        store_half_input4(out, r, row_quads * 4, c, __ldg(reinterpret_cast<const float4*>(x) + i));
    }
}

// out[r, j] = f16(q[r, j] * scales[r, j / group_size]) for the block's rows, in the order the
// weights are stored: interleaving (interleave.h) keeps every column inside its group, and the x
// copy of the same product follows that order too. A block per row, grid-stride over rows.
__global__ void dequant_i8_kernel(const int8_t* __restrict__ q, const float* __restrict__ scales,
                                  __half* __restrict__ out, int64_t rows, int cols, int group_size) {
    const int groups = cols / group_size;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int8_t* qr = q + r * cols;
        const float* sr = scales + r * groups;
        __half* o = out + r * cols;
        for (int c = int(threadIdx.x); c < cols; c += kThreads) o[c] = __float2half_rn(float(qr[c]) * sr[c / group_size]);
    }
}

// dequant_i8_kernel 16 columns at a time (cols and group_size multiples of 16, 16-byte aligned):
// one 16-byte load and two 16-byte stores per thread and step, the same products and rounding.
// The scalar kernel moved a byte per load and divided per element: ncu timed it at 56.6 us per
// launch on the H200 (a Qwen3-1.7B layer's matrices, 512 tokens), 46% of an INT8 prefill.
__global__ void dequant_i8_vec_kernel(const int8_t* __restrict__ q, const float* __restrict__ scales,
                                      __half* __restrict__ out, int64_t chunks, int row_chunks, int group_chunks) {
    const int groups = row_chunks / group_chunks;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
        const int64_t r = i / row_chunks;
        const int c = int(i - r * row_chunks);
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(q) + i);
        const float s = __ldg(scales + r * groups + c / group_chunks);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint32_t h2[8];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            float f[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) f[b] = float(int8_t(uint8_t(words[w] >> (8 * b)))) * s;
            const __half2 lo = __halves2half2(__float2half_rn(f[0]), __float2half_rn(f[1]));
            const __half2 hi = __halves2half2(__float2half_rn(f[2]), __float2half_rn(f[3]));
            memcpy(&h2[2 * w], &lo, 4);
            memcpy(&h2[2 * w + 1], &hi, 4);
        }
        uint4* o = reinterpret_cast<uint4*>(out) + 2 * i;
        o[0] = make_uint4(h2[0], h2[1], h2[2], h2[3]);
        o[1] = make_uint4(h2[4], h2[5], h2[6], h2[7]);
    }
}

// out[r, c] = f16(q * scale + min) of I4 weights (weights_view.h), one element per thread and
// step: any alignment (dequant_i4_vec_kernel is the one the engine's matrices take).
__global__ void dequant_i4_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales,
                                  const float* __restrict__ mins, __half* __restrict__ out, int64_t count, int64_t cols,
                                  int64_t group_size) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, groups = cols / group_size;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
        const int64_t r = i / cols, c = i - r * cols, g = r * groups + c / group_size;
        const uint8_t b = q[r * (cols / 2) + (c / 32) * 16 + c % 16];
        out[i] = __float2half_rn(fmaf(float(c % 32 >= 16 ? b >> 4 : b & 15), scales[g], mins[g]));
    }
}

// dequant_i4_kernel a 32-column block at a time (q and out 16-byte aligned): one 16-byte load and
// four 16-byte stores per thread and step. Byte j of the block holds column j (low nibble) and
// column 16 + j (high nibble), so the low nibbles fill the first two stores and the high ones
// the last two. A block never straddles a group (groups are multiples of 32 columns).
__global__ void dequant_i4_vec_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales,
                                      const float* __restrict__ mins, __half* __restrict__ out, int64_t chunks,
                                      int row_chunks, int group_chunks) {
    const int groups = row_chunks / group_chunks;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks; i += stride) {
        const int64_t r = i / row_chunks;
        const int c = int(i - r * row_chunks);
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(q) + i);
        const int64_t g = r * groups + c / group_chunks;
        const float s = __ldg(scales + g), m = __ldg(mins + g);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        uint32_t h2[16];  // [low nibbles: columns 0..15 | high nibbles: columns 16..31] as half pairs
#pragma unroll
        for (int hi = 0; hi < 2; ++hi)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                float f[4];
#pragma unroll
                for (int b = 0; b < 4; ++b) f[b] = fmaf(float((words[w] >> (8 * b + 4 * hi)) & 15u), s, m);
                const __half2 lo = __halves2half2(__float2half_rn(f[0]), __float2half_rn(f[1]));
                const __half2 up = __halves2half2(__float2half_rn(f[2]), __float2half_rn(f[3]));
                memcpy(&h2[8 * hi + 2 * w], &lo, 4);
                memcpy(&h2[8 * hi + 2 * w + 1], &up, 4);
            }
        uint4* o = reinterpret_cast<uint4*>(out) + 4 * i;
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k] = make_uint4(h2[4 * k], h2[4 * k + 1], h2[4 * k + 2], h2[4 * k + 3]);
    }
}

// y[t, r] += bias[r].
__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t T, int64_t rows) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y)
        for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += stride)
            y[t * rows + r] += bias[r];
}

void add_bias(float* y, const float* bias, int64_t T, int64_t rows, cudaStream_t stream) {
    const dim3 grid(blocks_for(rows), unsigned(std::min<int64_t>(T, 65535)));
    launch_plain("add_bias_kernel", add_bias_kernel, grid, dim3(kThreads), 0, stream, y, bias, T, rows);
}

template <typename H>
void convert_x(const float* x, void* out, int64_t count, int64_t cols, int interleave_c, cudaStream_t stream) {
    if (cols % 4 == 0 && is_aligned(x, 16) && is_aligned(out, 8)) {
        const HalfInput h{out, std::is_same_v<H, __nv_bfloat16> ? DType::BF16 : DType::F16, interleave_c};
        launch_plain("convert_vec_kernel", convert_vec_kernel, dim3(blocks_for(count / 4)), dim3(kThreads), 0, stream,
                     x, h, count / 4, cols / 4);
        return;
    }
    launch_plain("convert_kernel", convert_kernel<H>, dim3(blocks_for(count)), dim3(kThreads), 0, stream, x,
                 static_cast<H*>(out), count, cols, interleave_c);
}

// Rows [0, rows) of I8 weights q (scales per row and group) into out as f16, in their stored order.
void dequant_i8(const int8_t* q, const float* scales, __half* out, int64_t rows, int64_t cols, int64_t group_size,
                cudaStream_t stream) {
    if (cols % 16 == 0 && group_size % 16 == 0 && is_aligned(q, 16) && is_aligned(out, 16)) {
        const int64_t chunks = rows * (cols / 16);
        launch_plain("dequant_i8_vec_kernel", dequant_i8_vec_kernel, dim3(blocks_for(chunks)), dim3(kThreads), 0,
                     stream, q, scales, out, chunks, int(cols / 16), int(group_size / 16));
        return;
    }
    launch_plain("dequant_i8_kernel", dequant_i8_kernel, dim3(unsigned(std::min<int64_t>(rows, kMaxBlocks))),
                 dim3(kThreads), 0, stream, q, scales, out, rows, int(cols), int(group_size));
}

// Rows [r0, r0 + rows) of I4 weights into out as f16, in their stored column order (the packing of
// interleaved codes is the natural one's, of stored columns).
void dequant_i4(const DeviceMatrix& w, int64_t r0, int64_t rows, __half* out, cudaStream_t stream) {
    const int64_t cols = w.cols, groups = cols / w.group_size;
    const uint8_t* q = static_cast<const uint8_t*>(w.data) + r0 * (cols / 2);
    const float* scales = w.scales + r0 * groups;
    const float* mins = w.mins + r0 * groups;
    if (is_aligned(q, 16) && is_aligned(out, 16)) {
        const int64_t chunks = rows * (cols / 32);
        launch_plain("dequant_i4_vec_kernel", dequant_i4_vec_kernel, dim3(blocks_for(chunks)), dim3(kThreads), 0,
                     stream, q, scales, mins, out, chunks, int(cols / 32), int(w.group_size / 32));
        return;
    }
    launch_plain("dequant_i4_kernel", dequant_i4_kernel, dim3(blocks_for(rows * cols)), dim3(kThreads), 0, stream, q,
                 scales, mins, out, rows * cols, cols, w.group_size);
}

// Rows [r0, r0 + rows) of I8 or I4 weights into out as f16, in their stored order.
void dequant_rows(const DeviceMatrix& w, int64_t r0, int64_t rows, __half* out, cudaStream_t stream) {
    if (w.dtype == DType::I4) return dequant_i4(w, r0, rows, out, stream);
    dequant_i8(static_cast<const int8_t*>(w.data) + r0 * w.cols, w.scales + r0 * (w.cols / w.group_size), out, rows,
               w.cols, w.group_size, stream);
}

// Whether w is INT8 or INT4 with what its dequantization needs.
bool quantized_ok(const DeviceMatrix& w) {
    if (w.dtype == DType::I8) return w.scales && w.group_size > 0 && w.cols % w.group_size == 0;
    if (w.dtype == DType::I4)
        return w.scales && w.mins && w.group_size > 0 && w.group_size % 32 == 0 && w.cols % w.group_size == 0 &&
               (!w.interleaved || w.group_size % interleave_block_cols(32) == 0);
    return false;
}

bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
    return st != cudaStreamCaptureStatusNone;
}

}  // namespace

// Frees what a (possibly half-built) CublasGemm holds; never throws.
void CublasGemm::release() noexcept {
    if (side_) cudaStreamSynchronize(side_);  // a staging dequantization may still write a slot
    if (handle_) cublasDestroy(handle_);
    if (x_half_) cudaFree(x_half_);
    if (w_half_) cudaFree(w_half_);
    if (workspace_) cudaFree(workspace_);
    if (slots_[1].buf) cudaFree(slots_[1].buf);
    for (Slot& s : slots_) {
        if (s.ready) cudaEventDestroy(s.ready);
        if (s.done) cudaEventDestroy(s.done);
        s = Slot{};
    }
    if (side_) cudaStreamDestroy(side_);
    handle_ = nullptr;
    x_half_ = w_half_ = workspace_ = nullptr;
    side_ = nullptr;
}

CublasGemm::CublasGemm(cudaStream_t stream, int64_t max_tokens, int64_t max_cols, int64_t max_weight_elems,
                       int64_t stage_elems)
    : stream_(stream), max_tokens_(max_tokens), max_cols_(max_cols), max_weight_elems_(max_weight_elems) {
    SHARDLM_CHECK(max_tokens >= 0 && max_cols >= 0 && max_weight_elems >= 0 && stage_elems >= 0,
                  "CublasGemm: negative size");
    SHARDLM_CHECK(max_cols == 0 || max_tokens <= (INT64_MAX / 2) / max_cols, "CublasGemm: scratch size overflows");
    SHARDLM_CHECK(max_weight_elems <= INT64_MAX / 2 && stage_elems <= INT64_MAX / 2, "CublasGemm: scratch size overflows");
    const size_t x_bytes = size_t(max_tokens * max_cols) * 2, w_bytes = size_t(max_weight_elems) * 2,
                 stage_bytes = size_t(stage_elems) * 2;
    try {
        CUBLAS_CHECK(cublasCreate(&handle_));
        // SetStream resets the handle to cuBLAS's own workspace pool, so the workspace comes after.
        CUBLAS_CHECK(cublasSetStream(handle_, stream_));
        CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
        CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_, kWorkspaceBytes));
        // No TF32: F32 products stay comparable with the CPU backend.
        CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
        if (x_bytes) CUDA_CHECK(cudaMalloc(&x_half_, x_bytes));
        if (w_bytes) CUDA_CHECK(cudaMalloc(&w_half_, w_bytes));
        slots_[0].buf = w_half_;
        slots_[0].elems = max_weight_elems;
        if (stage_bytes && w_bytes) {
            CUDA_CHECK(cudaMalloc(&slots_[1].buf, stage_bytes));
            slots_[1].elems = stage_elems;
            for (Slot& s : slots_) {
                CUDA_CHECK(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming));
                CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
            }
            CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
        }
    } catch (...) {
        release();
        throw;
    }
    scratch_bytes_ = kWorkspaceBytes + x_bytes + w_bytes + (side_ ? stage_bytes : 0);
}

CublasGemm::~CublasGemm() { release(); }

bool CublasGemm::stage(const DeviceMatrix& w) {
    if (!side_ || (w.dtype != DType::I8 && w.dtype != DType::I4) || !quantized_ok(w) || !w.data || w.rows <= 0 ||
        w.cols <= 0 || capturing(stream_))
        return false;
    for (const Slot& s : slots_)
        if (s.owner == w.data) return true;
    for (Slot& s : slots_) {
        if (s.owner || w.rows * w.cols > s.elems) continue;
        if (s.graph) {
            // A captured product reads this slot, and its replays are ordered only on the main
            // stream: start after everything queued there (once; eager products record `done`).
            CUDA_CHECK(cudaEventRecord(s.done, stream_));
            s.graph = false;
        }
        CUDA_CHECK(cudaStreamWaitEvent(side_, s.done, 0));
        dequant_rows(w, 0, w.rows, static_cast<__half*>(s.buf), side_);
        CUDA_CHECK(cudaEventRecord(s.ready, side_));
        s.owner = w.data;
        return true;
    }
    return false;
}

void CublasGemm::run(const DeviceMatrix& w, const float* x, int64_t T, const float* bias, float* y) {
    const int64_t rows = w.rows, cols = w.cols;
    SHARDLM_CHECK(T >= 0 && T <= max_tokens_, "CublasGemm: ", T, " tokens, scratch is for ", max_tokens_);
    SHARDLM_CHECK(rows >= 0 && cols >= 0 && rows <= INT_MAX && cols <= INT_MAX && T <= INT_MAX,
                  "CublasGemm: shape ", rows, "x", cols, " out of cuBLAS's range");
    const bool half_x = w.dtype != DType::F32;
    if (half_x) SHARDLM_CHECK(cols <= max_cols_, "CublasGemm: ", cols, " columns, scratch is for ", max_cols_);
    const bool quantized = w.dtype == DType::I8 || w.dtype == DType::I4;
    if (quantized) {
        SHARDLM_CHECK(quantized_ok(w), "CublasGemm: ", dtype_name(w.dtype),
                      " weights need scales (I4: and mins; interleaved: groups of whole 128-column blocks) and a group size dividing cols (",
                      w.group_size, ", ", cols, ")");
        SHARDLM_CHECK(cols <= max_weight_elems_, "CublasGemm: ", dtype_name(w.dtype), " rows of ", cols,
                      " elements, dequantization scratch is for ", max_weight_elems_);
    } else {
        SHARDLM_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
                      "CublasGemm: weights must be f32/f16/bf16/i8/i4, not ", dtype_name(w.dtype));
    }
    if (T == 0 || rows == 0) return;
    SHARDLM_CHECK((x || half_x) && y && (w.data || cols == 0), "CublasGemm: null pointer");
    const bool prepared = x == nullptr;  // the producer wrote input_for(w)
    if (cols == 0) {  // an empty sum; cuBLAS may return early without writing C when k == 0
        CUDA_CHECK(cudaMemsetAsync(y, 0, size_t(T * rows) * sizeof(float), stream_));
        if (bias) add_bias(y, bias, T, rows, stream_);
        return;
    }

    const int m = int(rows), n = int(T), k = int(cols);
    const int ic = w.interleaved ? interleave_chunk_cols(w.dtype) : 0;
    SHARDLM_CHECK(!w.interleaved || (ic > 0 && cols % interleave_block_cols(ic) == 0), "CublasGemm: interleaved ", dtype_name(w.dtype),
                  " weights of ", cols, " columns");
    const float one = 1.0f, zero = 0.0f;
    const void* a = w.data;
    cudaDataType_t ab_type = CUDA_R_16F;
    switch (w.dtype) {
        case DType::F32:
            CUBLAS_CHECK(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, static_cast<const float*>(a), k,
                                     x, k, &zero, y, m));
            break;
        case DType::F16:
            if (!prepared) convert_x<__half>(x, x_half_, T * cols, cols, ic, stream_);
            break;
        case DType::BF16:
            if (!prepared) convert_x<__nv_bfloat16>(x, x_half_, T * cols, cols, ic, stream_);
            ab_type = CUDA_R_16BF;
            break;
        case DType::I8:
        case DType::I4: {
            // x goes into the weights' column order (the dequantization keeps it).
            if (!prepared) convert_x<__half>(x, x_half_, T * cols, cols, ic, stream_);
            const bool events = side_ && !capturing(stream_);
            for (Slot& s : slots_) {
                if (s.owner != w.data) continue;
                // Staged: the whole matrix is in s.buf once the side stream gets there.
                SHARDLM_CHECK(events, "CublasGemm: a staged matrix was not run before a graph capture");
                CUDA_CHECK(cudaStreamWaitEvent(stream_, s.ready, 0));
                CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, s.buf, CUDA_R_16F, k,
                                          x_half_, CUDA_R_16F, k, &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
                if (events) CUDA_CHECK(cudaEventRecord(s.done, stream_));
                s.owner = nullptr;
                if (bias) add_bias(y, bias, T, rows, stream_);
                return;
            }
            // Not staged: blocks of rows small enough for slot 0, dequantized on the main stream,
            // then their slice of y (rows r0.. of the column-major C, leading dimension `rows`).
            Slot& s = slots_[0];
            if (s.owner) {  // a staged matrix nobody ran: let its dequantization finish, then drop it
                SHARDLM_CHECK(events || !side_, "CublasGemm: a staged matrix was not run before a graph capture");
                CUDA_CHECK(cudaStreamWaitEvent(stream_, s.ready, 0));
                s.owner = nullptr;
            }
            const int64_t block = std::min<int64_t>(rows, max_weight_elems_ / cols);
            for (int64_t r0 = 0; r0 < rows; r0 += block) {
                const int64_t nr = std::min(block, rows - r0);
                dequant_rows(w, r0, nr, static_cast<__half*>(s.buf), stream_);
                CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, int(nr), n, k, &one, s.buf, CUDA_R_16F, k,
                                          x_half_, CUDA_R_16F, k, &zero, y + r0, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
            }
            if (events) CUDA_CHECK(cudaEventRecord(s.done, stream_));
            else s.graph = side_ != nullptr;
            if (bias) add_bias(y, bias, T, rows, stream_);
            return;
        }
        default:
            break;
    }
    if (half_x)
        CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, a, ab_type, k, x_half_, ab_type, k,
                                  &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias) add_bias(y, bias, T, rows, stream_);
}

HalfInput CublasGemm::input_for(const DeviceMatrix& w) const {
    HalfInput h;
    if (w.dtype == DType::F32 || !x_half_) return h;
    h.data = x_half_;
    h.type = w.dtype == DType::BF16 ? DType::BF16 : DType::F16;
    h.interleave_c = w.interleaved ? interleave_chunk_cols(w.dtype) : 0;
    return h;
}

}  // namespace shardlm
