// kv_shift_cuda against kv_shift_ref (kernels/cpu/kv_shift.h) for every cache dtype, on the shapes
// of kv_shift_test_util.h (moves of one wave and of several: the kernel's overlapping move), in the
// middle slot of three; skips where no GPU is usable. V rows and scales must be the reference's
// bits, K rows its values to within one rounding of the cache dtype (sincosf against the CPU's
// cos/sin can move a value across a rounding boundary), and every row the shift does not own
// (sinks, rows from len on, other slots) must keep its bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kv_shift.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/kv_shift.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kv_shift_test_util.h"

using namespace shardlm;
using namespace shardlm::test;

TEST(KVShiftCuda, EqualsTheReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    for (const DType d : {DType::F32, DType::F16, DType::BF16, DType::I8})
        for (const ShiftCase& c : shift_cases(d)) {
            HostKV want = make_host_kv(c, 3, 29);
            const HostKV before = want;
            DeviceBuffer<uint8_t> k(want.k), v(want.v);
            DeviceBuffer<float> ks(want.ks), vs(want.vs), inv(want.inv_freq);
            DeviceKVLayer layer;
            layer.k = k.get();
            layer.v = v.get();
            layer.k_scales = d == DType::I8 ? ks.get() : nullptr;
            layer.v_scales = d == DType::I8 ? vs.get() : nullptr;
            layer.dtype = d;
            layer.n_slots = 3;
            layer.n_kv_heads = c.n_kv_heads;
            layer.capacity = c.capacity;
            layer.row_stride = want.row_stride;
            kv_shift_cuda(layer, 1, c.keep, c.discard, c.len, c.head_dim, inv.get(), nullptr);
            kv_shift_ref(want.view(1), c.keep, c.discard, c.len, want.inv_freq.data());
            HostKV got = before;
            got.k = k.download();
            got.v = v.download();
            if (d == DType::I8) {
                got.ks = ks.download();
                got.vs = vs.download();
            }
            const size_t row = size_t(want.row_stride) * dtype_size(d), sb = want.slot_bytes();
            const float step = d == DType::F16    ? 1e-3f
                               : d == DType::BF16 ? 8e-3f
                               : d == DType::I8   ? 1.1f / 127.0f
                                                  : 1e-6f;
            std::vector<float> a(size_t(c.head_dim)), b(size_t(c.head_dim));
            for (int64_t s = 0; s < 3; ++s)
                for (int64_t h = 0; h < c.n_kv_heads; ++h)
                    for (int64_t r = 0; r < c.capacity; ++r) {
                        SCOPED_TRACE(testing::Message()
                                     << dtype_name(d) << " heads " << c.n_kv_heads << " d " << c.head_dim << " keep "
                                     << c.keep << " discard " << c.discard << " len " << c.len << " slot " << s
                                     << " head " << h << " row " << r);
                        const size_t off = size_t(s) * sb + size_t(h * c.capacity + r) * row;
                        const size_t si = size_t((s * c.n_kv_heads + h) * c.capacity + r);
                        const bool moved = s == 1 && r >= c.keep && r < c.len - c.discard;
                        const bool stale = s == 1 && r >= c.len - c.discard && r < c.len;
                        if (stale) continue;
                        ASSERT_EQ(0, std::memcmp(&got.v[off], &want.v[off], row));
                        if (d == DType::I8) {
                            ASSERT_EQ(got.vs[si], want.vs[si]);
                        }
                        if (!moved) {
                            ASSERT_EQ(0, std::memcmp(&got.k[off], &before.k[off], row));
                            if (d == DType::I8) {
                                ASSERT_EQ(got.ks[si], before.ks[si]);
                            }
                            continue;
                        }
                        kv_row_load(got.view(s), 0, h, r, a.data());
                        kv_row_load(want.view(s), 0, h, r, b.data());
                        for (int64_t i = 0; i < c.head_dim; ++i)
                            ASSERT_NEAR(a[size_t(i)], b[size_t(i)], step * (1.0f + std::fabs(b[size_t(i)])))
                                << "element " << i;
                    }
        }
}

TEST(KVShiftCuda, BadRangesAreRefused) {
    DeviceKVLayer layer;
    layer.dtype = DType::F16;
    layer.n_slots = 2;
    layer.n_kv_heads = 1;
    layer.capacity = 16;
    layer.row_stride = 64;
    EXPECT_THROW(kv_shift_cuda(layer, 2, 0, 4, 16, 64, nullptr, nullptr),
                 Error);  // no such slot
    EXPECT_THROW(kv_shift_cuda(layer, 0, 0, 4, 17, 64, nullptr, nullptr),
                 Error);  // past the capacity
    EXPECT_THROW(kv_shift_cuda(layer, 0, 4, 0, 16, 64, nullptr, nullptr),
                 Error);  // nothing discarded
    EXPECT_THROW(kv_shift_cuda(layer, 0, 0, 4, 16, 65, nullptr, nullptr),
                 Error);  // odd head_dim
    EXPECT_THROW(kv_shift_cuda(layer, 0, 0, 4, 16, 512, nullptr, nullptr),
                 Error);  // head too large
}
