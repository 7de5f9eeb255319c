// attention_cuda (Flash, FlashFp32 and Naive) against attention_cached over the same cache contents: GQA
// ratios 1..12, head dims 2..256, every cache dtype, prefill chunks over an existing prefix mixed
// with decode chunks, decode-only batches (split-KV), and a CUDA Graph captured once and replayed
// as the sequences grow; decode with the RoPE prologue fused against rope_kv_cuda run first. Every
// cache byte the kernels must not read (rows past a sequence, the row padding, unused scales) and
// the scratch are NaN, so a stray read shows. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rope_kv.h"
#include "runtime/kv_cache.h"

using namespace shardlm;

namespace {

std::vector<float> randv(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 7;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 8) % 2001 - 1000) / 500.0f;
    }
    return v;
}

class DevMem {
public:
    explicit DevMem(size_t bytes, int fill = 0xff) {
        CUDA_CHECK(cudaMalloc(&p_, bytes ? bytes : 1));
        CUDA_CHECK(cudaMemset(p_, fill, bytes ? bytes : 1));
    }
    ~DevMem() { cudaFree(p_); }
    DevMem(const DevMem&) = delete;
    DevMem& operator=(const DevMem&) = delete;
    template <typename T>
    T* as() const { return static_cast<T*>(p_); }

private:
    void* p_ = nullptr;
};

struct Heads {
    int64_t n_heads, n_kv, head_dim, capacity;
    int64_t window = 0;  // sliding window (0: none); a capacity below a slot's length makes a ring
};

