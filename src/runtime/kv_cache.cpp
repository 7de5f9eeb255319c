#include "runtime/kv_cache.h"

#include <cstring>
#include <limits>

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

namespace {
// a * b for a, b >= 0; -1 when the product passes INT64_MAX (and for a negative factor).
int64_t mul_or_neg(int64_t a, int64_t b) {
    if (a < 0 || b < 0 || (b != 0 && a > std::numeric_limits<int64_t>::max() / b)) return -1;
    return a * b;
}
}  // namespace

bool kv_cache_fits(const KVCacheShape& s) {
    const int64_t es = int64_t(dtype_size(s.dtype));
    const int64_t row = int64_t(align_up(size_t(s.head_dim) * size_t(es))) + (s.dtype == DType::I8 ? 4 : 0);
    int64_t n = 2;
    for (int64_t f : {s.n_layers, s.n_slots, s.n_kv_heads, s.capacity, row}) n = mul_or_neg(n, f);
    return n >= 0;
}

size_t kv_cache_bytes(const KVCacheShape& s) {
    SHARDLM_CHECK(kv_cache_fits(s), "KV cache of ", s.n_layers, " layers x ", s.n_slots, " slots x ", s.capacity,
                  " positions overflows int64 bytes");
    const size_t es = dtype_size(s.dtype);
    const size_t rows = size_t(2 * s.n_layers * s.n_slots * s.n_kv_heads * s.capacity);
    return rows * align_up(size_t(s.head_dim) * es) + (s.dtype == DType::I8 ? rows * sizeof(float) : 0);
}

size_t kv_position_bytes(const KVCacheShape& s) {
    const size_t row = align_up(size_t(s.head_dim) * dtype_size(s.dtype)) + (s.dtype == DType::I8 ? sizeof(float) : 0);
    return size_t(2 * s.n_layers * s.n_kv_heads) * row;
}

KVCache::KVCache(const KVCacheShape& s, int ranks_on_node) : s_(s) {
    const size_t want = kv_cache_bytes(s);  // checks the sizes below cannot overflow
    const size_t es = dtype_size(s.dtype);
    row_stride_ = int64_t(align_up(size_t(s.head_dim) * es) / es);
    block_bytes_ = size_t(s.n_kv_heads * s.capacity * row_stride_) * es;
    // The memset below touches every page: refuse what the machine cannot back rather than have
    // an overcommitting allocator grant it and the OOM killer end the process (core/host_memory.h).
    // Under TP each rank checks its own share (s holds only its KV heads) against its part of the
    // node's memory: the other ranks on the node take theirs from the same figure.
    SHARDLM_CHECK(ranks_on_node >= 1, "KVCache: ", ranks_on_node, " ranks on the node");
    const HostMemory avail = host_memory_available();
    if (avail.bytes != SIZE_MAX && want > avail.bytes / size_t(ranks_on_node))
        throw KVCacheAllocError(want, avail, ranks_on_node);
    try {
        buf_ = Buffer(block_bytes_ * size_t(2 * s.n_layers * s.n_slots));
        if (s.dtype == DType::I8)
            scales_ = Buffer(size_t(2 * s.n_layers * s.n_slots * s.n_kv_heads * s.capacity) * sizeof(float));
    } catch (const std::bad_alloc&) {
        throw KVCacheAllocError(want);
    }
    // Touch now: the cache is reserved, not lazily faulted.
    std::memset(buf_.data(), 0, buf_.size());
    if (scales_.data()) std::memset(scales_.data(), 0, scales_.size());
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

void KVCache::copy_prefix(int64_t src, int64_t dst, int64_t n) {
    SHARDLM_CHECK(n >= 0 && n <= s_.capacity, "KV copy of ", n, " positions, capacity ", s_.capacity);
    const size_t row_bytes = size_t(row_stride_) * dtype_size(s_.dtype);
    for (int64_t l = 0; l < s_.n_layers; ++l)
        for (int kv = 0; kv < 2; ++kv)
            for (int64_t h = 0; h < s_.n_kv_heads; ++h) {
                const size_t head = size_t(h * s_.capacity);
                std::memcpy(static_cast<uint8_t*>(block(l, dst, kv)) + head * row_bytes,
                            static_cast<const uint8_t*>(block(l, src, kv)) + head * row_bytes, size_t(n) * row_bytes);
                if (s_.dtype == DType::I8)
                    std::memcpy(scales(l, dst, kv) + head, scales(l, src, kv) + head, size_t(n) * sizeof(float));
            }
}

void KVCache::save_prefix(int64_t slot, int64_t n, uint8_t* out) { host_copy(slot, n, out, n, true); }

void KVCache::load_prefix(int64_t slot, int64_t n, const uint8_t* in, int64_t saved) {
    host_copy(slot, n, const_cast<uint8_t*>(in), saved, false);
}

// The host side holds `stride` positions per head: n of them move, and the rest are skipped.
void KVCache::host_copy(int64_t slot, int64_t n, uint8_t* host, int64_t stride, bool save) {
    SHARDLM_CHECK(n >= 1 && n <= s_.capacity && n <= stride, "KV host copy of ", n, " positions of ", stride,
                  ", capacity ", s_.capacity);
    const size_t row_bytes = size_t(row_stride_) * dtype_size(s_.dtype);
    // n elements of `bytes` each, of a run of `stride` on the host side.
    auto move = [&](void* cache, size_t bytes) {
        if (save) std::memcpy(host, cache, size_t(n) * bytes);
        else std::memcpy(cache, host, size_t(n) * bytes);
        host += size_t(stride) * bytes;
    };
    for (int64_t l = 0; l < s_.n_layers; ++l)
        for (int kv = 0; kv < 2; ++kv) {
            uint8_t* b = static_cast<uint8_t*>(block(l, slot, kv));
            for (int64_t h = 0; h < s_.n_kv_heads; ++h) move(b + size_t(h * s_.capacity) * row_bytes, row_bytes);
            if (s_.dtype != DType::I8) continue;
            float* sc = scales(l, slot, kv);
            for (int64_t h = 0; h < s_.n_kv_heads; ++h) move(sc + h * s_.capacity, sizeof(float));
        }
}

}  // namespace shardlm
