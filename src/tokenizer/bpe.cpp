#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxCachedWord = 256;    // longer words rarely repeat
constexpr size_t kMaxCacheEntries = 1 << 17;
constexpr size_t kLinearMergeMax = 24;    // below this many symbols a scan beats a heap

struct ByteMap {
    std::string to[256];
    std::unordered_map<char32_t, int> from;
    ByteMap() {
        // Printable Latin-1 bytes map to themselves; the others to U+0100 onwards, in byte order.
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            const char32_t c = printable ? char32_t(b) : char32_t(256 + n++);
            append_utf8(to[b], c);
            from[c] = b;
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap m;  // immutable table, built once
    return m;
}

std::string hex_byte_token(unsigned b) {
    static const char* hex = "0123456789ABCDEF";
    return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to[b]; }

void BpeModel::MergeTable::reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;  // load factor <= 1/2
    slots_.assign(cap, Slot{});
    mask_ = cap - 1;
    size_ = 0;
}

void BpeModel::MergeTable::insert_or_assign(uint64_t key, Merge m) {
    if (2 * (size_ + 1) > slots_.size()) {
        std::vector<Slot> old;
        old.swap(slots_);
        reserve(std::max<size_t>(size_ + 1, old.size()));
        for (const Slot& s : old)
            if (s.key != kEmpty) insert_or_assign(s.key, s.merge);
    }
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
        Slot& s = slots_[i];
        if (s.key == key) {
            s.merge = m;
            return;
        }
        if (s.key == kEmpty) {
            s.key = key;
            s.merge = m;
            ++size_;
            return;
        }
    }
}

int byte_from_unicode(char32_t c) {
    const auto& f = byte_map().from;
    auto it = f.find(c);
    return it == f.end() ? -1 : it->second;
}

std::unique_ptr<BpeModel> BpeModel::from_json(const json& m, BpeTables tables, bool byte_level, const std::string& where) {
    if (!m.is_object()) fail(where, ": \"model\" must be an object");
    const std::string type = m.value("type", std::string("BPE"));
    if (type != "BPE") fail(where, ": unsupported model type \"", type, "\" (supported: BPE)");
    if (!m.contains("vocab") || !m["vocab"].is_object()) fail(where, ": BPE model needs a \"vocab\" object");
    if (!m.contains("merges") || !m["merges"].is_array()) fail(where, ": BPE model needs a \"merges\" array");
    for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
        if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
            fail(where, ": BPE ", k, " \"", m[k].get<std::string>(), "\" is not supported");
    if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
        fail(where, ": BPE dropout is not supported");

    std::unique_ptr<BpeModel> b(new BpeModel);
    b->byte_level_ = byte_level;
    b->byte_fallback_ = m.value("byte_fallback", false);
    b->fuse_unk_ = m.value("fuse_unk", false);
    b->ignore_merges_ = m.value("ignore_merges", false);

    if (!tables.error.empty()) fail(where, ": ", tables.error);
    // Entries still in the tree (a caller that built it by hand) join the parsed ones.
    for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it)
        if (!it.value().is_discarded())  // moved out by parse_tokenizer_json
            tables.vocab.emplace_back(it.key(), it.value().is_number_integer() ? it.value().get<int64_t>() : -1);
    for (const json& e : m["merges"]) {
        if (e.is_string()) tables.merges.emplace_back(e.get<std::string>(), std::string());
        else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string())
            tables.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        else fail(where, ": merge ", tables.merges.size(), " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    b->vocab_.reserve(tables.vocab.size());
    int32_t max_id = -1;
    for (auto& [tok, raw_id] : tables.vocab) {
        if (raw_id < 0 || raw_id > (1 << 30)) fail(where, ": vocab entry \"", tok, "\" has no valid id");
        const auto id = int32_t(raw_id);
        max_id = std::max(max_id, id);
        b->vocab_[std::move(tok)] = id;
    }
    b->id_to_token_.assign(size_t(max_id + 1), std::string());
    for (const auto& [tok, id] : b->vocab_) b->id_to_token_[size_t(id)] = tok;

    if (m.contains("unk_token") && m["unk_token"].is_string()) {
        const std::string unk = m["unk_token"];
        const auto it = b->vocab_.find(unk);
        if (it == b->vocab_.end()) fail(where, ": unk_token \"", unk, "\" is not in the vocabulary");
        b->unk_id_ = it->second;
    }

    std::fill(std::begin(b->byte_ids_), std::end(b->byte_ids_), -1);
    std::fill(std::begin(b->ascii_ids_), std::end(b->ascii_ids_), -1);
    if (byte_level) {
        for (int i = 0; i < 256; ++i) b->byte_ids_[i] = b->find(byte_to_unicode(uint8_t(i)));
        // Tokens spelled entirely in the byte alphabet, keyed by their raw bytes (for ignore_merges).
        for (const auto& [tok, id] : b->vocab_) {
            if (!b->ignore_merges_) break;
            std::string raw;
            bool ok = true;
            for (size_t i = 0; i < tok.size() && ok;) {
                const int v = byte_from_unicode(next_code_point(tok, i));
                if (v < 0) ok = false;
                else raw += char(v);
            }
            if (ok) b->byte_vocab_.emplace(std::move(raw), id);
        }
    } else {
        for (int i = 0; i < 256; ++i) b->byte_ids_[i] = b->find(hex_byte_token(unsigned(i)));
        for (int c = 0; c < 128; ++c) b->ascii_ids_[c] = b->find(std::string(1, char(c)));
    }

    b->merges_.reserve(tables.merges.size());
    std::string joined;
    for (size_t r = 0; r < tables.merges.size(); ++r) {
        auto& [left, right] = tables.merges[r];
        if (right.empty()) {
            // "a b": older files; a token containing a space cannot be written this way.
            const std::string s = left;
            const size_t sp = s.find(' ');
            if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
                fail(where, ": merge ", r, " \"", s, "\" is not two tokens separated by one space");
            left = s.substr(0, sp);
            right = s.substr(sp + 1);
        }
        joined.assign(left).append(right);
        const int32_t a = b->find(left), c = b->find(right), n = b->find(joined);
        if (a < 0 || c < 0 || n < 0)
            fail(where, ": merge ", r, " (\"", left, "\", \"", right, "\") uses a token missing from the vocabulary");
        // A repeated pair keeps its last rank, as HF tokenizers and the JS port both do.
        b->merges_.insert_or_assign(pair_key(a, c), Merge{int32_t(r), n});
    }
    return b;
}