// Random keys and values for positions [0, lens[s]) of each slot, in a CPU KVCache and in its
// device copy ([n_slots][n_kv][capacity][row_stride], one CPU block per slot).
struct Cache {
    Cache(const Heads& h, DType dt, const std::vector<int>& lens)
        : heads(h), cpu(KVCacheShape{1, int64_t(lens.size()), h.capacity, h.n_kv, h.head_dim, dt}),
          es(dtype_size(dt)),
          block_bytes(size_t(h.n_kv * h.capacity * cpu.row_stride()) * es),
          dk(block_bytes * lens.size()), dv(block_bytes * lens.size()),
          dks(size_t(h.n_kv * h.capacity) * lens.size() * 4), dvs(size_t(h.n_kv * h.capacity) * lens.size() * 4) {
        for (size_t s = 0; s < lens.size(); ++s)
            for (int p = 0; p < lens[s]; ++p) {
                const auto k = randv(size_t(h.n_kv * h.head_dim), uint32_t(1000 + 7919 * s + 3 * p));
                const auto v = randv(size_t(h.n_kv * h.head_dim), uint32_t(5000 + 7919 * s + 3 * p));
                cpu.write(0, int64_t(s), p, k.data(), v.data());
            }
        const size_t row_bytes = size_t(cpu.row_stride()) * es;
        for (size_t s = 0; s < lens.size(); ++s)
            for (int64_t kh = 0; kh < h.n_kv; ++kh) {
                const size_t head_off = size_t(kh * h.capacity) * row_bytes, dst = s * block_bytes + head_off;
                if (lens[s] == 0) continue;
                const size_t held = size_t(std::min<int64_t>(lens[s], h.capacity));  // a ring holds the newest
                // Only head_dim values per row: the padding stays NaN.
                CUDA_CHECK(cudaMemcpy2D(dk.as<uint8_t>() + dst, row_bytes,
                                        static_cast<uint8_t*>(cpu.k(0, int64_t(s))) + head_off, row_bytes,
                                        size_t(h.head_dim) * es, held, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy2D(dv.as<uint8_t>() + dst, row_bytes,
                                        static_cast<uint8_t*>(cpu.v(0, int64_t(s))) + head_off, row_bytes,
                                        size_t(h.head_dim) * es, held, cudaMemcpyHostToDevice));
                if (dt == DType::I8) {
                    const size_t so = size_t((int64_t(s) * h.n_kv + kh) * h.capacity);
                    CUDA_CHECK(cudaMemcpy(dks.as<float>() + so, cpu.k_scales(0, int64_t(s)) + kh * h.capacity,
                                          held * 4, cudaMemcpyHostToDevice));
                    CUDA_CHECK(cudaMemcpy(dvs.as<float>() + so, cpu.v_scales(0, int64_t(s)) + kh * h.capacity,
                                          held * 4, cudaMemcpyHostToDevice));
                }
            }
        layer.k = dk.as<void>();
        layer.v = dv.as<void>();
        layer.k_scales = dt == DType::I8 ? dks.as<float>() : nullptr;
        layer.v_scales = dt == DType::I8 ? dvs.as<float>() : nullptr;
        layer.dtype = dt;
        layer.n_slots = int64_t(lens.size());
        layer.n_kv_heads = h.n_kv;
        layer.capacity = h.capacity;
        layer.row_stride = cpu.row_stride();
    }

    // attention_cached over each chunk into want (rows outside chunks untouched).
    void expected(const std::vector<float>& q, const std::vector<AttnChunk>& chunks, float scale,
                  std::vector<float>& want) {
        const int64_t width = heads.n_heads * heads.head_dim;
        for (const AttnChunk& c : chunks) {
            if (c.n < 1) continue;
            CachedAttention a;
            a.q = q.data() + c.row0 * width;
            a.out = want.data() + c.row0 * width;
            a.n_q = c.n;
            a.n_heads = heads.n_heads;
            a.n_kv_heads = heads.n_kv;
            a.head_dim = heads.head_dim;
            a.q_pos0 = c.pos0;
            a.window = heads.window;
            a.k = cpu.k(0, c.slot);
            a.v = cpu.v(0, c.slot);
            a.kv_dtype = cpu.shape().dtype;
            a.capacity = heads.capacity;
            a.row_stride = cpu.row_stride();
            a.scale = scale;
            a.k_scales = cpu.k_scales(0, c.slot);
            a.v_scales = cpu.v_scales(0, c.slot);
            attention_cached(a);
        }
    }

    Heads heads;
    KVCache cpu;
    size_t es, block_bytes;
    DevMem dk, dv, dks, dvs;
    DeviceKVLayer layer;
};

struct ChunkSpec {
    int slot, pos0, n;
};

struct Case {
    const char* name;
    Heads heads;
    std::vector<ChunkSpec> chunks;  // one slot per distinct `slot`; a slot's length = max pos0 + n
};

// Lays the chunks out with one unused row before each (it must stay NaN).
std::vector<AttnChunk> layout(const std::vector<ChunkSpec>& specs, int64_t& rows, std::vector<int>& lens) {
    std::vector<AttnChunk> chunks;
    rows = 0;
    for (const ChunkSpec& s : specs) {
        rows += 1;
        chunks.push_back(AttnChunk{s.slot, s.pos0, s.n, int32_t(rows)});
        rows += s.n;
        if (int(lens.size()) <= s.slot) lens.resize(size_t(s.slot + 1), 0);
        lens[size_t(s.slot)] = std::max(lens[size_t(s.slot)], s.pos0 + s.n);
    }
    return chunks;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                  const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i])) {
            ASSERT_TRUE(std::isnan(got[i])) << what << ": wrote outside the chunks at " << i;
            continue;
        }
        ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << " at " << i;
    }
}

AttentionCuda make_args(const Cache& cache, const float* dq, float* dout, const AttnChunk* dchunks,
                        const std::vector<AttnChunk>& chunks, void* scratch, float scale) {
    AttentionCuda a;
    a.q = dq;
    a.out = dout;
    a.chunks = dchunks;
    a.n_chunks = int64_t(chunks.size());
    for (const AttnChunk& c : chunks) a.max_chunk_n = std::max<int64_t>(a.max_chunk_n, c.n);
    a.n_heads = cache.heads.n_heads;
    a.n_kv_heads = cache.heads.n_kv;
    a.head_dim = cache.heads.head_dim;
    a.scale = scale;
    a.window = cache.heads.window;
    a.kv = cache.layer;
    a.scratch = scratch;
    return a;
}

// Flash runs prefill tiles of 16-bit and INT8 caches on tensor cores where the device has them
// (with FP32-accurate split operands, so the same bounds hold); FlashFp32 keeps them on the FP32
// pipes. Both are checked everywhere.
const AttentionKind kKinds[] = {AttentionKind::Flash, AttentionKind::FlashFp32, AttentionKind::Naive};

const char* kind_name(AttentionKind k) {
    return k == AttentionKind::Flash ? " flash" : (k == AttentionKind::FlashFp32 ? " flash-fp32" : " naive");
}

