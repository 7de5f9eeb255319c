// Top-k of logits rows (kernels/cuda/topk.h) in two launches:
//
//   1. topk_segments_kernel: the row is cut into segments of seg_len elements, one block each (a
//      152k vocabulary is 38 blocks per row, enough to spread one row over the SMs). Each block
//      keeps its segment's first min(k, len) elements in the ranking, in index order, in scratch.
//   2. topk_merge_kernel: one block per row selects the row's first k among those candidates (the
//      global first k are among them: an element with fewer than k elements of the row ranked
//      before it has fewer than k of its own segment before it), sorts them and writes them out.
//      A row that fits one segment skips stage 1: stage 2 reads it directly.
//
// Both select the same way. Each float maps to an order key, a uint32 whose unsigned order is the
// ranking's value order (ties aside): positives get the sign bit set, negatives all bits flipped,
// -0.0 is read as +0.0, and every NaN maps to 0, below -inf (0x007fffff). A radix select over the
// keys, one 8-bit digit per pass from the top (256-bin histogram in shared memory), finds the key T
// of the k-th element and how many elements equal to T are taken (rem): all elements with key > T,
// and of those == T the rem with the lowest indices. An ordered compaction then writes the
// chosen ones in index order, so candidate lists stay sorted by index for stage 2's own tie-break.
// Counting with integer atomics and scanning in a fixed order make every result deterministic.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "core/error.h"
#include "kernels/cuda/align.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/topk.h"

