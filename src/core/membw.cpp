#include "core/membw.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/buffer.h"

namespace shardlm {

double measure_copy_gbps() {
    const size_t bytes = size_t(256) << 20;
    Buffer a(bytes), b(bytes);
    std::memset(a.data(), 1, bytes);
    std::memset(b.data(), 2, bytes);
    const long chunks = 64;
    const size_t chunk = bytes / size_t(chunks);
    double best = 0;
    for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(static)
        for (long c = 0; c < chunks; ++c) std::memcpy(b.data() + size_t(c) * chunk, a.data() + size_t(c) * chunk, chunk);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, 2.0 * double(bytes) / s / 1e9);
    }
    return best;
}

}  // namespace shardlm
