// stream_read_cuda against the host's wrapping sum of the same 32-bit words: buffers of one
// partial round, of several rounds with a tail, and two launches adding into one sum (the second
// waits for the first under PDL); skips where no GPU is usable.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/stream_read.h"
#include "tests/kernels/cuda_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

TEST(StreamReadCuda, SumsEveryWord) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const size_t words : {size_t(4), size_t(4 * 37), size_t(4 * 300013)}) {
        std::vector<uint32_t> host(words);
        uint32_t want = 0;
        for (size_t i = 0; i < words; ++i) {
            host[i] = uint32_t(i * 2654435761u + 12345u);
            want += host[i];
        }
        DeviceBuffer<uint32_t> buf(host), sum(std::vector<uint32_t>{7u});
        stream_read_cuda(buf.get(), words * 4, sum.get(), nullptr);
        EXPECT_EQ(sum.download()[0], want + 7u) << words << " words";
        stream_read_cuda(buf.get(), words * 4, sum.get(), nullptr);
        EXPECT_EQ(sum.download()[0], 2 * want + 7u) << words << " words, twice";
    }
    DeviceBuffer<uint32_t> odd(std::vector<uint32_t>(8)), sum(std::vector<uint32_t>{0u});
    EXPECT_THROW(stream_read_cuda(odd.get(), 20, sum.get(), nullptr), Error);
}
