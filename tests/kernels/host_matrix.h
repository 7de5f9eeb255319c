// A weight matrix in host memory in its storage dtype, shared by the GEMV and GEMM tests: random
// F32/F16/BF16 values, or INT8 with its scales (make_quant_mat of int8_test_util.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/weights_view.h"
#include "tests/kernels/int8_test_util.h"

namespace shardlm::test {

// A weight matrix in host memory in its storage dtype (I8: quantized with its scales).
struct HostMat {
    DType dtype = DType::F32;
    int64_t rows = 0, cols = 0, group = 0;
    std::vector<uint8_t> bytes;
    std::vector<float> scales;
    WeightView view() const {
        WeightView v;
        v.dtype = dtype;
        v.data = bytes.data();
        v.rows = rows;
        v.cols = cols;
        if (dtype == DType::I8) {
            v.scales = scales.data();
            v.group_size = group;
        }
        return v;
    }
};

inline HostMat make_mat(DType dtype, int64_t rows, int64_t cols, int64_t group, uint32_t seed) {
    HostMat m;
    m.dtype = dtype;
    m.rows = rows;
    m.cols = cols;
    m.group = group;
    const size_t count = size_t(rows * cols);
    if (dtype == DType::I8) {
        QuantMat q = make_quant_mat(rows, cols, group, seed);
        m.bytes.resize(count);
        std::memcpy(m.bytes.data(), q.q.data(), count);
        m.scales = q.scales;
        return m;
    }
    const std::vector<float> v = rand_vec(count, seed);
    m.bytes.resize(count * dtype_size(dtype));
    for (size_t i = 0; i < count; ++i) {
        if (dtype == DType::F32) {
            std::memcpy(m.bytes.data() + 4 * i, &v[i], 4);
        } else {
            const uint16_t h = dtype == DType::F16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
            std::memcpy(m.bytes.data() + 2 * i, &h, 2);
        }
    }
    return m;
}

}  // namespace shardlm::test
