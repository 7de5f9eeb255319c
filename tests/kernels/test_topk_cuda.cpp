// topk_rows_cuda against topk_ref (kernels/cpu/topk.h): one-segment and segmented rows up to 256k,
// k up to kTopKMax, ties straddling the k-th place, signed zeros, infinities and NaN, id offsets,
// an unaligned base, guard zones after every output, and a captured graph replayed on new inputs.
// Argument checks run without a GPU; the rest skips where none is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/topk.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/topk.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/int8_test_util.h"

using namespace shardlm;
using shardlm::test::DeviceBuffer;

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();
constexpr size_t kGuard = 64;  // elements (or bytes of scratch) after each output that must stay untouched

float from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

// Device buffers for one call, each followed by a guard zone filled with a pattern.
struct Outputs {
    Outputs(int64_t rows, int64_t k, size_t scratch_bytes)
        : vals(std::vector<float>(size_t(rows * k) + kGuard, from_bits(0x7fa5a5a5u))),
          ids(std::vector<int32_t>(size_t(rows * k) + kGuard, -7)),
          scratch(std::vector<uint8_t>(scratch_bytes + kGuard, uint8_t(0xab))),
          scratch_bytes(scratch_bytes) {}
    DeviceBuffer<float> vals;
    DeviceBuffer<int32_t> ids;
    DeviceBuffer<uint8_t> scratch;
    size_t scratch_bytes;
};

// Compares the device results with topk_ref row by row (ids and value bits) and checks the guards.
void expect_matches(const std::vector<float>& x, int64_t rows, int64_t n, int64_t k, int32_t id_offset,
                    const Outputs& out, const std::string& what) {
    const std::vector<float> vals = out.vals.download();
    const std::vector<int32_t> ids = out.ids.download();
    const std::vector<uint8_t> scratch = out.scratch.download();
    std::vector<float> want_v(static_cast<size_t>(k));
    std::vector<int32_t> want_i(static_cast<size_t>(k));
    for (int64_t r = 0; r < rows; ++r) {
        topk_ref(x.data() + r * n, n, k, want_v.data(), want_i.data());
        for (int64_t j = 0; j < k; ++j) {
            const size_t at = size_t(r * k + j);
            ASSERT_EQ(ids[at], want_i[size_t(j)] + id_offset) << what << " row " << r << " #" << j;
            ASSERT_EQ(bits(vals[at]), bits(want_v[size_t(j)])) << what << " row " << r << " #" << j << " value "
                                                                 << want_v[size_t(j)];
        }
    }
    for (size_t g = 0; g < kGuard; ++g) {
        ASSERT_EQ(bits(vals[size_t(rows * k) + g]), 0x7fa5a5a5u) << what << " vals guard " << g;
        ASSERT_EQ(ids[size_t(rows * k) + g], -7) << what << " ids guard " << g;
        ASSERT_EQ(scratch[out.scratch_bytes + g], 0xab) << what << " scratch guard " << g;
    }
}

// Runs rows x n (placed `offset` floats into the device buffer) with k, and compares.
void check(const std::vector<float>& x, int64_t rows, int64_t n, int64_t k, int64_t offset, int32_t id_offset,
           const std::string& what) {
    std::vector<float> padded(size_t(offset) + x.size(), 0.0f);
    std::copy(x.begin(), x.end(), padded.begin() + offset);
    DeviceBuffer<float> dx(padded);
    Outputs out(rows, k, topk_scratch_bytes(rows, n, k));
    topk_rows_cuda(dx.get() + offset, rows, n, k, id_offset, out.vals.get(), out.ids.get(), out.scratch.get(), nullptr);
    expect_matches(x, rows, n, k, id_offset, out,
                   what + " " + std::to_string(rows) + "x" + std::to_string(n) + " k " + std::to_string(k) +
                       " offset " + std::to_string(offset));
}

