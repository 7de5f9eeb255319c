// Attention-only benchmark: attention_cached (per query, two passes over the cache) against
// attention_cached_flash (query blocks x key tiles, online softmax) on Qwen3-1.7B's attention
// shape (16 query / 8 KV heads of 128, 28 layers), the way the engine calls them: one call per
// sequence and layer.
//   prefill: batch B sequences of L tokens from position 0 (n_q = L, q_pos0 = 0)
//   decode:  batch B sequences, one query at position L (n_q = 1, q_pos0 = L)
// Figures are for all 28 layers (one layer's time x 28; the cache of one layer is reused, which
// keeps it warmer in cache than the engine's 28 distinct layers do at long contexts).
// Build (not part of the CMake build; link against a configured build folder B):
//   g++ -O3 -std=c++17 -fopenmp -I. -Isrc bench/attention_bench.cpp B/libshardlm_kernels_cpu.a B/libshardlm_core.a -o B/attention_bench
// Run: B/attention_bench [--batch 4] [--len 512] [--kv fp32,fp16,bf16,int8] [--reps 5] [--isa auto]
//                        [--what prefill,decode]
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/quantize.h"

using namespace shardlm;

namespace {

constexpr int64_t kHeads = 16, kKvHeads = 8, kDim = 128, kLayers = 28;

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU time of all threads of the process: on a shared machine it tracks the work done better than
// the wall clock (which also counts the time other jobs hold the cores).
double cpu_ms() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) * 1e3 + double(t.tv_nsec) / 1e6;
}

std::vector<float> rand_vec(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 1;
    for (auto& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(int32_t(s >> 8) % 2001 - 1000) / 500.0f;
    }
    return v;
}

// One sequence's cache of one layer: [kKvHeads][cap][kDim], positions 0 .. n - 1 filled.
struct SeqCache {
    Buffer k, v;
    std::vector<float> ks, vs;
};

SeqCache make_cache(DType dt, int64_t cap, int64_t n, uint32_t seed) {
    SeqCache c;
    const size_t es = dtype_size(dt), elems = size_t(kKvHeads * cap * kDim);
    c.k = Buffer(elems * es);
    c.v = Buffer(elems * es);
    c.ks.assign(size_t(kKvHeads * cap), 0.0f);
    c.vs.assign(size_t(kKvHeads * cap), 0.0f);
    for (int kv = 0; kv < 2; ++kv) {
        const auto src = rand_vec(size_t(kKvHeads * n * kDim), seed + uint32_t(kv));
        uint8_t* base = (kv ? c.v : c.k).data();
        for (int64_t h = 0; h < kKvHeads; ++h)
            for (int64_t j = 0; j < n; ++j) {
                const float* x = src.data() + (h * n + j) * kDim;
                const size_t row = size_t((h * cap + j) * kDim);
                if (dt == DType::I8) {
                    (kv ? c.vs : c.ks)[size_t(h * cap + j)] = quantize_row_int8(x, kDim, reinterpret_cast<int8_t*>(base) + row);
                    continue;
                }
                for (int64_t e = 0; e < kDim; ++e) {
                    if (dt == DType::F32) reinterpret_cast<float*>(base)[row + size_t(e)] = x[e];
                    else if (dt == DType::F16) reinterpret_cast<uint16_t*>(base)[row + size_t(e)] = f32_to_f16(x[e]);
                    else reinterpret_cast<uint16_t*>(base)[row + size_t(e)] = f32_to_bf16(x[e]);
                }
            }
    }
    return c;
}

DType parse_kv(const std::string& s) {
    if (s == "fp32") return DType::F32;
    if (s == "fp16") return DType::F16;
    if (s == "bf16") return DType::BF16;
    return DType::I8;
}

}  // namespace

