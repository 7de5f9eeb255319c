// rmsnorm_cuda against the CPU reference on awkward shapes; skips where no GPU is usable.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/rmsnorm.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/rmsnorm.h"

using namespace shardlm;

TEST(RmsNormCuda, MatchesReference) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {5, 33}, {2, 255}, {7, 2048}, {1, 5000}, {64, 129}};
    for (const auto& s : shapes) {
        const int64_t rows = s[0], dim = s[1];
        std::vector<float> x(size_t(rows * dim)), w(static_cast<size_t>(dim)), ref(x.size()), got(x.size());
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.37f) * 3.0f;
        for (size_t i = 0; i < w.size(); ++i) w[i] = 1.0f + 0.01f * float(i % 17);
        rmsnorm_ref(x.data(), w.data(), ref.data(), rows, dim, 1e-6f);
        float *dx, *dw, *dy;
        CUDA_CHECK(cudaMalloc(&dx, x.size() * 4));
        CUDA_CHECK(cudaMalloc(&dw, w.size() * 4));
        CUDA_CHECK(cudaMalloc(&dy, x.size() * 4));
        CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
        rmsnorm_cuda(dx, dw, dy, rows, dim, 1e-6f, nullptr);
        CUDA_CHECK(cudaMemcpy(got.data(), dy, x.size() * 4, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(dx));
        CUDA_CHECK(cudaFree(dw));
        CUDA_CHECK(cudaFree(dy));
        for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], ref[i], 1e-5 + 1e-5 * std::fabs(ref[i])) << rows << "x" << dim << " at " << i;
    }
}
