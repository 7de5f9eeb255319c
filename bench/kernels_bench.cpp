// Kernel-level benchmark: every Linear layer of a Qwen3-1.7B-shaped model (hidden 2048, 28 layers,
// 16 q / 8 kv heads of 128, intermediate 6144, tied vocab 151936) through matmul / matmul_w8a8 /
// matmul_w4a8 (int4 and w4a8: 4-bit layers in groups of 128, INT8 lm_head).
//   decode: all layers + lm_head for n = 1..4 tokens (--decode-n to choose); GB/s = weight bytes
//           (+ scales) / time,
//           held against the measured copy bandwidth (src/core/membw.h).
//   prefill: n tokens through all layers (+ lm_head for one token, as the engine does).
//   lora: LoRA's update (kernels/cpu/lora.h) on every layer matrix at --lora-rank (default 16),
//         factors in f32 and BF16, one call per matrix and one per layer input (lora_add_jobs,
//         as the engine calls it), timed in turn in each round, for the decode n's and prefill n;
//         GB/s = factor bytes / time (serve --lora-modules keeps BF16 factors over non-FP32 weights).
// Build (not part of the CMake build; link against a configured build folder B):
//   g++ -O3 -std=c++17 -fopenmp -I. -Isrc bench/kernels_bench.cpp B/libshardlm_kernels_cpu.a \
//       B/libshardlm_core.a -o B/kernels_bench
// Run: B/kernels_bench [--isa auto|scalar|avx2|avx512|amx] [--what decode,prefill] [--prefill-n 128]
//                      [--decode-n 1,2,3,4] [--formats int8,w8a8,bf16,int4,w4a8] [--reps 3]
//                      [--lora-rank 16] (--what lora)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/membw.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/matmul.h"

using namespace shardlm;

namespace {

struct Layer {
    const char* name;
    int64_t rows, cols;
};

const Layer kLayer[] = {{"q", 2048, 2048},    {"k", 1024, 2048},  {"v", 1024, 2048},  {"o", 2048, 2048},
                        {"gate", 6144, 2048}, {"up", 6144, 2048}, {"down", 2048, 6144}};
constexpr int kLayers = 28;
constexpr Layer kHead = {"lm_head", 151936, 2048};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Best of a few threaded passes summing a 1 GiB buffer: the read-only stream a GEMV can hope for.
double measure_read_gbps() {
    static Buffer buf;
    const size_t bytes = size_t(1) << 30;
    if (buf.size() != bytes) {
        buf = Buffer(bytes);
        std::memset(buf.data(), 1, bytes);
    }
    const uint64_t* p = buf.as<uint64_t>();
    const int64_t n = int64_t(bytes / 8);
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        uint64_t sum = 0;
        const double t0 = now_s();
#pragma omp parallel for reduction(+ : sum) schedule(static)
        for (int64_t i = 0; i < n; ++i) sum += p[i];
        const double dt = now_s() - t0;
        if (sum == 42) std::printf("!");
        best = std::max(best, double(bytes) / dt / 1e9);
    }
    return best;
}

struct Model {
    std::vector<Buffer> data, scales;
    std::vector<WeightView> views;  // 28 x 7 layers, then lm_head
    double bytes = 0;
};

constexpr int64_t kInt4Group = 128;

// Random 4-bit codes with a scale and a min per group of 128 (as `--weights int4`).
WeightView make_int4(Model& m, const Layer& L) {
    const size_t n = size_t(L.rows * L.cols);
    m.data.emplace_back(n / 2);
    uint8_t* p = m.data.back().data();
    for (size_t i = 0; i < n / 2; ++i) p[i] = uint8_t((i * 2654435761u) >> 13);
    const size_t ng = size_t(L.rows * (L.cols / kInt4Group));
    m.scales.emplace_back(ng * 8);
    float* s = m.scales.back().as<float>();
    for (size_t i = 0; i < ng; ++i) s[i] = 0.05f / 15, s[ng + i] = -0.025f;
    m.bytes += double(n / 2 + ng * 8);
    WeightView w;
    w.dtype = DType::I4;
    w.data = p;
    w.rows = L.rows;
    w.cols = L.cols;
    w.scales = s;
    w.mins = s + ng;
    w.group_size = kInt4Group;
    return w;
}

