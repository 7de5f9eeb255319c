// The BPE model of tokenizer.json: vocabulary, merges by rank, byte fallback and unknown tokens.
// For byte-level tokenizers the GPT-2 byte-to-character map is folded into the vocabulary, so words
// are encoded straight from their UTF-8 bytes with no intermediate string.
#pragma once

#include <cstdint>
#include <mutex>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace shardlm {

// GPT-2's reversible map from bytes to printable characters (UTF-8 of each), and its inverse
// (-1 for characters outside the map).
const std::string& byte_to_unicode(uint8_t b);
int byte_from_unicode(char32_t c);

// The two big tables of a BPE model, taken out of tokenizer.json while it is parsed (a JSON tree
// of 150k entries costs more than the tokenizer itself). An entry the parser could not read
// leaves a message in `error`.
struct BpeTables {
    std::vector<std::pair<std::string, int64_t>> vocab;
    std::vector<std::pair<std::string, std::string>> merges;
    std::string error;
};

// Parses tokenizer.json, moving model.vocab and model.merges into `tables` (they are left empty
// in the returned tree). Malformed JSON is an error naming `where`.
nlohmann::json parse_tokenizer_json(const std::string& text, const std::string& where, BpeTables& tables);

class BpeModel {
public:
    // Reads the "model" object (type BPE) with its tables; `byte_level`: words arrive as raw bytes.
    static std::unique_ptr<BpeModel> from_json(const nlohmann::json& model, BpeTables tables, bool byte_level,
                                               const std::string& where);

    // Buffers reused from word to word (one per encode call: the model itself stays immutable).
    struct Scratch {
        std::vector<int32_t> syms, prev, next;
        std::vector<char> alive;
        std::string key;
    };

    // Appends the ids of one pre-tokenized word (valid UTF-8, or any bytes when byte-level).
    void encode_word(std::string_view word, std::vector<int32_t>& out, Scratch& scratch) const;

    // Token string -> id and back, in the file's spelling (GPT-2 characters for byte-level models).
    int32_t find(std::string_view token) const;  // -1 when absent
    const std::vector<std::string>& tokens() const { return id_to_token_; }
    int32_t unk_id() const { return unk_id_; }
    bool byte_fallback() const { return byte_fallback_; }

private:
    struct Merge { int32_t rank, new_id; };
    static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

    // Open-addressing table (pair key -> merge), the hottest lookup of encoding: linear probing in
    // a power-of-two array, about twice as fast as std::unordered_map here.
    class MergeTable {
    public:
        void reserve(size_t n);
        void insert_or_assign(uint64_t key, Merge m);
        const Merge* find(uint64_t key) const {
            if (slots_.empty()) return nullptr;
            for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
                const Slot& s = slots_[i];
                if (s.key == key) return &s.merge;
                if (s.key == kEmpty) return nullptr;
            }
        }

    private:
        static constexpr uint64_t kEmpty = ~uint64_t(0);  // ids are < 2^30, so no pair has this key
        struct Slot { uint64_t key = kEmpty; Merge merge{}; };
        static size_t hash(uint64_t k) {
            k ^= k >> 33;
            k *= 0xff51afd7ed558ccdull;
            k ^= k >> 33;
            return size_t(k);
        }
        std::vector<Slot> slots_;
        size_t mask_ = 0, size_ = 0;
    };
    void word_symbols(std::string_view word, std::vector<int32_t>& syms) const;
    void merge_symbols(Scratch& s) const;
    const Merge* find_merge(int32_t a, int32_t b) const { return merges_.find(pair_key(a, b)); }

    std::unordered_map<std::string, int32_t> vocab_;       // as spelled in the file
    std::unordered_map<std::string, int32_t> byte_vocab_;  // byte-level: keyed by raw bytes
    std::vector<std::string> id_to_token_;
    MergeTable merges_;
    int32_t byte_ids_[256];   // byte-level: each byte's symbol; otherwise <0xNN> for byte fallback
    int32_t ascii_ids_[128];  // not byte-level: single-character tokens of ASCII
    int32_t unk_id_ = -1;
    bool byte_level_ = false, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;

    // Words repeat (" the", ","): their ids are cached. Guarded so one model serves many threads.
    mutable std::mutex cache_mu_;
    mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace shardlm
