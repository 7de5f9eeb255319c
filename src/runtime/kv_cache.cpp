#include "runtime/kv_cache.h"

#include <cstring>

#include "core/error.h"

namespace shardlm {

KVFormat parse_kv_format(const std::string& s) {
    if (s == "auto") return KVFormat::Auto;
    if (s == "fp32" || s == "f32") return KVFormat::F32;
    if (s == "fp16" || s == "f16") return KVFormat::F16;
    if (s == "bf16") return KVFormat::BF16;
    if (s == "int8") return KVFormat::Int8;
    fail("--kv: unknown format \"", s, "\" (supported: auto, fp32, fp16, bf16, int8)");
}

DType kv_dtype(KVFormat f) {
    switch (f) {
        case KVFormat::F16: return DType::F16;
        case KVFormat::BF16: return DType::BF16;
        case KVFormat::Int8: return DType::I8;
        default: return DType::F32;
    }
}

const char* kv_name(DType t) {
    switch (t) {
        case DType::F16: return "fp16";
        case DType::BF16: return "bf16";
        case DType::I8: return "int8";
        default: return "fp32";
    }
}

size_t kv_cache_bytes(const KVCacheShape& s) {
    const size_t es = dtype_size(s.dtype);
    const size_t rows = size_t(2 * s.n_layers * s.n_slots * s.n_kv_heads * s.capacity);
    return rows * align_up(size_t(s.head_dim) * es) + (s.dtype == DType::I8 ? rows * sizeof(float) : 0);
}

KVCache::KVCache(const KVCacheShape& s) : s_(s) {
    const size_t es = dtype_size(s.dtype);
    row_stride_ = int64_t(align_up(size_t(s.head_dim) * es) / es);
    block_bytes_ = size_t(s.n_kv_heads * s.capacity * row_stride_) * es;
    buf_ = Buffer(block_bytes_ * size_t(2 * s.n_layers * s.n_slots));
    std::memset(buf_.data(), 0, buf_.size());  // touch now: the cache is reserved, not lazily faulted
    if (s.dtype == DType::I8) {
        scales_ = Buffer(size_t(2 * s.n_layers * s.n_slots * s.n_kv_heads * s.capacity) * sizeof(float));
        std::memset(scales_.data(), 0, scales_.size());
    }
    SHARDLM_CHECK(bytes() == kv_cache_bytes(s), "KV cache plan and allocation disagree");
}

float* KVCache::scales(int64_t layer, int64_t slot, int kv) {
    if (s_.dtype != DType::I8) return nullptr;
    return scales_.as<float>() + ((layer * s_.n_slots + slot) * 2 + kv) * s_.n_kv_heads * s_.capacity;
}

void* KVCache::block(int64_t layer, int64_t slot, int kv) {
    SHARDLM_CHECK(layer >= 0 && layer < s_.n_layers && slot >= 0 && slot < s_.n_slots);
    return buf_.data() + block_bytes_ * size_t((layer * s_.n_slots + slot) * 2 + kv);
}

KVSlotView KVCache::view(int64_t layer, int64_t slot) {
    KVSlotView v;
    v.k = block(layer, slot, 0);
    v.v = block(layer, slot, 1);
    v.k_scales = scales(layer, slot, 0);
    v.v_scales = scales(layer, slot, 1);
    v.dtype = s_.dtype;
    v.n_kv_heads = s_.n_kv_heads;
    v.capacity = s_.capacity;
    v.row_stride = row_stride_;
    v.head_dim = s_.head_dim;
    return v;
}

void KVCache::write(int64_t layer, int64_t slot, int64_t pos, const float* key, const float* value) {
    const KVSlotView v = view(layer, slot);
    const int64_t row = pos % s_.capacity;
    for (int64_t h = 0; h < s_.n_kv_heads; ++h) {
        kv_row_store(v, 0, h, row, key + h * s_.head_dim);
        kv_row_store(v, 1, h, row, value + h * s_.head_dim);
    }
}

void KVCache::shift(int64_t slot, int64_t keep, int64_t discard, int64_t len, const float* inv_freq) {
    for (int64_t l = 0; l < s_.n_layers; ++l) kv_shift_ref(view(l, slot), keep, discard, len, inv_freq);
}

}  // namespace shardlm