int main(int argc, char** argv) {
    int64_t batch = 4, len = 512, reps = 5;
    std::string kvs = "fp32,fp16,bf16,int8", isa_name = "auto", what = "prefill,decode";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string f = argv[i];
        if (f == "--batch") batch = std::stoll(argv[i + 1]);
        else if (f == "--len") len = std::stoll(argv[i + 1]);
        else if (f == "--reps") reps = std::stoll(argv[i + 1]);
        else if (f == "--kv") kvs = argv[i + 1];
        else if (f == "--isa") isa_name = argv[i + 1];
        else if (f == "--what") what = argv[i + 1];
    }
    CpuIsa isa = CpuIsa::Auto;
    for (CpuIsa c : cpu_isas_available())
        if (isa_name == cpu_isa_name(c)) isa = c;
    std::printf("attention, Qwen3-1.7B shape (%lld/%lld heads x %lld, %lld layers), batch %lld, length %lld, "
                "%d threads, isa %s; ms for all layers, best of %lld (decode: 10x as many)\n\n",
                (long long)kHeads, (long long)kKvHeads, (long long)kDim, (long long)kLayers, (long long)batch,
                (long long)len, omp_get_max_threads(), cpu_isa_name(cpu_isa_resolve(isa)), (long long)reps);
    std::printf("| kv | phase | naive ms | flash ms | naive / flash | naive cpu ms | flash cpu ms | cpu ratio |\n"
                "|---|---|---:|---:|---:|---:|---:|---:|\n");
    const int64_t cap = len + 1;
    size_t pos = 0;
    while (pos <= kvs.size()) {
        const size_t comma = std::min(kvs.find(',', pos), kvs.size());
        const std::string name = kvs.substr(pos, comma - pos);
        pos = comma + 1;
        const DType dt = parse_kv(name);
        std::vector<SeqCache> caches;
        for (int64_t b = 0; b < batch; ++b) caches.push_back(make_cache(dt, cap, cap, uint32_t(10 + 2 * b)));
        for (int phase = 0; phase < 2; ++phase) {  // 0: prefill of len, 1: one decode step at len
            if (what.find(phase == 0 ? "prefill" : "decode") == std::string::npos) continue;
            const int64_t n_q = phase == 0 ? len : 1, q0 = phase == 0 ? 0 : len;
            const auto q = rand_vec(size_t(batch * n_q * kHeads * kDim), 7);
            std::vector<float> out(q.size());
            double best[2] = {1e30, 1e30}, best_cpu[2] = {1e30, 1e30};
            for (int64_t r = 0; r < (phase == 0 ? reps : 10 * reps); ++r)
                for (int which = 0; which < 2; ++which) {  // interleaved: the same noise for both
                    const double t0 = now_ms(), c0 = cpu_ms();
                    for (int64_t b = 0; b < batch; ++b) {
                        CachedAttention a;
                        a.q = q.data() + b * n_q * kHeads * kDim;
                        a.out = out.data() + b * n_q * kHeads * kDim;
                        a.n_q = n_q;
                        a.n_heads = kHeads;
                        a.n_kv_heads = kKvHeads;
                        a.head_dim = kDim;
                        a.q_pos0 = q0;
                        a.k = caches[size_t(b)].k.data();
                        a.v = caches[size_t(b)].v.data();
                        a.kv_dtype = dt;
                        a.capacity = cap;
                        a.row_stride = kDim;
                        a.scale = 0.088388f;
                        a.k_scales = caches[size_t(b)].ks.data();
                        a.v_scales = caches[size_t(b)].vs.data();
                        a.isa = isa;
                        for (int64_t l = 0; l < (phase == 0 ? 1 : kLayers); ++l)
                            which ? attention_cached_flash(a) : attention_cached(a);
                    }
                    const double f = phase == 0 ? double(kLayers) : 1.0;
                    best[which] = std::min(best[which], (now_ms() - t0) * f);
                    best_cpu[which] = std::min(best_cpu[which], (cpu_ms() - c0) * f);
                }
            const std::string what = phase == 0 ? "prefill " + std::to_string(len) : "decode @" + std::to_string(len);
            std::printf("| %s | %s | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", name.c_str(), what.c_str(), best[0],
                        best[1], best[0] / best[1], best_cpu[0], best_cpu[1], best_cpu[0] / best_cpu[1]);
            std::fflush(stdout);
        }
    }
    return 0;
}