json parse_tokenizer_json(const std::string& text, const std::string& where, BpeTables& t) {
    // Keys on the path from the root; the vocab and merges entries are moved out as they are read
    // (returning false drops them from the tree).
    std::string keys[4];
    std::vector<std::string> pair;
    bool pair_ok = true;
    const auto in_model = [&](const char* table) { return keys[1] == "model" && keys[2] == table; };
    const auto cb = [&](int depth, json::parse_event_t ev, json& v) -> bool {
        if (ev == json::parse_event_t::key) {
            if (depth < 4) keys[depth] = v.get<std::string>();
            return true;
        }
        if (depth == 3 && in_model("vocab") && ev == json::parse_event_t::value) {
            t.vocab.emplace_back(keys[3], v.is_number_integer() ? v.get<int64_t>() : -1);
            return false;
        }
        if (in_model("merges")) {
            if (depth == 3 && ev == json::parse_event_t::value) {
                if (v.is_string()) t.merges.emplace_back(v.get<std::string>(), std::string());
                else if (t.error.empty()) t.error = cat("merge ", t.merges.size(), " is neither \"a b\" nor [\"a\", \"b\"]");
                return false;
            }
            if (depth == 3 && ev == json::parse_event_t::array_start) {
                pair.clear();
                pair_ok = true;
            }
            if (depth == 4 && ev == json::parse_event_t::value) {
                if (v.is_string()) pair.push_back(v.get<std::string>());
                else pair_ok = false;
                return false;
            }
            if (depth == 3 && ev == json::parse_event_t::array_end) {
                if (pair_ok && pair.size() == 2 && !pair[1].empty()) t.merges.emplace_back(std::move(pair[0]), std::move(pair[1]));
                else if (t.error.empty()) t.error = cat("merge ", t.merges.size(), " is neither \"a b\" nor [\"a\", \"b\"]");
                return false;
            }
        }
        return true;
    };
    try {
        return json::parse(text, cb);
    } catch (const json::exception& e) {
        fail(where, ": malformed JSON: ", e.what());
    }
}

int32_t BpeModel::find(std::string_view token) const {
    const auto it = vocab_.find(std::string(token));
    return it == vocab_.end() ? -1 : it->second;
}

