// Device-code shim of the CPU CUDA emulator, force-included (-include) into kernels/cuda/*.cu when
// CMake compiles them as C++ (SHARDLM_CUDA_EMU=ON). The real CUDA headers give the types and the
// host API's declarations; this file gives what only nvcc's device side has: __shared__ storage,
// threadIdx & co., the collectives and the intrinsics the kernels use, all on the CPU.
//
// Values follow CUDA's definitions (IEEE float ops, round-to-nearest-even conversions, __dp4a's
// signed bytes, shuffle widths); precise math (expf, sincosf) is glibc's, within CUDA's ulp bounds.
#pragma once

#ifndef SHARDLM_CUDA_EMU
#error "cuda_emu.h is for the emulator build (SHARDLM_CUDA_EMU)"
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "tests/cuda_emu/emu.h"

// ---- Qualifiers. Under g++, crt/host_defines.h already makes __global__, __device__ and __host__
// empty. Blocks run one after another, so one static copy per variable is each block's shared
// memory (not reset between blocks: a block that reads shared memory before writing it sees the
// previous block's values, not zeros).
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

// ---- Built-in variables of the running thread: read-only views of what the scheduler sets
// before switching to a thread (one thread runs at a time). Variables, not macros, so that
// cudaLaunchConfig_t's members of the same names stay untouched.
extern const uint3& threadIdx;
extern const uint3& blockIdx;
extern const dim3& blockDim;
extern const dim3& gridDim;

namespace shardlm_emu {

template <typename T>
uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "a warp collective moves up to 8 bytes");
    uint64_t b = 0;
    std::memcpy(&b, &v, sizeof(T));
    return b;
}

template <typename T>
T from_bits(uint64_t b) {
    T v;
    std::memcpy(&v, &b, sizeof(T));
    return v;
}

}  // namespace shardlm_emu

// ---- Collectives. Each blocks the calling fiber until its participants have all arrived
// (scheduler.cpp checks that they are the same collective, with the same mask).
inline void __syncthreads(shardlm_emu::Site site = SHARDLM_EMU_HERE) { shardlm_emu::sync_threads(site); }

inline void __syncwarp(unsigned mask = 0xffffffffu, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    shardlm_emu::warp_collective(shardlm_emu::Op::SyncWarp, mask, 0, 0, 32, site);
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return shardlm_emu::from_bits<T>(shardlm_emu::warp_collective(shardlm_emu::Op::ShflIdx, mask,
                                                                  shardlm_emu::to_bits(var), src_lane, width, site));
}

template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return shardlm_emu::from_bits<T>(shardlm_emu::warp_collective(shardlm_emu::Op::ShflUp, mask,
                                                                  shardlm_emu::to_bits(var), int(delta), width, site));
}

template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return shardlm_emu::from_bits<T>(shardlm_emu::warp_collective(shardlm_emu::Op::ShflDown, mask,
                                                                  shardlm_emu::to_bits(var), int(delta), width, site));
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return shardlm_emu::from_bits<T>(shardlm_emu::warp_collective(shardlm_emu::Op::ShflXor, mask,
                                                                  shardlm_emu::to_bits(var), lane_mask, width, site));
}

inline unsigned __ballot_sync(unsigned mask, int pred, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return unsigned(shardlm_emu::warp_collective(shardlm_emu::Op::Ballot, mask, pred != 0, 0, 32, site));
}

inline int __any_sync(unsigned mask, int pred, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return int(shardlm_emu::warp_collective(shardlm_emu::Op::Any, mask, pred != 0, 0, 32, site));
}

inline int __all_sync(unsigned mask, int pred, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    return int(shardlm_emu::warp_collective(shardlm_emu::Op::All, mask, pred != 0, 0, 32, site));
}