// Row r of rows x n with a pattern chosen by r: random with many ties (20001 levels), one constant
// value, a sawtooth (each value repeated n/1000 times), and random with the value at the k-th
// place planted again at spots across the row, so its ties straddle the k-th place.
std::vector<float> make_rows(int64_t rows, int64_t n, int64_t k, uint32_t seed) {
    std::vector<float> x = test::rand_vec(size_t(rows * n), seed, 30.0f);
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x.data() + r * n;
        switch ((r + seed) % 4) {
            case 0: break;
            case 1: std::fill(row, row + n, 1.5f); break;
            case 2:
                for (int64_t i = 0; i < n; ++i) row[i] = float(i % 1000) * 0.25f - 100.0f;
                break;
            case 3: {
                std::vector<float> v(static_cast<size_t>(k));
                std::vector<int32_t> id(static_cast<size_t>(k));
                topk_ref(row, n, k, v.data(), id.data());
                const float kth = v[size_t(k - 1)];
                const int64_t spots = std::min<int64_t>(n, 8 + k / 4);
                for (int64_t s = 0; s < spots; ++s) row[(s * 7919 + r * 131) % n] = kth;
                break;
            }
        }
    }
    return x;
}

}  // namespace

TEST(TopKCuda, MatchesRef) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const int64_t shapes[][2] = {{1, 1}, {3, 5}, {2, 1023}, {4, 4099}, {2, 151936}, {1, 262147}, {8, 32000},
                                 {2, 4096}, {2, 8193}, {1, 16385}};
    const int64_t ks[] = {1, 2, 40, 50, 257, 1024};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], n = s[1];
        for (const int64_t k : ks) {
            if (k > n) continue;
            const std::vector<float> x = make_rows(rows, n, k, uint32_t(n + k));
            check(x, rows, n, k, 0, 0, "random");
            check(x, rows, n, k, 1, 151936, "random");  // unaligned base, a second rank's ids
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
    // k = n: the whole row, ranked.
    for (const int64_t n : {int64_t(5), int64_t(700), int64_t(1024)}) check(make_rows(3, n, n, 9), 3, n, n, 0, 3, "k = n");
}

TEST(TopKCuda, SpecialValues) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const float neg_nan = from_bits(0xffc00001u), snan = from_bits(0x7f800001u);
    const float dmin = std::numeric_limits<float>::denorm_min(), fmax = std::numeric_limits<float>::max();
    for (const int64_t n : {int64_t(4099), int64_t(151936)}) {
        const int64_t rows = 8;
        std::vector<float> x(size_t(rows * n));
        uint32_t s = uint32_t(n);
        auto next = [&s] { return (s = s * 1664525u + 1013904223u) >> 8; };
        for (int64_t r = 0; r < rows; ++r) {
            float* row = x.data() + r * n;
            for (int64_t i = 0; i < n; ++i) {
                const uint32_t u = next() % 1000;
                switch (r) {
                    case 0: row[i] = kNaN; break;                                  // all NaN
                    case 1: row[i] = u < 3 ? float(u) - 1.0f : (u & 1 ? kNaN : neg_nan); break;  // few numbers
                    case 2: row[i] = i % 3 == 0 ? kInf : i % 3 == 1 ? -kInf : kNaN; break;
                    case 3: row[i] = u < 1 ? kInf : u < 200 ? -kInf : (u & 1 ? snan : kNaN); break;
                    case 4: row[i] = u < 600 ? (u & 1 ? -0.0f : 0.0f) : u < 601 ? 1.0f : -float(u); break;  // signed zeros
                    case 5: row[i] = u < 300 ? dmin : u < 600 ? -dmin : u < 605 ? fmax : u < 610 ? -fmax : -0.0f; break;
                    case 6: row[i] = -kInf; break;
                    default: row[i] = u < 500 ? kNaN : float(u % 7) - 3.0f; break;
                }
            }
        }
        for (const int64_t k : {1, 2, 40, 50, 257, 1024}) {
            check(x, rows, n, k, 0, 0, "special");
            check(x, rows, n, k, 1, 17, "special");
            if (::testing::Test::HasFatalFailure()) return;
        }
    }
}