namespace shardlm {
namespace {

// Launch bounds name the blocks per SM each kernel is built for: without them ptxas capped the
// 1024-thread kernel at 32 registers and spilled (CUDA 13, sm_90).
constexpr int kSegmentThreads = 512;  // stage 1: 4096..16384 elements, 8..32 per thread; 2 blocks per SM
constexpr int kMergeThreads = 1024;   // stage 2: one block per row, as wide as a block goes
constexpr int kUnroll = 8;            // loads in flight per thread in a histogram pass
constexpr unsigned kFull = 0xffffffffu;
static_assert(kTopKMax <= 1024, "stage 2 sorts the winners with one pair per thread of a 1024-thread block");

// Launch plan, a function of (n, k) only. Segments grow with k so stage 2's candidate list (segs
// x k) stays at most about n / 16 (9.7k..10.2k for a 152k row), while small k keep 4096-element
// segments (more blocks per row) and a short list.
struct Plan {
    int64_t seg_len = 0;  // elements per segment
    int64_t segs = 0;     // segments per row; 1: no stage 1
    int64_t per_seg = 0;  // candidates of a full segment: min(k, seg_len)
    int64_t cands = 0;    // candidates per row in scratch (0 when segs == 1)
};

Plan make_plan(int64_t n, int64_t k) {
    Plan p;
    p.seg_len = k <= 256 ? 4096 : k <= 512 ? 8192 : 16384;
    p.segs = (n + p.seg_len - 1) / p.seg_len;
    p.per_seg = std::min(k, p.seg_len);
    if (p.segs > 1) p.cands = (p.segs - 1) * p.per_seg + std::min(k, n - (p.segs - 1) * p.seg_len);
    return p;
}

// The ranking's value order as an unsigned order (see the top of the file).
__device__ __forceinline__ uint32_t order_key(float v) {
    uint32_t u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0;  // NaN, whatever its sign and payload
    if (u == 0x80000000u) u = 0;                     // -0.0 ties with +0.0
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SelectShared {
    unsigned hist[256];
    unsigned digit, above, in_bin;  // the chosen bin, the count above it, the count in it
    unsigned warp_gt[32], warp_eq[32];
};

// Selects the first min(k, count) of elements 0..count-1 of src (src.key(i): order key; src.id(i):
// index in the row, increasing with i) and calls emit(pos, key, id) for each, pos = its rank by
// index among the chosen ones (0..min(k, count)-1). All threads of the block must call it.
template <int kThreads, class Src, class Emit>
__device__ void block_select(const Src& src, int count, int k, SelectShared& sh, const Emit& emit) {
    constexpr int kWarps = kThreads / 32;
    static_assert(kThreads % 32 == 0 && kWarps <= 32 && kThreads >= 256, "one bin per thread when zeroing");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // Chosen: key > thresh, and the first take_eq (by index) with key == thresh. With count <= k
    // that is everything (every key >= 0).
    uint32_t thresh = 0;
    unsigned take_eq = unsigned(k);
    if (count > k) {
        // Invariant: rem >= 1 elements are still to be chosen among those whose key matches
        // `prefix` on the bits of `mask`, and there are at least rem of those.
        uint32_t prefix = 0, mask = 0;
        unsigned rem = unsigned(k);
        for (int shift = 24; shift >= 0; shift -= 8) {
            if (tid < 256) sh.hist[tid] = 0;  // the previous pass's readers are past its last barrier
            __syncthreads();
            for (int base = 0; base < count; base += kUnroll * kThreads) {
                uint32_t key[kUnroll];
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {  // all loads first: kUnroll of them in flight
                    const int i = base + u * kThreads + tid;
                    key[u] = i < count ? src.key(i) : 0;
                }
                // Warp-aggregated counts: logits bunch into a few bins (the first pass sees little
                // more than sign and exponent), and 32 lanes adding 1 to one shared word serialise;
                // one add of the group's size per distinct bin does not. `base` and `u` are
                // uniform over the block, so every lane takes part in the match.
#pragma unroll
                for (int u = 0; u < kUnroll; ++u) {
                    const int i = base + u * kThreads + tid;
                    const bool take = i < count && (key[u] & mask) == prefix;
                    const unsigned bin = take ? (key[u] >> shift) & 0xffu : 0x100u;
                    const unsigned peers = __match_any_sync(kFull, bin);
                    if (take && __ffs(peers) - 1 == lane) atomicAdd(&sh.hist[bin], unsigned(__popc(peers)));
                }
            }
            __syncthreads();
            if (warp == 0) {
                // Bins from the top: lane l holds bins 255-8l .. 248-8l. A scan over the lanes
                // gives the count above each bin; the bin where that count first reaches rem holds
                // the rem-th element. Exactly one (lane, j) sees above < rem <= above + bin.
                unsigned h[8], sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) sum += (h[j] = sh.hist[255 - (lane * 8 + j)]);
                unsigned incl = sum;
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const unsigned t = __shfl_up_sync(kFull, incl, off);
                    if (lane >= off) incl += t;
                }
                unsigned above = incl - sum;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    if (above < rem && above + h[j] >= rem) {
                        sh.digit = unsigned(255 - (lane * 8 + j));
                        sh.above = above;
                        sh.in_bin = h[j];
                    }
                    above += h[j];
                }
            }
            __syncthreads();
            // The same values in every thread, so the break below is uniform over the block.
            prefix |= sh.digit << shift;
            mask |= 0xffu << shift;
            rem -= sh.above;
            thresh = prefix;
            take_eq = rem;
            if (sh.in_bin == rem) {
                // Everything in the bin is chosen: exactly k elements have key >= prefix (its low
                // bits are 0 here), so take them all and skip the remaining passes.
                take_eq = unsigned(k);
                break;
            }
        }
    }

    // Ordered compaction. Warp w owns the contiguous range [begin, end); a first walk counts its
    // > and == elements, a scan of those counts over the warps gives each warp's start, and a
    // second walk places each chosen element at (> before it) + min(== before it, take_eq).
    const int chunk = ((count + kWarps - 1) / kWarps + 31) & ~31;
    const int begin = min(count, warp * chunk), end = min(count, begin + chunk);
    unsigned n_gt = 0, n_eq = 0;
#pragma unroll 4
    for (int b = begin; b < end; b += 32) {  // b is the same in the whole warp: full-mask ballots
        const int i = b + lane;
        const bool in = i < end;
        const uint32_t key = in ? src.key(i) : 0;
        n_gt += __popc(__ballot_sync(kFull, in && key > thresh));
        n_eq += __popc(__ballot_sync(kFull, in && key == thresh));
    }
    if (lane == 0) {
        sh.warp_gt[warp] = n_gt;
        sh.warp_eq[warp] = n_eq;
    }
    __syncthreads();
    unsigned gt = 0, eq = 0;  // before this warp's range
    for (int w = 0; w < warp; ++w) {
        gt += sh.warp_gt[w];
        eq += sh.warp_eq[w];
    }
    const unsigned below = (1u << lane) - 1u;  // lanes before this one
#pragma unroll 4
    for (int b = begin; b < end; b += 32) {
        const int i = b + lane;
        const bool in = i < end;
        const uint32_t key = in ? src.key(i) : 0;
        const unsigned bgt = __ballot_sync(kFull, in && key > thresh);
        const unsigned beq = __ballot_sync(kFull, in && key == thresh);
        const unsigned my_gt = gt + __popc(bgt & below), my_eq = eq + __popc(beq & below);
        if (in && (key > thresh || (key == thresh && my_eq < take_eq))) emit(int(my_gt + min(my_eq, take_eq)), key, src.id(i));
        gt += __popc(bgt);
        eq += __popc(beq);
    }
}

