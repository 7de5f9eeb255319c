// kv_shift_ref (the context shift of --context-overflow slide) in closed form: after the shift, K
// row r >= keep decodes to RoPE(x_{r + discard}, r), what prefilling the kept tokens at their new
// positions would have written (up to one more rotation's and one more rounding's error); V rows
// and scales move bit for bit; the sinks, the rows from len on and the other slots keep every byte.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/rope.h"
#include "tests/kernels/kv_shift_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

// Error allowed in a decoded key (values in [-1.5, 1.5]): two roundings of the cache dtype.
float key_tolerance(DType d) {
    switch (d) {
        case DType::F16:
            return 2e-3f;
        case DType::BF16:
            return 2e-2f;
        case DType::I8:
            return 2.5f * 1.5f / 127.0f;
        default:
            return 2e-5f;
    }
}

}  // namespace

TEST(KVShift, MovedKeysAreRotatedToTheirNewPositions) {
    for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const ShiftCase& c : shift_cases(d)) {
            HostKV kv = make_host_kv(c, 3, 11);
            const HostKV before = kv;
            kv_shift_ref(kv.view(1), c.keep, c.discard, c.len, kv.inv_freq.data());
            const size_t es = dtype_size(d), row = size_t(kv.row_stride) * es, sb = kv.slot_bytes();
            const KVSlotView v = kv.view(1);
            std::vector<float> got(size_t(c.head_dim)), want(size_t(c.head_dim));
            for (int64_t h = 0; h < c.n_kv_heads; ++h)
                for (int64_t r = 0; r < c.capacity; ++r) {
                    const size_t off = sb + size_t(h * c.capacity + r) * row;
                    const size_t si = size_t((c.n_kv_heads + h) * c.capacity + r);  // slot 1's scale
                    SCOPED_TRACE(testing::Message() << dtype_name(d) << " heads " << c.n_kv_heads << " d " << c.head_dim
                                                    << " keep " << c.keep << " discard " << c.discard << " len "
                                                    << c.len << " head " << h << " row " << r);
                    if (r < c.keep || r >= c.len) {  // untouched
                        ASSERT_EQ(0, std::memcmp(&kv.k[off], &before.k[off], row));
                        ASSERT_EQ(0, std::memcmp(&kv.v[off], &before.v[off], row));
                        if (d == DType::I8) {
                            ASSERT_EQ(kv.ks[si], before.ks[si]);
                        }
                        continue;
                    }
                    if (r >= c.len - c.discard) continue;  // stale, never read
                    // V: the row `discard` further up, bit for bit (padding too), with its scale.
                    const size_t src = off + size_t(c.discard) * row;
                    ASSERT_EQ(0, std::memcmp(&kv.v[off], &before.v[src], row));
                    if (d == DType::I8) {
                        ASSERT_EQ(kv.vs[si], before.vs[si + size_t(c.discard)]);
                    }
                    // K: RoPE of the raw key at its new position.
                    kv_row_load(v, 0, h, r, got.data());
                    std::memcpy(want.data(), kv.raw(1, h, r + c.discard), want.size() * sizeof(float));
                    rope_ref(want.data(), 1, c.head_dim, r, kv.inv_freq.data());
                    for (int64_t i = 0; i < c.head_dim; ++i)
                        ASSERT_NEAR(got[size_t(i)], want[size_t(i)], key_tolerance(d)) << "element " << i;
                }
            // The other slots keep every byte.
            for (const int64_t s : {0, 2}) {
                ASSERT_EQ(0, std::memcmp(&kv.k[size_t(s) * sb], &before.k[size_t(s) * sb], sb));
                ASSERT_EQ(0, std::memcmp(&kv.v[size_t(s) * sb], &before.v[size_t(s) * sb], sb));
            }
        }
}

TEST(KVShift, BadRangesAreRefused) {
    HostKV kv = make_host_kv({DType::F32, 1, 4, 8, 0, 1, 8}, 1, 3);
    const KVSlotView v = kv.view(0);
    EXPECT_THROW(kv_shift_ref(v, 0, 0, 8, kv.inv_freq.data()),
                 Error);                                                // nothing discarded
    EXPECT_THROW(kv_shift_ref(v, 4, 5, 8, kv.inv_freq.data()), Error);  // past len
    EXPECT_THROW(kv_shift_ref(v, 0, 2, 9, kv.inv_freq.data()),
                 Error);  // past the capacity
    EXPECT_THROW(kv_shift_ref(v, -1, 2, 8, kv.inv_freq.data()), Error);
}