// Captured once, replayed on new inputs written into the same buffers: the graph reads them anew.
TEST(TopKCuda, GraphReplayFollowsInputs) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    struct Case { int64_t rows, n, k; };
    for (const Case c : {Case{3, 151936, 50}, Case{2, 32000, 1024}, Case{2, 3000, 40}}) {
        const int64_t rows = c.rows, n = c.n, k = c.k;
        const std::vector<float> a = make_rows(rows, n, k, 1), b = make_rows(rows, n, k, 2);
        DeviceBuffer<float> dx(a);
        Outputs out(rows, k, topk_scratch_bytes(rows, n, kTopKMax));  // sized for the largest k, as engines do
        cudaStream_t stream;
        CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        // One eager run first (lazily loaded kernels load outside the capture).
        topk_rows_cuda(dx.get(), rows, n, k, 5, out.vals.get(), out.ids.get(), out.scratch.get(), stream);
        CUDA_CHECK(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
        topk_rows_cuda(dx.get(), rows, n, k, 5, out.vals.get(), out.ids.get(), out.scratch.get(), stream);
        CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
        CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        const std::string what = std::to_string(rows) + "x" + std::to_string(n) + " k " + std::to_string(k);
        for (const auto* in : {&b, &a}) {
            dx.upload(*in);
            CUDA_CHECK(cudaGraphLaunch(exec, stream));
            CUDA_CHECK(cudaStreamSynchronize(stream));
            expect_matches(*in, rows, n, k, 5, out, "graph " + what + (in == &b ? " inputs b" : " inputs a"));
        }
        CUDA_CHECK(cudaGraphExecDestroy(exec));
        CUDA_CHECK(cudaGraphDestroy(graph));
        CUDA_CHECK(cudaStreamDestroy(stream));
        if (::testing::Test::HasFatalFailure()) return;
    }
}

// Argument checks happen before any CUDA call, so they run without a GPU.
TEST(TopKCuda, RejectsBadArguments) {
    float* fake = reinterpret_cast<float*>(uintptr_t(256));  // never dereferenced: each call throws first
    int32_t* fake_i = reinterpret_cast<int32_t*>(uintptr_t(512));
    void* scratch = reinterpret_cast<void*>(uintptr_t(1024));
    EXPECT_THROW(topk_rows_cuda(fake, 1, 100, 0, 0, fake, fake_i, scratch, nullptr), Error);      // k = 0
    EXPECT_THROW(topk_rows_cuda(fake, 1, 100, 101, 0, fake, fake_i, scratch, nullptr), Error);    // k > n
    EXPECT_THROW(topk_rows_cuda(fake, 1, 5000, kTopKMax + 1, 0, fake, fake_i, scratch, nullptr), Error);
    EXPECT_THROW(topk_rows_cuda(fake, 1, 0, 1, 0, fake, fake_i, scratch, nullptr), Error);        // n = 0
    EXPECT_THROW(topk_rows_cuda(fake, -1, 100, 1, 0, fake, fake_i, scratch, nullptr), Error);
    EXPECT_THROW(topk_rows_cuda(fake, 1, 100, 1, INT32_MAX - 50, fake, fake_i, scratch, nullptr), Error);
    EXPECT_THROW(topk_rows_cuda(fake, 1, 100, 1, -1, fake, fake_i, scratch, nullptr), Error);
    EXPECT_THROW(topk_rows_cuda(fake, 2, 151936, 40, 0, fake, fake_i, nullptr, nullptr), Error);  // no scratch
    EXPECT_NO_THROW(topk_rows_cuda(fake, 0, 100, 1, 0, fake, fake_i, scratch, nullptr));          // no rows: no launch
    EXPECT_THROW(topk_scratch_bytes(1, 100, 0), Error);
    EXPECT_THROW(topk_scratch_bytes(1, 100, kTopKMax + 1), Error);
    EXPECT_THROW(topk_scratch_bytes(1, 0, 1), Error);
    EXPECT_THROW(topk_scratch_bytes(-1, 100, 1), Error);
}

// One buffer sized for (rows, n, k) serves any fewer rows and smaller k; k above n is clamped.
TEST(TopKCuda, ScratchSizeIsMonotone) {
    for (const int64_t n : {int64_t(1), int64_t(1000), int64_t(4097), int64_t(32000), int64_t(151936),
                            int64_t(262147)}) {
        size_t prev = 0;
        for (int64_t k = 1; k <= kTopKMax; ++k) {
            const size_t b = topk_scratch_bytes(3, n, k);
            ASSERT_GE(b, prev) << "n " << n << " k " << k;
            ASSERT_LE(topk_scratch_bytes(2, n, k), b) << "n " << n << " k " << k;
            prev = b;
        }
        EXPECT_EQ(topk_scratch_bytes(3, n, kTopKMax), topk_scratch_bytes(3, n, std::min<int64_t>(n, kTopKMax)));
        EXPECT_EQ(topk_scratch_bytes(0, n, 1), 0u);
    }
}