struct RowSource {  // elements straight from a row of x
    const float* row;
    int first;  // index of element 0 in the row
    __device__ uint32_t key(int i) const { return order_key(__ldg(row + i)); }
    __device__ int id(int i) const { return first + i; }
};

struct CandidateSource {  // stage 1's candidates of a row
    const uint32_t* keys;
    const int32_t* ids;
    __device__ uint32_t key(int i) const { return __ldg(keys + i); }
    __device__ int id(int i) const { return __ldg(ids + i); }
};

__global__ void __launch_bounds__(kSegmentThreads, 2)
    topk_segments_kernel(const float* __restrict__ x, int n, int seg_len, int segs, int k, int per_seg, int cands,
                         uint32_t* __restrict__ cand_keys, int32_t* __restrict__ cand_ids) {
    __shared__ SelectShared sh;
    const int row = int(blockIdx.x) / segs, seg = int(blockIdx.x) % segs;
    const int first = seg * seg_len, count = min(seg_len, n - first);
    const RowSource src{x + int64_t(row) * n + first, first};
    // Segment s's candidates start at s * per_seg: every segment but the last has per_seg.
    const int64_t out = int64_t(row) * cands + int64_t(seg) * per_seg;
    uint32_t* keys = cand_keys + out;
    int32_t* ids = cand_ids + out;
    block_select<kSegmentThreads>(src, count, k, sh, [&](int pos, uint32_t key, int id) {
        keys[pos] = key;
        ids[pos] = id;
    });
}

// kFromRow: the row is a single segment and is read directly (cand_* unused, count = n).
template <bool kFromRow>
__global__ void __launch_bounds__(kMergeThreads, 1)
    topk_merge_kernel(const float* __restrict__ x, int n, const uint32_t* __restrict__ cand_keys,
                      const int32_t* __restrict__ cand_ids, int cands, int k, int32_t id_offset,
                      float* __restrict__ vals, int32_t* __restrict__ ids) {
    __shared__ SelectShared sh;
    // The winners as (key << 32 | ~id): one descending sort of these is key descending, then id
    // ascending. Real entries are >= 2^31 (~id of an id < 2^31), so 0 pads below all of them.
    __shared__ unsigned long long win[kTopKMax];
    const int row = blockIdx.x;
    const float* xr = x + int64_t(row) * n;
    auto emit = [&](int pos, uint32_t key, int id) {
        win[pos] = (static_cast<unsigned long long>(key) << 32) | static_cast<uint32_t>(~static_cast<uint32_t>(id));
    };
    // count >= k in both cases (k <= n; and every segment keeps min(k, its length)), so exactly k
    // winners land in win[0..k).
    if constexpr (kFromRow)
        block_select<kMergeThreads>(RowSource{xr, 0}, n, k, sh, emit);
    else
        block_select<kMergeThreads>(CandidateSource{cand_keys + int64_t(row) * cands, cand_ids + int64_t(row) * cands},
                                    cands, k, sh, emit);
    int p = 1;
    while (p < k) p <<= 1;
    for (int i = k + int(threadIdx.x); i < p; i += kMergeThreads) win[i] = 0;
    __syncthreads();
    // Bitonic sort of win[0..p), descending: runs of `size` alternate direction (descending where
    // bit `size` of the index is clear) until the last merge, where every index has it clear.
    for (int size = 2; size <= p; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < p / 2; t += kMergeThreads) {
                const int i = 2 * t - (t & (stride - 1)), j = i + stride;  // bit `stride` of i is clear
                const unsigned long long a = win[i], b = win[j];
                if ((a < b) == ((i & size) == 0)) {
                    win[i] = b;
                    win[j] = a;
                }
            }
            __syncthreads();
        }
    }
    for (int i = threadIdx.x; i < k; i += kMergeThreads) {
        const int id = int(~static_cast<uint32_t>(win[i]));
        vals[int64_t(row) * k + i] = xr[id];  // the value itself, not the key: -0.0 and NaN payloads kept
        ids[int64_t(row) * k + i] = id + id_offset;
    }
}

