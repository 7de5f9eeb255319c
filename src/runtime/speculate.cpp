#include "runtime/speculate.h"

#include <algorithm>

namespace shardlm {

std::vector<int32_t> lookup_draft(const int32_t* seq, int64_t n, int64_t k) {
    std::vector<int32_t> d;
    if (k <= 0) return d;
    for (int64_t g = std::min(kLookupMaxNgram, n - 1); g >= kLookupMinNgram; --g) {
        const int32_t* tail = seq + n - g;
        // The latest earlier start i (i + g <= n - 1: at least one token follows the match).
        for (int64_t i = n - g - 1; i >= 0; --i) {
            if (!std::equal(tail, tail + g, seq + i)) continue;
            // What followed it, read on into the draft itself where it runs past the end: a
            // match p tokens back proposes the text repeating with period p (a loop), not just p.
            for (int64_t j = 0, from = i + g; j < k; ++j)
                d.push_back(from + j < n ? seq[from + j] : d[size_t(from + j - n)]);
            return d;
        }
    }
    return d;
}

}  // namespace shardlm
