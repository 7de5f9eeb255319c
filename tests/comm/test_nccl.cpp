// The NCCL data plane on real GPUs (run under mpirun; one rank per GPU). Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "comm/nccl_comm.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "mpi_world.h"

using namespace shardlm;
using shardlm::test::world;

TEST(Nccl, AllReduceAndAllGatherOnDevice) {
    if (cuda_usable_device_count() == 0) GTEST_SKIP() << "no usable CUDA device";
    NcclComm nccl(world());
    const int n = nccl.size(), r = nccl.rank();
    std::vector<float> host(4097);
    for (size_t i = 0; i < host.size(); ++i) host[i] = float(r + 1) * float(i % 97);
    float* dev = nullptr;
    float* gathered = nullptr;
    CUDA_CHECK(cudaMalloc(&dev, host.size() * 4));
    CUDA_CHECK(cudaMalloc(&gathered, host.size() * 4 * size_t(n)));
    CUDA_CHECK(cudaMemcpy(dev, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
    nccl.all_gather(dev, host.size() * 4, gathered);
    nccl.all_reduce_sum(dev, host.size());
    nccl.synchronize();
    std::vector<float> sum(host.size()), all(host.size() * size_t(n));
    CUDA_CHECK(cudaMemcpy(sum.data(), dev, sum.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(all.data(), gathered, all.size() * 4, cudaMemcpyDeviceToHost));
    const float ranks = float(n * (n + 1) / 2);
    for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(sum[i], ranks * float(i % 97));
    for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < host.size(); ++i) ASSERT_EQ(all[size_t(q) * host.size() + i], float(q + 1) * float(i % 97));
    CUDA_CHECK(cudaFree(dev));
    CUDA_CHECK(cudaFree(gathered));
}