// Random weights in the given format; INT8 per output channel (group = cols). I4 makes the
// layers 4-bit and keeps lm_head INT8, as the engine does.
Model make_model(DType layer_dt) {
    Model m;
    std::vector<Layer> all;
    for (int l = 0; l < kLayers; ++l)
        for (const Layer& L : kLayer) all.push_back(L);
    all.push_back(kHead);
    for (const Layer& L : all) {
        if (layer_dt == DType::I4 && &L != &all.back()) {
            m.views.push_back(make_int4(m, L));
            continue;
        }
        const DType dt = layer_dt == DType::I4 ? DType::I8 : layer_dt;
        const size_t n = size_t(L.rows * L.cols);
        m.data.emplace_back(n * dtype_size(dt));
        uint8_t* p = m.data.back().data();
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < L.rows; ++r) {
            uint32_t s = uint32_t(r) * 2654435761u + 1;
            for (int64_t c = 0; c < L.cols; ++c) {
                s = s * 1664525u + 1013904223u;
                const size_t i = size_t(r * L.cols + c);
                const float v = float(int32_t(s >> 8) % 2001 - 1000) / 1000.0f;
                if (dt == DType::I8) reinterpret_cast<int8_t*>(p)[i] = int8_t(int32_t(v * 127));
                else reinterpret_cast<uint16_t*>(p)[i] = f32_to_bf16(v * 0.05f);
            }
        }
        WeightView w;
        w.dtype = dt;
        w.data = p;
        w.rows = L.rows;
        w.cols = L.cols;
        m.bytes += double(n * dtype_size(dt));
        if (dt == DType::I8) {
            m.scales.emplace_back(size_t(L.rows) * 4);
            float* s = m.scales.back().as<float>();
            for (int64_t r = 0; r < L.rows; ++r) s[r] = 0.05f / 127;
            w.scales = s;
            w.group_size = L.cols;
            m.bytes += double(L.rows) * 4;
        }
        m.views.push_back(w);
    }
    return m;
}

struct Work {
    std::vector<float> x, y;
    std::vector<int8_t> q;
    std::vector<float> s;
};

// One pass over the model's Linear layers for n tokens (lm_head for `head_n` tokens).
void pass(const Model& m, const std::string& fmt, int64_t n, int64_t head_n, Work& w, CpuIsa isa) {
    for (size_t i = 0; i < m.views.size(); ++i) {
        const WeightView& v = m.views[i];
        const int64_t nt = i + 1 == m.views.size() ? head_n : n;
        if (nt == 0) continue;
        if (fmt == "w4a8" && v.dtype == DType::I4) {
            quantize_acts_int8(w.x.data(), nt, v.cols, kInt4Group, w.q.data(), w.s.data());
            matmul_w4a8(QuantizedActs{w.q.data(), w.s.data(), nt, v.cols, kInt4Group}, v, nullptr, w.y.data(), isa);
        } else if (fmt == "w8a8") {
            quantize_acts_int8(w.x.data(), nt, v.cols, v.cols, w.q.data(), w.s.data());
            QuantizedActs a;
            a.q = w.q.data();
            a.scales = w.s.data();
            a.n = nt;
            a.cols = v.cols;
            a.group_size = v.cols;
            matmul_w8a8(a, v, nullptr, w.y.data(), isa);
        } else {
            matmul(w.x.data(), nt, v, nullptr, w.y.data(), isa);
        }
    }
}

// LoRA factors of every layer matrix, A [rank, cols] and Bt [rank, rows], in dt.
struct LoraFactors {
    DType dt;
    std::vector<Buffer> a, bt;
    double bytes = 0;
};

LoraFactors make_lora(DType dt, int64_t rank) {
    LoraFactors f{dt, {}, {}, 0};
    auto fill = [&](std::vector<Buffer>& out, int64_t n, float spread) {
        out.emplace_back(size_t(n) * dtype_size(dt));
        for (int64_t i = 0; i < n; ++i) {
            const float v = float(int(i * 7919 % 2001) - 1000) / 1000.0f * spread;
            if (dt == DType::F32) out.back().as<float>()[i] = v;
            else reinterpret_cast<uint16_t*>(out.back().data())[i] = f32_to_bf16(v);
        }
        f.bytes += double(n) * double(dtype_size(dt));
    };
    for (int l = 0; l < kLayers; ++l)
        for (const Layer& L : kLayer) {
            fill(f.a, rank * L.cols, 0.02f);
            fill(f.bt, rank * L.rows, 0.01f);
        }
    return f;
}

