// The cuBLAS subset the project calls, as plain loops on the host: handles, streams, workspaces,
// math modes, and the GEMMs of kernels/cuda/gemm.cu and w8a8.cu (cublasSgemm; cublasGemmEx with
// F32, F16 or BF16 inputs into F32, and INT8 inputs into INT32).
//
// Column-major as cuBLAS: C[m, n] = alpha op(A)[m, k] op(B)[k, n] + beta C, op = N or T, C not
// read when beta is 0. F32 products accumulate in f32 (f16 and bf16 inputs are exact in f32;
// CUBLAS_TF32_TENSOR_OP_MATH rounds F32 inputs to TF32 first, as the tensor cores would), INT8
// products in INT32. The GEMM runs on the handle's stream: at the call, or recorded into the
// graph while that stream is captured, reading A, B and C at the replay.
//
// What cuBLAS requires and would refuse, this refuses too: leading dimensions below the rows,
// unsupported type combinations, and for INT8 (CUDA_R_8I in, CUDA_R_32I out) A and B pointers
// and lda, ldb that are not multiples of 4. Matrices outside device memory are a fault, as the
// GPU would fault reading them.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/cuda_emu/emu.h"
#include "tests/cuda_emu/emu_internal.h"

struct cublasContext {
    cudaStream_t stream = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace {

size_t type_bytes(cudaDataType t) {
    switch (t) {
        case CUDA_R_32F: case CUDA_R_32I: return 4;
        case CUDA_R_16F: case CUDA_R_16BF: return 2;
        case CUDA_R_8I: return 1;
        default: return 0;
    }
}

// Round-to-nearest-even to the 10-bit mantissa of TF32.
float to_tf32(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    std::memcpy(&x, &u, 4);
    return x;
}

float load_f(const void* p, cudaDataType t, size_t i) {
    switch (t) {
        case CUDA_R_32F: return static_cast<const float*>(p)[i];
        case CUDA_R_16F: return __half2float(static_cast<const __half*>(p)[i]);
        default: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    }
}

// op(X) of a [rows, cols] operand (column-major, ld) as rows of `inner` contiguous values: row r
// of the result is op(X)[r, 0..inner) for A (r < m, inner = k), column r of op(B) for B.
template <typename T, typename Load>
std::vector<T> gather(bool transposed_storage, int count, int inner, int ld, Load load) {
    std::vector<T> out(size_t(count) * size_t(inner));
#pragma omp parallel for schedule(static)
    for (int r = 0; r < count; ++r)
        for (int p = 0; p < inner; ++p)
            out[size_t(r) * inner + p] = load(transposed_storage ? size_t(r) * ld + p : size_t(p) * ld + r);
    return out;
}

// The extent of a column-major [rows, cols] matrix with leading dimension ld, in elements.
size_t extent(int rows, int cols, int ld) { return rows == 0 || cols == 0 ? 0 : size_t(cols - 1) * ld + rows; }

void check_device(const void* p, size_t bytes, const char* what) {
    if (bytes && !shardlm_emu::is_device_range(p, bytes))
        shardlm_emu::device_fault("cuBLAS reads %s: %zu bytes at %p are not inside one device allocation", what,
                                  bytes, p);
}

struct Gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    const void* A;
    cudaDataType at;
    int lda;
    const void* B;
    cudaDataType bt;
    int ldb;
    void* C;
    cudaDataType ct;
    int ldc;
    double alpha, beta;  // exact for the f32 and int32 scalars used
    bool tf32;
};

void run_gemm(const Gemm& g) {
    // A is stored [k, m] when transposed (op T), [m, k] otherwise; B [n, k] when T, [k, n] otherwise.
    const bool at = g.ta != CUBLAS_OP_N, bt = g.tb != CUBLAS_OP_N;
    check_device(g.A, extent(at ? g.k : g.m, at ? g.m : g.k, g.lda) * type_bytes(g.at), "A");
    check_device(g.B, extent(bt ? g.n : g.k, bt ? g.k : g.n, g.ldb) * type_bytes(g.bt), "B");
    check_device(g.C, extent(g.m, g.n, g.ldc) * type_bytes(g.ct), "C");
    if (g.ct == CUDA_R_32I) {
        const auto a = gather<int32_t>(at, g.m, g.k, g.lda, [&](size_t i) { return int32_t(static_cast<const int8_t*>(g.A)[i]); });
        const auto b = gather<int32_t>(!bt, g.n, g.k, g.ldb, [&](size_t i) { return int32_t(static_cast<const int8_t*>(g.B)[i]); });
        int32_t* c = static_cast<int32_t*>(g.C);
        const int32_t alpha = int32_t(g.alpha), beta = int32_t(g.beta);
#pragma omp parallel for schedule(static)
        for (int j = 0; j < g.n; ++j)
            for (int i = 0; i < g.m; ++i) {
                const int32_t* ar = &a[size_t(i) * g.k];
                const int32_t* br = &b[size_t(j) * g.k];
                uint32_t s = 0;  // wraps like the hardware's INT32 adds
                for (int p = 0; p < g.k; ++p) s += uint32_t(ar[p] * br[p]);
                int32_t& out = c[size_t(j) * g.ldc + i];
                out = int32_t(uint32_t(alpha) * s + (beta ? uint32_t(beta) * uint32_t(out) : 0u));
            }
        return;
    }
    auto la = [&](size_t i) { const float v = load_f(g.A, g.at, i); return g.tf32 ? to_tf32(v) : v; };
    auto lb = [&](size_t i) { const float v = load_f(g.B, g.bt, i); return g.tf32 ? to_tf32(v) : v; };
    const auto a = gather<float>(at, g.m, g.k, g.lda, la);
    const auto b = gather<float>(!bt, g.n, g.k, g.ldb, lb);
    float* c = static_cast<float*>(g.C);
    const float alpha = float(g.alpha), beta = float(g.beta);
#pragma omp parallel for schedule(static)
    for (int j = 0; j < g.n; ++j)
        for (int i = 0; i < g.m; ++i) {
            const float* ar = &a[size_t(i) * g.k];
            const float* br = &b[size_t(j) * g.k];
            float s = 0.0f;
            for (int p = 0; p < g.k; ++p) s = std::fma(ar[p], br[p], s);
            float& out = c[size_t(j) * g.ldc + i];
            out = beta == 0.0f ? alpha * s : alpha * s + beta * out;
        }
}

cublasStatus_t submit(cublasHandle_t h, Gemm g) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (g.m < 0 || g.n < 0 || g.k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const bool at = g.ta != CUBLAS_OP_N, bt = g.tb != CUBLAS_OP_N;
    if (g.lda < std::max(1, at ? g.k : g.m) || g.ldb < std::max(1, bt ? g.n : g.k) || g.ldc < std::max(1, g.m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (g.m == 0 || g.n == 0) return CUBLAS_STATUS_SUCCESS;
    const cudaError_t e = shardlm_emu::enqueue(h->stream, [g] { run_gemm(g); });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* h) {
    shardlm_emu::announce();
    *h = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

// As in cuBLAS, setting the stream drops a user workspace (the handle goes back to its own pool).
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    h->workspace = nullptr;
    h->workspace_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void* workspace, size_t bytes) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !shardlm_emu::is_device_range(workspace, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0) return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = workspace;
    h->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE (shardlm CUDA emulator)";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED (shardlm CUDA emulator)";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED (shardlm CUDA emulator)";
        default: return "CUBLAS_STATUS_UNKNOWN (shardlm CUDA emulator)";
    }
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    return submit(h, Gemm{ta, tb, m, n, k, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, C, CUDA_R_32F, ldc, *alpha, *beta,
                          (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH});
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* A, cudaDataType at, int lda, const void* B,
                            cudaDataType bt, int ldb, const void* beta, void* C, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    const bool float_in = (at == CUDA_R_32F || at == CUDA_R_16F || at == CUDA_R_16BF) && bt == at;
    if (float_in && ct == CUDA_R_32F &&
        (compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_PEDANTIC ||
         compute == CUBLAS_COMPUTE_32F_FAST_TF32)) {
        const bool tf32 = at == CUDA_R_32F && (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
                                               (compute == CUBLAS_COMPUTE_32F && (h->math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH));
        return submit(h, Gemm{ta, tb, m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc, *static_cast<const float*>(alpha),
                              *static_cast<const float*>(beta), tf32});
    }
    if (at == CUDA_R_8I && bt == CUDA_R_8I && ct == CUDA_R_32I &&
        (compute == CUBLAS_COMPUTE_32I || compute == CUBLAS_COMPUTE_32I_PEDANTIC)) {
        if (reinterpret_cast<uintptr_t>(A) % 4 || reinterpret_cast<uintptr_t>(B) % 4 || lda % 4 || ldb % 4)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        return submit(h, Gemm{ta, tb, m, n, k, A, at, lda, B, bt, ldb, C, ct, ldc, double(*static_cast<const int32_t*>(alpha)),
                              double(*static_cast<const int32_t*>(beta)), false});
    }
    std::fprintf(stderr, "shardlm CUDA emulator: cublasGemmEx with types A %d, B %d, C %d, compute %d is not emulated\n",
                 int(at), int(bt), int(ct), int(compute));
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