// Index arithmetic in the kernels is int: rows of up to 2^30 elements leave it headroom.
constexpr int64_t kMaxN = int64_t(1) << 30;

}  // namespace

size_t topk_scratch_bytes(int64_t rows, int64_t n, int64_t k) {
    SHARDLM_CHECK(rows >= 0 && n >= 1 && n <= kMaxN && k >= 1 && k <= kTopKMax, "topk_scratch_bytes: ", rows,
                  " rows of ", n, ", k = ", k);
    k = std::min(k, n);
    // The candidate count grows with k within a segment length; take the largest of each length's
    // largest k up to this one, so a smaller k never needs more than this.
    int64_t cands = 0;
    for (const int64_t kk : {std::min<int64_t>(k, 256), std::min<int64_t>(k, 512), k})
        cands = std::max(cands, make_plan(n, kk).cands);
    return size_t(rows) * size_t(cands) * (sizeof(uint32_t) + sizeof(int32_t));
}

void topk_rows_cuda(const float* x, int64_t rows, int64_t n, int64_t k, int32_t id_offset, float* vals,
                    int32_t* ids, void* scratch, cudaStream_t stream) {
    SHARDLM_CHECK(rows >= 0 && rows <= INT_MAX, "topk_rows_cuda: ", rows, " rows do not fit one grid");
    SHARDLM_CHECK(n >= 1 && n <= kMaxN, "topk_rows_cuda: rows of ", n);
    SHARDLM_CHECK(k >= 1 && k <= std::min(n, kTopKMax), "topk_rows_cuda: k = ", k, " for rows of ", n,
                  " (at most ", kTopKMax, ")");
    SHARDLM_CHECK(id_offset >= 0 && int64_t(id_offset) + n <= INT32_MAX, "topk_rows_cuda: ids from ", id_offset,
                  " for rows of ", n, " overflow int32");
    if (rows == 0) return;
    SHARDLM_CHECK(x && vals && ids, "topk_rows_cuda: null x, vals or ids");
    const Plan p = make_plan(n, k);
    if (p.segs == 1) {
        launch_plain("topk_merge_kernel", topk_merge_kernel<true>, dim3(unsigned(rows)), dim3(kMergeThreads), 0,
                     stream, x, int(n), nullptr, nullptr, 0, int(k), id_offset, vals, ids);
        return;
    }
    SHARDLM_CHECK(scratch && is_aligned(scratch, 4), "topk_rows_cuda: scratch of ",
                  topk_scratch_bytes(rows, n, k), " bytes, 4-byte aligned, needed");
    SHARDLM_CHECK(rows * p.segs <= INT_MAX, "topk_rows_cuda: ", rows, " x ", p.segs, " segments do not fit one grid");
    uint32_t* cand_keys = static_cast<uint32_t*>(scratch);
    int32_t* cand_ids = reinterpret_cast<int32_t*>(cand_keys + rows * p.cands);
    launch_plain("topk_segments_kernel", topk_segments_kernel, dim3(unsigned(rows * p.segs)), dim3(kSegmentThreads),
                 0, stream, x, int(n), int(p.seg_len), int(p.segs), int(k), int(p.per_seg), int(p.cands), cand_keys,
                 cand_ids);
    launch_plain("topk_merge_kernel", topk_merge_kernel<false>, dim3(unsigned(rows)), dim3(kMergeThreads), 0, stream,
                 x, int(n), cand_keys, cand_ids, int(p.cands), int(k), id_offset, vals, ids);
}

}  // namespace shardlm