void BpeModel::word_symbols(std::string_view word, std::vector<int32_t>& syms) const {
    syms.clear();
    if (byte_level_) {
        for (unsigned char c : word) {
            const int32_t id = byte_ids_[c];
            if (id >= 0) syms.push_back(id);
            else if (unk_id_ >= 0) syms.push_back(unk_id_);
            else fail("tokenizer: byte 0x", std::hex, unsigned(c), " has no token and there is no unk_token");
        }
        return;
    }
    bool prev_unk = false;
    std::string ch;
    for (size_t i = 0; i < word.size();) {
        const size_t start = i;
        const auto lead = static_cast<unsigned char>(word[i]);
        int32_t id = -1;
        if (lead < 0x80) {
            id = ascii_ids_[lead];
            ++i;
        } else {
            i += utf8_seq_len(lead);
            ch.assign(word.substr(start, i - start));
            id = find(ch);
        }
        if (id >= 0) {
            syms.push_back(id);
            prev_unk = false;
            continue;
        }
        if (byte_fallback_) {
            bool all = true;
            for (size_t k = start; k < i; ++k) all = all && byte_ids_[static_cast<unsigned char>(word[k])] >= 0;
            if (all) {
                for (size_t k = start; k < i; ++k) syms.push_back(byte_ids_[static_cast<unsigned char>(word[k])]);
                prev_unk = false;
                continue;
            }
        }
        if (unk_id_ < 0)
            fail("tokenizer: character \"", word.substr(start, i - start), "\" has no token and there is no unk_token");
        if (!(fuse_unk_ && prev_unk)) syms.push_back(unk_id_);
        prev_unk = true;
    }
}

void BpeModel::merge_symbols(Scratch& scratch) const {
    std::vector<int32_t>& syms = scratch.syms;
    const size_t n = syms.size();
    if (n < 2) return;
    if (n <= kLinearMergeMax) {
        // Repeatedly merge the lowest-ranked adjacent pair (leftmost on ties): the same order as
        // the heap below, cheaper for short words.
        for (;;) {
            int32_t best_rank = INT32_MAX, best_new = -1;
            size_t best = 0;
            for (size_t i = 0; i + 1 < syms.size(); ++i) {
                const Merge* m = find_merge(syms[i], syms[i + 1]);
                if (m && m->rank < best_rank) {
                    best_rank = m->rank;
                    best_new = m->new_id;
                    best = i;
                }
            }
            if (best_new < 0) return;
            syms[best] = best_new;
            syms.erase(syms.begin() + std::ptrdiff_t(best) + 1);
        }
    }
    // Linked list over the symbols and a min-heap of candidate merges keyed by (rank, position);
    // stale entries are skipped when popped. O(n log n) for long words.
    struct Cand {
        int32_t rank, pos, new_id;
        bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::vector<int32_t>& prev = scratch.prev;
    std::vector<int32_t>& next = scratch.next;
    std::vector<char>& alive = scratch.alive;
    prev.resize(n);
    next.resize(n);
    alive.assign(n, 1);
    for (size_t i = 0; i < n; ++i) {
        prev[i] = int32_t(i) - 1;
        next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    }
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
    const auto push = [&](int32_t i) {
        if (i < 0 || next[size_t(i)] < 0) return;
        if (const Merge* m = find_merge(syms[size_t(i)], syms[size_t(next[size_t(i)])])) heap.push({m->rank, i, m->new_id});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
    while (!heap.empty()) {
        const Cand c = heap.top();
        heap.pop();
        const auto i = size_t(c.pos);
        if (!alive[i] || next[i] < 0) continue;
        const auto j = size_t(next[i]);
        const Merge* m = find_merge(syms[i], syms[j]);
        if (!m || m->new_id != c.new_id || m->rank != c.rank) continue;
        syms[i] = c.new_id;
        alive[j] = 0;
        next[i] = next[j];
        if (next[j] >= 0) prev[size_t(next[j])] = int32_t(i);
        push(prev[i]);
        push(int32_t(i));
    }
    size_t w = 0;
    for (size_t i = 0; i < n; ++i)
        if (alive[i]) syms[w++] = syms[i];
    syms.resize(w);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, Scratch& scratch) const {
    if (word.empty()) return;
    std::string& key = scratch.key;
    key.assign(word.data(), word.size());
    // The cache first: it also remembers ignore_merges hits, so a repeated word costs one lookup.
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        const auto it = cache_.find(key);
        if (it != cache_.end()) {
            out.insert(out.end(), it->second.begin(), it->second.end());
            return;
        }
    }
    std::vector<int32_t>& syms = scratch.syms;
    const auto whole = ignore_merges_ ? (byte_level_ ? byte_vocab_ : vocab_).find(key) : vocab_.end();
    if (ignore_merges_ && whole != (byte_level_ ? byte_vocab_ : vocab_).end()) {
        syms.assign(1, whole->second);
    } else {
        word_symbols(word, syms);
        merge_symbols(scratch);
    }
    out.insert(out.end(), syms.begin(), syms.end());
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mu_);
        if (cache_.size() >= kMaxCacheEntries) cache_.clear();
        cache_.emplace(key, syms);
    }
}

}  // namespace shardlm