template <typename T>
unsigned __match_any_sync(unsigned mask, T value, shardlm_emu::Site site = SHARDLM_EMU_HERE) {
    static_assert(std::is_integral_v<T> || std::is_floating_point_v<T>, "__match_any_sync of a scalar");
    return unsigned(shardlm_emu::warp_collective(shardlm_emu::Op::MatchAny, mask, shardlm_emu::to_bits(value),
                                                 int(sizeof(T)), 32, site));
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, for kernels/cuda/mma.h (which runs the
// instruction where the device has it): one warp-wide call that reads every lane's fragments by the
// PTX ISA's layout (g = lane / 4, t = lane % 4: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
// a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
// d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1]) and adds each lane's products to its
// d. Products of FP16 values are exact in FP32; each sum runs in k order before it joins d.
namespace shardlm_emu {

struct MmaF16Lane : WarpCall {
    const uint32_t* a;
    const uint32_t* b;
    float* d;
};

inline void mma_f16_complete(WarpCall* const* lanes) {
    float A[16][16], B[16][8];
    auto halves = [](uint32_t w, float& lo, float& hi) {
        lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
        hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
    };
    for (int l = 0; l < 32; ++l) {
        const MmaF16Lane& m = *static_cast<const MmaF16Lane*>(lanes[l]);
        const int g = l >> 2, t = l & 3;
        halves(m.a[0], A[g][2 * t], A[g][2 * t + 1]);
        halves(m.a[1], A[g + 8][2 * t], A[g + 8][2 * t + 1]);
        halves(m.a[2], A[g][2 * t + 8], A[g][2 * t + 9]);
        halves(m.a[3], A[g + 8][2 * t + 8], A[g + 8][2 * t + 9]);
        halves(m.b[0], B[2 * t][g], B[2 * t + 1][g]);
        halves(m.b[1], B[2 * t + 8][g], B[2 * t + 9][g]);
    }
    for (int l = 0; l < 32; ++l) {
        const MmaF16Lane& m = *static_cast<const MmaF16Lane*>(lanes[l]);
        const int g = l >> 2, t = l & 3;
        for (int e = 0; e < 4; ++e) {
            const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
            float s = 0.0f;
            for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
            m.d[e] += s;
        }
    }
}

inline void mma_m16n8k16_f16_f32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                 Site site = SHARDLM_EMU_HERE) {
    MmaF16Lane me;
    me.fn = &mma_f16_complete;
    me.a = a;
    me.b = b;
    me.d = d;
    warp_call(&me, 0xffffffffu, site);  // .aligned: the whole warp, every lane at the same instruction
}

}  // namespace shardlm_emu

// Fibers only switch at collectives, so plain read-modify-writes are atomic and every write is
// visible to the next reader: fences have nothing to order.
inline void __threadfence() {}
inline void __threadfence_block() {}

// One read-modify-write, the old value returned, as every atomic does.
template <typename T, typename F>
T atomic_rmw(T* p, F f) {
    const T old = *p;
    *p = f(old);
    return old;
}
template <typename T>
T atomicAdd(T* p, T v) { return atomic_rmw(p, [v](T o) { return o + v; }); }
template <typename T>
T atomicSub(T* p, T v) { return atomic_rmw(p, [v](T o) { return o - v; }); }
template <typename T>
T atomicMax(T* p, T v) { return atomic_rmw(p, [v](T o) { return o < v ? v : o; }); }
template <typename T>
T atomicMin(T* p, T v) { return atomic_rmw(p, [v](T o) { return v < o ? v : o; }); }
template <typename T>
T atomicOr(T* p, T v) { return atomic_rmw(p, [v](T o) { return o | v; }); }
template <typename T>
T atomicAnd(T* p, T v) { return atomic_rmw(p, [v](T o) { return o & v; }); }
template <typename T>
T atomicExch(T* p, T v) { return atomic_rmw(p, [v](T) { return v; }); }
template <typename T>
T atomicCAS(T* p, T compare, T v) { return atomic_rmw(p, [compare, v](T o) { return o == compare ? v : o; }); }

// ---- Loads. __ldg is an ordinary load; like the device's vector loads it must be aligned to
// its type (a float4 or uint4 at a 16-byte boundary), which x86 would not check.
template <typename T>
T __ldg(const T* p) {
    if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0)
        shardlm_emu::device_fault("__ldg of %zu bytes from %p: misaligned address (needs %zu-byte alignment)",
                                  sizeof(T), static_cast<const void*>(p), alignof(T));
    return *p;
}

// ---- Integer and bit intrinsics.
inline float __uint_as_float(unsigned u) { return shardlm_emu::from_bits<float>(u); }
inline unsigned __float_as_uint(float f) { return unsigned(shardlm_emu::to_bits(f)); }
inline float __int_as_float(int i) { return shardlm_emu::from_bits<float>(uint32_t(i)); }
inline int __float_as_int(float f) { return int(uint32_t(shardlm_emu::to_bits(f))); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

// Byte i of the result is byte (s >> 4i) & 7 of the 8 bytes {y:x} (x the low four).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t b = (uint64_t(y) << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= unsigned((b >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
    return r;
}

// c + the dot product of the four signed (unsigned) bytes of a and b.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += int(int8_t(uint32_t(a) >> (8 * i))) * int(int8_t(uint32_t(b) >> (8 * i)));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}

// ---- Float intrinsics: IEEE round-to-nearest operations. The C++ here is compiled without
// contraction (-ffp-contract=off), so a * b + c is never fused, as __fmul_rn promises.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __expf(float a) { return std::exp(a); }
inline float __logf(float a) { return std::log(a); }
inline float __saturatef(float a) { return a != a ? 0.0f : a < 0.0f ? 0.0f : a > 1.0f ? 1.0f : a; }
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }

// cvt.rni.s32.f32: nearest even, saturating, NaN -> 0.
inline int __float2int_rn(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return INT_MAX;
    if (x <= -2147483648.0f) return INT_MIN;
    return int(std::nearbyint(x));
}
inline int __float2int_rz(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return INT_MAX;
    if (x <= -2147483648.0f) return INT_MIN;
    return int(x);
}

// ---- min/max for any two arithmetic types (CUDA overloads them for every pairing; the result is
// the usual arithmetic conversion, fminf/fmaxf for floats).
template <typename A, typename B, typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> min(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return std::fmin(C(a), C(b));
    else return C(b) < C(a) ? C(b) : C(a);
}
template <typename A, typename B, typename = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
std::common_type_t<A, B> max(A a, B b) {
    using C = std::common_type_t<A, B>;
    if constexpr (std::is_floating_point_v<C>) return std::fmax(C(a), C(b));
    else return C(a) < C(b) ? C(b) : C(a);
}

// ---- Host API that cuda_runtime.h offers in C++ only to nvcc: the typed cudaFuncSetAttribute and
// occupancy query.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
    return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}
template <typename T>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, T* func, int block_size,
                                                          size_t dynamic_smem) {
    return ::cudaOccupancyMaxActiveBlocksPerMultiprocessor(num_blocks, reinterpret_cast<const void*>(func),
                                                           block_size, dynamic_smem);
}
