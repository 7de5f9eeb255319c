// Preallocated KV cache: for each layer and batch slot, keys and values of this rank's KV heads.
// Layout of one (layer, slot, K or V) block: [n_kv_heads][capacity][row_stride] where a row holds
// head_dim values padded to a multiple of 128 bytes. Position p of a sequence lives in row
// p % capacity (ring buffer). The capacity is the context, except for a model that slides over a
// window on every layer: then a ring of window + chunk - 1 rows (runtime/engine.h kv_capacity)
// that positions wrap around; --context-overflow slide shifts a full cache (shift()).
// INT8 rows are quantized after RoPE with one symmetric scale per (token, KV head), kept in
// [n_kv_heads][capacity] f32 arrays beside each block.
#pragma once

#include <cstdint>
#include <new>
#include <string>

#include "core/buffer.h"
#include "core/dtype.h"
#include "core/host_memory.h"
#include "kernels/cpu/kv_shift.h"

namespace shardlm {

enum class KVFormat { Auto, F32, F16, BF16, Int8 };
KVFormat parse_kv_format(const std::string& s);  // throws Error naming --kv
DType kv_dtype(KVFormat f);                      // Auto -> F32 on the CPU
const char* kv_name(DType t);                    // as the --kv flag spells it: "fp32", "int8", ...

struct KVCacheShape {
    int64_t n_layers = 0, n_slots = 0, capacity = 0, n_kv_heads = 0, head_dim = 0;
    DType dtype = DType::F32;
};

// Bytes of a cache of this shape: 128-byte aligned rows, plus the f32 scales of an INT8 cache (the
// CPU cache and the CUDA engine's use the same rows). For plans (`shardlm info`) and the cache itself.
size_t kv_cache_bytes(const KVCacheShape& s);
// Whether that byte count fits in int64 (a plan for an absurd --ctx x batch would wrap).
bool kv_cache_fits(const KVCacheShape& s);
// Bytes of one position of one slot in a host copy of its keys and values (Engine::save_kv): per
// layer, K then V, each its [n_kv_heads][n] rows of row bytes then, INT8 only, [n_kv_heads][n]
// f32 scales. The CPU cache and the CUDA engine's lay a copy out alike.
size_t kv_position_bytes(const KVCacheShape& s);

// What KVCache throws when its memory cannot be had: still a std::bad_alloc, carrying the bytes it
// asked for, so that open_session can name the flags behind the size. Either the allocator refused
// (available is SIZE_MAX), or the cache is larger than this process's part of the memory the
// machine can back (core/host_memory.h: available, the whole node's figure, and where it came
// from; the part is available / ranks_on_node) and was not asked for at all.
struct KVCacheAllocError : std::bad_alloc {
    explicit KVCacheAllocError(size_t b, HostMemory avail = {}, int ranks = 1)
        : bytes(b), available(avail.bytes), source(avail.source), ranks_on_node(ranks) {}
    const char* what() const noexcept override { return "KV cache allocation failed"; }
    size_t bytes;
    size_t available;
    std::string source;
    int ranks_on_node;
};

class KVCache {
public:
    // Throws KVCacheAllocError when the cache is more than this process's fair part of the memory
    // the machine can back, available / ranks_on_node (the ranks of a TP job on this node each
    // hold a cache like it; it is zeroed at once: under overcommit that would meet the OOM
    // killer), or when the allocator refuses it.
    explicit KVCache(const KVCacheShape& s, int ranks_on_node = 1);

    const KVCacheShape& shape() const { return s_; }
    int64_t row_stride() const { return row_stride_; }  // elements
    size_t bytes() const { return buf_.size() + scales_.size(); }

    // Base of the [n_kv_heads][capacity][row_stride] block.
    void* k(int64_t layer, int64_t slot) { return block(layer, slot, 0); }
    void* v(int64_t layer, int64_t slot) { return block(layer, slot, 1); }
    // INT8 only: [n_kv_heads][capacity] scales of the block; nullptr otherwise.
    const float* k_scales(int64_t layer, int64_t slot) { return scales(layer, slot, 0); }
    const float* v_scales(int64_t layer, int64_t slot) { return scales(layer, slot, 1); }

    // Stores one token's keys and values ([n_kv_heads * head_dim] each) at position `pos`.
    void write(int64_t layer, int64_t slot, int64_t pos, const float* key, const float* value);

    // Context shift (--context-overflow slide) of `slot` in every layer: kv_shift_ref
    // (kernels/cpu/kv_shift.h). Needs len <= capacity.
    void shift(int64_t slot, int64_t keep, int64_t discard, int64_t len, const float* inv_freq);

    // Rows (and INT8 scales) of positions [0, n) of slot src copied into slot dst, every layer.
    // Needs n <= capacity.
    void copy_prefix(int64_t src, int64_t dst, int64_t n);
    // Rows (and INT8 scales) of positions [0, n) of `slot` to a host copy laid out as
    // kv_position_bytes says, or from the first n positions of such a copy of `saved` positions.
    // Needs n <= capacity.
    void save_prefix(int64_t slot, int64_t n, uint8_t* out);
    void load_prefix(int64_t slot, int64_t n, const uint8_t* in, int64_t saved);

private:
    KVSlotView view(int64_t layer, int64_t slot);
    void* block(int64_t layer, int64_t slot, int kv);
    float* scales(int64_t layer, int64_t slot, int kv);
    void host_copy(int64_t slot, int64_t n, uint8_t* host, int64_t stride, bool save);
    KVCacheShape s_;
    int64_t row_stride_ = 0;
    size_t block_bytes_ = 0;
    Buffer buf_;
    Buffer scales_;  // INT8: [layer][slot][k|v][n_kv_heads][capacity]
};

}  // namespace shardlm
