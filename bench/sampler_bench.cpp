// Sampler micro-benchmark: one Qwen3-sized row (151936 logits), peaked (normal logits plus 20
// likely tokens) and flat (uniform), through Sampler::sample with and without top-k, top-p 0.95
// and 1.0, temperature 0.8; ms per row and a checksum of the drawn ids (equal checksums: the same
// tokens). The numbers in the sampler's commit messages come from this file.
// Build (not part of the CMake build; link against a configured build folder B):
//   g++ -O2 -std=c++17 -fopenmp -I. -Isrc bench/sampler_bench.cpp B/libshardlm_runtime.a \
//       B/libshardlm_kernels_cpu.a B/libshardlm_core.a -o B/sampler_bench
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
#include "runtime/sampler.h"
using namespace shardlm;
int main() {
    const int64_t V = 151936;
    std::mt19937 gen(7);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::uniform_real_distribution<float> ud(-10.0f, 10.0f);
    std::vector<float> peaked(V), flat(V);
    for (auto& x : peaked) x = nd(gen);
    for (int i = 0; i < 20; ++i) peaked[size_t(gen() % V)] = 14.0f - 0.4f * float(i);  // a few likely tokens
    for (auto& x : flat) x = ud(gen);
    for (int pass = 0; pass < 2; ++pass) {
        const std::vector<float>& lg = pass ? flat : peaked;
        for (int64_t k : {int64_t(0), int64_t(40)}) {
            for (float p : {0.95f, 1.0f}) {
                SamplerOptions o; o.top_k = k; o.top_p = p; o.temperature = 0.8f; o.seed = 1;
                Sampler sm(o, 0);
                long acc = 0;
                const int reps = 20;
                auto t0 = std::chrono::steady_clock::now();
                for (int r = 0; r < reps; ++r) acc += sm.sample(lg.data(), V);
                double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
                std::printf("%s top_k %ld top_p %.2f: %.3f ms per row (checksum %ld)\n", pass ? "flat  " : "peaked", long(k), p, ms, acc);
            }
        }
    }
}