double atol_for(DType dt) { return dt == DType::F32 ? 2e-5 : 4e-5; }

void run_case(const Case& c, DType dt) {
    const Heads& h = c.heads;
    int64_t rows = 0;
    std::vector<int> lens;
    const std::vector<AttnChunk> chunks = layout(c.chunks, rows, lens);
    Cache cache(h, dt, lens);
    const int64_t width = h.n_heads * h.head_dim;
    const auto q = randv(size_t(rows * width), 77);
    const float scale = 1.0f / std::sqrt(float(h.head_dim));
    std::vector<float> want(q.size(), NAN), got(q.size());
    cache.expected(q, chunks, scale, want);

    DevMem dq(q.size() * 4), dout(q.size() * 4), dchunks(chunks.size() * sizeof(AttnChunk));
    DevMem scratch(attention_scratch_bytes(int64_t(chunks.size()), h.n_heads, h.head_dim, h.capacity));
    CUDA_CHECK(cudaMemcpy(dq.as<float>(), q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dchunks.as<AttnChunk>(), chunks.data(), chunks.size() * sizeof(AttnChunk),
                          cudaMemcpyHostToDevice));
    const AttentionCuda a =
        make_args(cache, dq.as<float>(), dout.as<float>(), dchunks.as<AttnChunk>(), chunks, scratch.as<void>(), scale);
    for (AttentionKind kind : kKinds) {
        CUDA_CHECK(cudaMemset(dout.as<float>(), 0xff, q.size() * 4));
        attention_cuda(a, kind, nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(got.data(), dout.as<float>(), q.size() * 4, cudaMemcpyDeviceToHost));
        expect_close(got, want, atol_for(dt), 1e-4,
                     std::string(c.name) + " " + dtype_name(dt) + kind_name(kind));
    }
}

const DType kDtypes[] = {DType::F32, DType::F16, DType::BF16, DType::I8};

bool have_gpu() { return cuda_usable_device_count() > 0; }

}  // namespace

// Chunks of several tokens: the FlashAttention-2 kernel (decode chunks of the same batch ride along).
// One test per cache dtype: on the CPU CUDA emulator the whole took 90 s of one core, so CTest
// runs them side by side.
class AttentionCudaPrefill : public ::testing::TestWithParam<DType> {};

namespace shardlm {
// The dtype's name in test listings (and CTest's names) rather than its byte.
static void PrintTo(DType t, std::ostream* os) { *os << dtype_name(t); }
}  // namespace shardlm

TEST_P(AttentionCudaPrefill, MatchesCached) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {
        {"mha d64", {4, 4, 64, 2048}, {{0, 0, 17}, {1, 128, 1}, {2, 0, 1}, {3, 583, 17}, {4, 1999, 1}}},
        {"gqa4 d32", {8, 2, 32, 640}, {{0, 0, 129}, {1, 16, 1}, {2, 471, 129}}},
        {"gqa4 d80", {12, 3, 80, 1024}, {{0, 0, 600}, {1, 599, 1}, {2, 16, 1}}},
        {"gqa8 d128", {32, 4, 128, 2048}, {{0, 1871, 129}, {1, 0, 17}, {2, 1999, 1}}},
        {"gqa2 d128", {16, 8, 128, 256}, {{0, 0, 2}, {1, 100, 29}}},
        {"gqa3 d64", {6, 2, 64, 256}, {{0, 0, 1}, {1, 128, 1}, {2, 100, 29}}},
        {"gqa12 d64", {24, 2, 64, 256}, {{0, 200, 3}, {1, 0, 17}}},
        {"mqa8 d256", {8, 1, 256, 640}, {{0, 0, 17}, {1, 599, 1}, {2, 500, 100}}},
        {"d2", {2, 1, 2, 64}, {{0, 0, 3}, {1, 10, 5}}},
    };
    for (const Case& c : cases) run_case(c, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AttentionCudaPrefill, ::testing::ValuesIn(kDtypes),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

// One-token chunks only: the split-KV kernel and its merge (and Naive on the same batch).
TEST(AttentionCuda, DecodeMatchesCached) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {
        {"mha d64", {4, 4, 64, 2048}, {{0, 0, 1}, {1, 16, 1}, {2, 128, 1}, {3, 599, 1}, {4, 1999, 1}}},
        {"gqa2 d128", {16, 8, 128, 2048}, {{0, 0, 1}, {1, 16, 1}, {2, 128, 1}, {3, 599, 1}, {4, 1999, 1}}},
        {"gqa4 d32", {8, 2, 32, 600}, {{0, 599, 1}, {1, 0, 1}, {2, 63, 1}, {3, 64, 1}}},
        {"gqa8 d128", {32, 4, 128, 2000}, {{0, 1999, 1}, {1, 599, 1}, {2, 0, 1}, {3, 128, 1}}},
        {"gqa4 d80", {12, 3, 80, 1024}, {{0, 599, 1}, {1, 16, 1}}},
        {"gqa3 d64", {6, 2, 64, 256}, {{0, 255, 1}, {1, 31, 1}}},
        {"gqa12 d64", {24, 2, 64, 256}, {{0, 200, 1}, {1, 16, 1}}},
        {"mqa8 d256", {8, 1, 256, 640}, {{0, 599, 1}, {1, 16, 1}}},
        {"gqa2 d256", {4, 2, 256, 129}, {{0, 128, 1}, {1, 0, 1}}},
        {"d2 cap1", {2, 1, 2, 1}, {{0, 0, 1}}},
    };
    for (const Case& c : cases)
        for (DType dt : kDtypes) run_case(c, dt);
}

