// A KV cache of several slots filled for context-shift tests (kernels/cpu/kv_shift.h): every byte
// random (padding included), then each row of positions [0, len) holds RoPE(x_p, p) in K and v_p in
// V, so a shifted row r can be checked against RoPE(x_{r + discard}, r) in closed form.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/buffer.h"
#include "core/dtype.h"
#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/rope.h"

namespace shardlm::test {

struct ShiftCase {
    DType dtype;
    int64_t n_kv_heads, head_dim, capacity, keep, discard, len;
};

// Host image of [n_slots][n_kv_heads][capacity][row_stride] K and V, and their scales.
struct HostKV {
    ShiftCase c;
    int64_t n_slots = 0, row_stride = 0;
    std::vector<uint8_t> k, v;
    std::vector<float> ks, vs;
    std::vector<float> raw_k;  // [n_slots][n_kv_heads][len][head_dim], before RoPE
    std::vector<float> inv_freq;

    size_t slot_bytes() const { return size_t(c.n_kv_heads * c.capacity * row_stride) * dtype_size(c.dtype); }
    KVSlotView view(int64_t slot) {
        KVSlotView s;
        s.k = k.data() + size_t(slot) * slot_bytes();
        s.v = v.data() + size_t(slot) * slot_bytes();
        if (c.dtype == DType::I8) {
            s.k_scales = ks.data() + slot * c.n_kv_heads * c.capacity;
            s.v_scales = vs.data() + slot * c.n_kv_heads * c.capacity;
        }
        s.dtype = c.dtype;
        s.n_kv_heads = c.n_kv_heads;
        s.capacity = c.capacity;
        s.row_stride = row_stride;
        s.head_dim = c.head_dim;
        return s;
    }
    const float* raw(int64_t slot, int64_t h, int64_t p) const {
        return raw_k.data() + size_t(((slot * c.n_kv_heads + h) * c.len + p) * c.head_dim);
    }
};

inline HostKV make_host_kv(const ShiftCase& c, int64_t n_slots, uint32_t seed) {
    HostKV kv;
    kv.c = c;
    kv.n_slots = n_slots;
    const size_t es = dtype_size(c.dtype);
    kv.row_stride = int64_t(align_up(size_t(c.head_dim) * es, 128) / es);
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> val(-1.0f, 1.0f);
    kv.k.resize(size_t(n_slots) * kv.slot_bytes());
    kv.v.resize(kv.k.size());
    for (auto& b : kv.k) b = uint8_t(byte(gen));
    for (auto& b : kv.v) b = uint8_t(byte(gen));
    kv.ks.resize(size_t(n_slots * c.n_kv_heads * c.capacity));
    kv.vs.resize(kv.ks.size());
    for (auto& s : kv.ks) s = val(gen) + 2.0f;
    for (auto& s : kv.vs) s = val(gen) + 2.0f;
    RopeParams rp;
    rp.head_dim = c.head_dim;
    rp.theta = 10000.0f;
    kv.inv_freq = rope_inv_freq(rp);
    kv.raw_k.resize(size_t(n_slots * c.n_kv_heads * c.len * c.head_dim));
    for (auto& x : kv.raw_k) x = val(gen);
    std::vector<float> x(size_t(c.head_dim));
    for (int64_t s = 0; s < n_slots; ++s) {
        const KVSlotView view = kv.view(s);
        for (int64_t h = 0; h < c.n_kv_heads; ++h)
            for (int64_t p = 0; p < c.len; ++p) {
                std::memcpy(x.data(), kv.raw(s, h, p), x.size() * sizeof(float));
                rope_ref(x.data(), 1, c.head_dim, p, kv.inv_freq.data());
                kv_row_store(view, 0, h, p, x.data());
                for (auto& e : x) e = val(gen);
                kv_row_store(view, 1, h, p, x.data());
            }
    }
    return kv;
}

// The shapes the tests shift: one pair per head, odd head counts, the largest head, no sinks, a
// move of one row, a move of exactly one wave of `discard` rows, and moves of several waves (the
// CUDA kernel's overlapping move), the last one short.
inline std::vector<ShiftCase> shift_cases(DType d) {
    return {{d, 1, 2, 8, 0, 1, 8},      {d, 3, 6, 40, 4, 5, 37},   {d, 2, 128, 64, 4, 30, 64}, {d, 1, 64, 20, 2, 9, 20},
            {d, 2, 256, 33, 0, 16, 33}, {d, 1, 16, 12, 10, 1, 12}, {d, 2, 32, 50, 4, 2, 49}};
}

}  // namespace shardlm::test