// grouped: one lora_add_jobs call per layer input (q/k/v, o, gate/up, down), as the engine calls
// it; else one lora_add call per matrix (the engine before 2026-12-07).
void lora_pass(const LoraFactors& f, int64_t rank, int64_t n, Work& w, std::vector<float>& t, CpuIsa isa, bool grouped) {
    if (!grouped) {
        for (size_t i = 0; i < f.a.size(); ++i) {
            const Layer& L = kLayer[i % 7];
            lora_add(w.x.data(), n, L.cols, f.a[i].data(), f.bt[i].data(), f.dt, rank, L.rows, t.data(), w.y.data(), isa);
        }
        return;
    }
    for (size_t l = 0; l < f.a.size(); l += 7) {
        LoraJob jobs[7];
        int64_t y_at = 0;
        for (int m = 0; m < 7; ++m) {
            const Layer& L = kLayer[m];
            jobs[m] = LoraJob{w.x.data(), n, L.cols, f.a[l + size_t(m)].data(), f.bt[l + size_t(m)].data(), rank, L.rows,
                              w.y.data() + y_at, L.rows};
            y_at += n * L.rows;
        }
        for (const auto& [first, count] : {std::pair<int, int>{0, 3}, {3, 1}, {4, 2}, {6, 1}})
            lora_add_jobs(jobs + first, count, f.dt, t.data(), isa);
    }
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t p = 0;
    while (p <= s.size()) {
        const size_t q = s.find(',', p);
        out.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) break;
        p = q + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    std::string isa_name = "auto", what = "decode,prefill", formats = "int8,w8a8,bf16", decode_n = "1,2,3,4";
    int64_t prefill_n = 128, lora_rank = 16;
    int reps = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string k = argv[i], v = argv[i + 1];
        if (k == "--isa") isa_name = v;
        else if (k == "--what") what = v;
        else if (k == "--formats") formats = v;
        else if (k == "--prefill-n") prefill_n = std::stoll(v);
        else if (k == "--decode-n") decode_n = v;
        else if (k == "--reps") reps = std::stoi(v);
        else if (k == "--lora-rank") lora_rank = std::stoll(v);
    }
    CpuIsa isa = CpuIsa::Auto;
    for (CpuIsa a : cpu_isas_available())
        if (isa_name == cpu_isa_name(a)) isa = a;
    double copy = measure_copy_gbps(), read = measure_read_gbps();
    std::printf("# threads %d, isa %s, copy bandwidth %.1f GB/s (read + write), read %.1f GB/s\n",
                omp_get_max_threads(), cpu_isa_name(cpu_isa_resolve(isa)), copy, read);
    std::vector<int64_t> dn;
    for (const std::string& v : split(decode_n)) dn.push_back(std::max<int64_t>(1, std::stoll(v)));
    const int64_t max_n = std::max(prefill_n, *std::max_element(dn.begin(), dn.end()));
    const double flop_layers = 2.0 * kLayers * (2048.0 * 2048 * 2 + 1024.0 * 2048 * 2 + 6144.0 * 2048 * 3);
    Work w;
    w.x.assign(size_t(max_n * 6144), 0.01f);
    for (size_t i = 0; i < w.x.size(); ++i) w.x[i] = float(int(i % 17) - 8) * 0.01f;
    w.y.assign(size_t(max_n * 151936), 0.0f);
    w.q.resize(w.x.size());
    w.s.resize(w.x.size() / kInt4Group);
    if (what.find("lora") != std::string::npos) {
        const LoraFactors f[2] = {make_lora(DType::F32, lora_rank), make_lora(DType::BF16, lora_rank)};
        std::printf("\n## lora rank %lld on %d matrices: %.1f MB of f32 factors, %.1f MB of bf16\n", (long long)lora_rank,
                    kLayers * 7, f[0].bytes / 1e6, f[1].bytes / 1e6);
        std::vector<int64_t> ns = dn;
        ns.push_back(prefill_n);
        std::vector<float> t(size_t(3 * max_n * lora_rank));
        for (const int64_t n : ns) {
            double best[2][2] = {{1e30, 1e30}, {1e30, 1e30}};  // [grouped][f32, bf16]
            lora_pass(f[0], lora_rank, n, w, t, isa, true);  // warm-up
            for (int r = 0; r < reps; ++r)
                for (int g = 0; g < 2; ++g)
                    for (int k = 0; k < 2; ++k) {  // every variant in turn, so the ratios come from one run
                        const double t0 = now_s();
                        lora_pass(f[k], lora_rank, n, w, t, isa, g == 1);
                        best[g][k] = std::min(best[g][k], now_s() - t0);
                    }
            for (int g = 0; g < 2; ++g)
                std::printf("lora n=%lld %s: f32 %.2f ms (%.1f GB/s, %.0f%% of read %.1f), bf16 %.2f ms (%.1f GB/s, %.0f%%), "
                            "bf16/f32 time %.2f\n",
                            (long long)n, g ? "per input " : "per matrix", best[g][0] * 1e3, f[0].bytes / best[g][0] / 1e9,
                            100 * f[0].bytes / best[g][0] / 1e9 / read, read, best[g][1] * 1e3, f[1].bytes / best[g][1] / 1e9,
                            100 * f[1].bytes / best[g][1] / 1e9 / read, best[g][1] / best[g][0]);
            std::printf("lora n=%lld per input / per matrix time: f32 %.2f, bf16 %.2f\n", (long long)n,
                        best[1][0] / best[0][0], best[1][1] / best[0][1]);
        }
        if (what.find("decode") == std::string::npos && what.find("prefill") == std::string::npos) return 0;
    }
    for (const std::string& fmt : split(formats)) {
        const Model m = make_model(fmt == "bf16"                     ? DType::BF16
                                   : fmt == "int4" || fmt == "w4a8" ? DType::I4
                                                                    : DType::I8);
        std::printf("\n## %s: %.3f GB of weights\n", fmt.c_str(), m.bytes / 1e9);
        if (what.find("decode") != std::string::npos) {
            // Rounds over the token counts, best of each: on a shared machine the best run is the one
            // least disturbed; the copy bandwidth is re-measured between rounds and its best kept too.
            pass(m, fmt, 1, 1, w, isa);  // warm-up (page faults of y, scratch)
            std::vector<double> best(dn.size(), 1e30), sum(dn.size(), 0.0);
            for (int r = 0; r < reps; ++r) {
                for (size_t i = 0; i < dn.size(); ++i) {
                    const double t0 = now_s();
                    pass(m, fmt, dn[i], dn[i], w, isa);
                    const double dt = now_s() - t0;
                    best[i] = std::min(best[i], dt);
                    sum[i] += dt;
                }
                copy = std::max(copy, measure_copy_gbps());
                read = std::max(read, measure_read_gbps());
            }
            for (size_t i = 0; i < dn.size(); ++i)
                std::printf("decode n=%lld: best %.1f ms (mean %.1f) per step, %.1f GB/s = %.0f%% of copy %.1f "
                            "(%.0f%% of read %.1f), %.1f tok/s\n",
                            (long long)dn[i], best[i] * 1e3, sum[i] / reps * 1e3, m.bytes / best[i] / 1e9,
                            100 * m.bytes / best[i] / 1e9 / copy, copy, 100 * m.bytes / best[i] / 1e9 / read, read,
                            double(dn[i]) / best[i]);
        }
        if (what.find("prefill") != std::string::npos) {
            double best = 1e30;
            for (int r = 0; r < std::max(1, reps - 1); ++r) {
                const double t0 = now_s();
                pass(m, fmt, prefill_n, 1, w, isa);
                best = std::min(best, now_s() - t0);
            }
            std::printf("prefill n=%lld: %.3f s, %.1f tok/s, %.1f GFLOP/s (layers; lm_head for 1 token)\n",
                        (long long)prefill_n, best, double(prefill_n) / best, flop_layers * double(prefill_n) / best / 1e9);
        }
    }
    return 0;
}