// Sliding windows (the query at p sees keys p - window + 1 .. p): prefill tiles whose first key
// starts mid-tile and mid-ring, rows of one tile with different first keys (some see none of a
// tile), decode splits counted from the window's start; over rings of window + chunk - 1 rows that
// have wrapped many times, and over a cache of the whole sequence.
TEST(AttentionCuda, SlidingWindowMatchesCached) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const Case cases[] = {
        {"gqa4 d128 w37 ring", {32, 8, 128, 53, 37}, {{0, 200, 17}, {1, 500, 1}, {2, 30, 5}}},
        {"gqa2 d64 w100 ring decode", {4, 2, 64, 100, 100}, {{0, 599, 1}, {1, 99, 1}, {2, 100, 1}, {3, 5, 1}}},
        {"mha d32 w70", {2, 2, 32, 400, 70}, {{0, 0, 300}, {1, 250, 40}}},
        {"gqa3 d80 w1", {6, 2, 80, 64, 1}, {{0, 90, 17}, {1, 7, 1}}},
        {"gqa12 d64 w130 ring", {24, 2, 64, 258, 130}, {{0, 700, 129}, {1, 1000, 1}}},
    };
    for (const Case& c : cases)
        for (DType dt : kDtypes) run_case(c, dt);
}

// A decode step captured once and replayed while the sequences grow (new chunk positions written
// between replays), with an idle batch entry (n = 0): the grids depend only on the capacity.
TEST(AttentionCuda, GraphReplayFollowsGrowingSequences) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    const Heads h{8, 2, 128, 1024};
    const std::vector<int> lens = {700, 300, 0};
    const int steps = 3;
    for (DType dt : {DType::F16, DType::I8}) {
        Cache cache(h, dt, lens);
        const int64_t width = h.n_heads * h.head_dim, rows = 4;
        const auto q = randv(size_t(rows * width), 99);
        const float scale = 1.0f / std::sqrt(float(h.head_dim));
        std::vector<AttnChunk> chunks = {{0, 0, 1, 0}, {1, 0, 1, 2}, {2, 0, 0, 3}};
        DevMem dq(q.size() * 4), dout(q.size() * 4), dchunks(chunks.size() * sizeof(AttnChunk));
        DevMem scratch(attention_scratch_bytes(int64_t(chunks.size()), h.n_heads, h.head_dim, h.capacity));
        CUDA_CHECK(cudaMemcpy(dq.as<float>(), q.data(), q.size() * 4, cudaMemcpyHostToDevice));
        for (AttentionKind kind : kKinds) {
            cudaStream_t stream;
            CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
            const AttentionCuda a = make_args(cache, dq.as<float>(), dout.as<float>(), dchunks.as<AttnChunk>(), chunks,
                                              scratch.as<void>(), scale);
            CUDA_CHECK(cudaMemcpy(dchunks.as<AttnChunk>(), chunks.data(), chunks.size() * sizeof(AttnChunk),
                                  cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaDeviceSynchronize());  // the copy above lands before `stream` reads it
            attention_cuda(a, kind, stream);  // eager first: any one-time set-up happens outside the capture
            CUDA_CHECK(cudaStreamSynchronize(stream));
            cudaGraph_t graph;
            cudaGraphExec_t exec;
            CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
            attention_cuda(a, kind, stream);
            CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
            CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
            for (int step = 0; step < steps; ++step) {
                chunks[0].pos0 = 63 + 300 * step;  // 64, 364, 664 keys: across split boundaries
                chunks[1].pos0 = 5 + 140 * step;
                CUDA_CHECK(cudaMemcpy(dchunks.as<AttnChunk>(), chunks.data(), chunks.size() * sizeof(AttnChunk),
                                      cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemset(dout.as<float>(), 0xff, q.size() * 4));
                // The copy and the memset run on the legacy stream, which `stream` (non-blocking)
                // does not wait for: finish them before the replay reads the table and writes out.
                CUDA_CHECK(cudaDeviceSynchronize());
                CUDA_CHECK(cudaGraphLaunch(exec, stream));
                CUDA_CHECK(cudaStreamSynchronize(stream));
                std::vector<float> want(q.size(), NAN), got(q.size());
                cache.expected(q, chunks, scale, want);
                CUDA_CHECK(cudaMemcpy(got.data(), dout.as<float>(), q.size() * 4, cudaMemcpyDeviceToHost));
                expect_close(got, want, atol_for(dt), 1e-4,
                             std::string("graph step ") + std::to_string(step) + " " + dtype_name(dt) +
                                 kind_name(kind));
            }
            CUDA_CHECK(cudaGraphExecDestroy(exec));
            CUDA_CHECK(cudaGraphDestroy(graph));
            CUDA_CHECK(cudaStreamDestroy(stream));
        }
    }
}

// The RoPE prologue fused into the decode kernel (AttentionCuda::rope) against rope_kv_cuda run
// first, on identical caches: the same output and the same cache bytes (rows, padding, scales), bit
// for bit, since both run rope_head.h's operations. Raw q, k, v in one fused-QKV buffer or three
// packed ones; with and without q/k norm; GQA groups 1-12 (subgroups: only one block may write a
// row); the newest key at the start, in the middle and at the end of a split, and at the last row
// of the cache; an idle batch entry.
TEST(AttentionCuda, DecodeWithFusedRopeEqualsSeparate) {
    if (!have_gpu()) GTEST_SKIP() << "no usable CUDA device";
    struct FusedCase {
        const char* name;
        Heads heads;
        std::vector<ChunkSpec> chunks;  // n = 1 (or 0: idle); the cache holds positions < pos0
    };
    const FusedCase cases[] = {
        {"gqa2 d128", {16, 8, 128, 640}, {{0, 0, 1}, {1, 31, 1}, {2, 32, 1}, {3, 639, 1}, {4, 300, 0}}},
        {"mha d64", {4, 4, 64, 256}, {{0, 100, 1}, {1, 255, 1}}},
        {"gqa8 d80", {16, 2, 80, 200}, {{0, 47, 1}, {1, 5, 1}}},
        {"gqa12 d256", {12, 1, 256, 96}, {{0, 95, 1}, {1, 64, 1}}},
        {"gqa4 d2", {4, 1, 2, 40}, {{0, 33, 1}}},
    };
    for (const FusedCase& fc : cases)
        for (DType dt : kDtypes)
            for (const bool qkv_fused : {false, true})
                for (const bool qk_norm : {false, true}) {
                    const Heads& h = fc.heads;
                    const int64_t nh = h.n_heads, nkv = h.n_kv, hd = h.head_dim;
                    std::vector<int> lens;
                    std::vector<AttnChunk> chunks;
                    for (size_t i = 0; i < fc.chunks.size(); ++i) {
                        const ChunkSpec& c = fc.chunks[i];
                        chunks.push_back(AttnChunk{c.slot, c.pos0, c.n, int32_t(2 * i + 1)});  // a gap row before each
                        if (int(lens.size()) <= c.slot) lens.resize(size_t(c.slot + 1), 0);
                        lens[size_t(c.slot)] = c.pos0;
                    }
                    const int64_t rows = int64_t(2 * chunks.size());
                    Cache separate(h, dt, lens), fused(h, dt, lens);
                    const int64_t W = (nh + 2 * nkv) * hd;
                    const auto qkv = randv(size_t(rows * W), 31);
                    const auto q = randv(size_t(rows * nh * hd), 32), k = randv(size_t(rows * nkv * hd), 33),
                               v = randv(size_t(rows * nkv * hd), 34);
                    std::vector<float> norms(static_cast<size_t>(2 * hd)), inv_freq(static_cast<size_t>(hd / 2));
                    for (int64_t i = 0; i < hd; ++i) {
                        norms[size_t(i)] = 1.0f + 0.05f * std::sin(float(i));
                        norms[size_t(hd + i)] = 0.8f + 0.03f * std::cos(float(i));
                    }
                    for (int64_t i = 0; i < hd / 2; ++i)
                        inv_freq[size_t(i)] = std::pow(10000.0f, -2.0f * float(i) / float(hd));
                    const auto upload = [](const std::vector<float>& x, DevMem& d) {
                        CUDA_CHECK(cudaMemcpy(d.as<float>(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                    };
                    DevMem dqkv(qkv.size() * 4), dq(q.size() * 4), dk(k.size() * 4), dv(v.size() * 4),
                        dnorms(norms.size() * 4), dfreq(inv_freq.size() * 4), dqout(q.size() * 4),
                        dchunks(chunks.size() * sizeof(AttnChunk)), dpos(chunks.size() * 4), dslot(chunks.size() * 4);
                    upload(qkv, dqkv);
                    upload(q, dq);
                    upload(k, dk);
                    upload(v, dv);
                    upload(norms, dnorms);
                    upload(inv_freq, dfreq);
                    std::vector<int32_t> pos, slot;
                    for (const AttnChunk& c : chunks) {
                        pos.push_back(c.pos0);
                        slot.push_back(c.slot);
                    }
                    CUDA_CHECK(cudaMemcpy(dchunks.as<AttnChunk>(), chunks.data(), chunks.size() * sizeof(AttnChunk),
                                          cudaMemcpyHostToDevice));
                    CUDA_CHECK(cudaMemcpy(dpos.as<int32_t>(), pos.data(), pos.size() * 4, cudaMemcpyHostToDevice));
                    CUDA_CHECK(cudaMemcpy(dslot.as<int32_t>(), slot.data(), slot.size() * 4, cudaMemcpyHostToDevice));

                    RopeKVParams rp;
                    rp.q = qkv_fused ? dqkv.as<float>() : dq.as<float>();
                    rp.k = qkv_fused ? dqkv.as<float>() + nh * hd : dk.as<float>();
                    rp.v = qkv_fused ? dqkv.as<float>() + (nh + nkv) * hd : dv.as<float>();
                    rp.row_stride = qkv_fused ? W : 0;
                    rp.n_heads = nh;
                    rp.n_kv_heads = nkv;
                    rp.head_dim = hd;
                    rp.inv_freq = dfreq.as<float>();
                    rp.q_norm = qk_norm ? dnorms.as<float>() : nullptr;
                    rp.k_norm = qk_norm ? dnorms.as<float>() + hd : nullptr;
                    rp.eps = 1e-6f;
                    const float scale = 1.0f / std::sqrt(float(hd));
                    DevMem scratch(attention_scratch_bytes(int64_t(chunks.size()), nh, hd, h.capacity));
                    DevMem out_sep(size_t(rows * nh * hd) * 4), out_fused(size_t(rows * nh * hd) * 4);

                    // Fused first: rope_kv_cuda rotates k in place, the fused kernel leaves its input be.
                    rp.kv = fused.layer;
                    AttentionCuda a = make_args(fused, nullptr, out_fused.as<float>(), dchunks.as<AttnChunk>(), chunks,
                                                scratch.as<void>(), scale);
                    a.rope = &rp;
                    attention_cuda(a, AttentionKind::Flash, nullptr);
                    // Separate: rope_kv_cuda on each busy chunk's row, then the decode kernel.
                    for (size_t i = 0; i < chunks.size(); ++i) {
                        if (chunks[i].n < 1) continue;
                        RopeKVParams one = rp;
                        const int64_t row = chunks[i].row0;
                        one.q = rp.q + row * (qkv_fused ? W : nh * hd);
                        one.k = rp.k + row * (qkv_fused ? W : nkv * hd);
                        one.v = rp.v + row * (qkv_fused ? W : nkv * hd);
                        one.q_out = dqout.as<float>() + row * nh * hd;
                        one.T = 1;
                        one.pos = dpos.as<int32_t>() + i;
                        one.slot = dslot.as<int32_t>() + i;
                        one.kv = separate.layer;
                        rope_kv_cuda(one, nullptr);
                    }
                    attention_cuda(make_args(separate, dqout.as<float>(), out_sep.as<float>(), dchunks.as<AttnChunk>(),
                                             chunks, scratch.as<void>(), scale),
                                   AttentionKind::Flash, nullptr);
                    CUDA_CHECK(cudaDeviceSynchronize());

                    const std::string what = std::string(fc.name) + " " + dtype_name(dt) +
                                             (qkv_fused ? " qkv" : " q,k,v") + (qk_norm ? " qk-norm" : "");
                    const auto same = [&](const DevMem& x, const DevMem& y, size_t bytes, const char* part) {
                        std::vector<uint8_t> hx(bytes), hy(bytes);
                        CUDA_CHECK(cudaMemcpy(hx.data(), x.as<void>(), bytes, cudaMemcpyDeviceToHost));
                        CUDA_CHECK(cudaMemcpy(hy.data(), y.as<void>(), bytes, cudaMemcpyDeviceToHost));
                        const auto d = std::mismatch(hx.begin(), hx.end(), hy.begin());
                        EXPECT_TRUE(d.first == hx.end()) << what << ": " << part << " differs at byte "
                                                         << (d.first - hx.begin());
                    };
                    same(out_sep, out_fused, size_t(rows * nh * hd) * 4, "attention output");
                    const size_t cache_bytes = separate.block_bytes * lens.size();
                    same(separate.dk, fused.dk, cache_bytes, "K cache");
                    same(separate.dv, fused.dv, cache_bytes, "V cache");
                    if (dt == DType::I8) {
                        const size_t scale_bytes = size_t(nkv * h.capacity) * lens.size() * 4;
                        same(separate.dks, fused.dks, scale_bytes, "K scales");
                        same(separate.dvs, fused.dvs, scale_bytes, "V scales");
                    }
                    if (::testing::Test::HasFailure()) return;
                }
    // What it refuses: prefill chunks, and parameters of another layer.
    Cache cache({4, 2, 64, 64}, DType::F16, {10});
    DevMem dq(64 * 4 * 4), scratch(attention_scratch_bytes(1, 4, 64, 64)), dchunks(sizeof(AttnChunk));
    const std::vector<AttnChunk> prefill = {{0, 0, 3, 0}};
    RopeKVParams rp;
    rp.q = rp.k = dq.as<float>();
    rp.v = dq.as<float>();
    rp.inv_freq = dq.as<float>();
    rp.n_heads = 4;
    rp.n_kv_heads = 2;
    rp.head_dim = 64;
    rp.kv = cache.layer;
    AttentionCuda a =
        make_args(cache, nullptr, dq.as<float>(), dchunks.as<AttnChunk>(), prefill, scratch.as<void>(), 1.0f);
    a.rope = &rp;
    EXPECT_THROW(attention_cuda(a, AttentionKind::Flash, nullptr), Error);
    a.max_chunk_n = 1;
    EXPECT_THROW(attention_cuda(a, AttentionKind::Naive, nullptr), Error);
    rp.head_dim = 32;
    EXPECT_THROW(attention_cuda(a, AttentionKind::Flash, nullptr), Error);
}

// The scratch size follows the capacity only and covers every split's [m, l, acc] record.
TEST(AttentionCuda, ScratchBytes) {
    EXPECT_EQ(attention_scratch_bytes(0, 8, 128, 4096), 0u);
    const size_t one = attention_scratch_bytes(1, 1, 128, 4096);
    EXPECT_GT(one, 0u);
    EXPECT_EQ(attention_scratch_bytes(3, 5, 128, 4096), 15 * one);
    EXPECT_EQ(one % (130 * sizeof(float)), 0u);
    EXPECT_LE(attention_scratch_bytes(1, 1, 128, 1 << 20), 32 * 130 * sizeof(float));  // at most 32 splits
}
