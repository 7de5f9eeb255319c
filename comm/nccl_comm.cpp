#include "comm/nccl_comm.h"

#include <chrono>
#include <thread>

#include "kernels/cuda/cuda_check.h"

namespace shardlm {

namespace {
ncclDataType_t nccl_type(DType dt) {
    switch (dt) {
        case DType::F32: return ncclFloat32;
        case DType::F16: return ncclFloat16;
        case DType::BF16: return ncclBfloat16;
        default: break;
    }
    fail("NCCL all-reduce of ", dtype_name(dt), " is not supported");
}
}  // namespace

NcclComm::NcclComm(MpiComm& mpi) : mpi_(mpi), rank_(mpi.rank()), size_(mpi.size()) {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    if (count == 0) fail("rank ", rank_, ": no CUDA device for NCCL");
    // Before any other CUDA call of this rank: the device of its node-local rank.
    device_ = mpi.local_rank() % count;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    mpi.broadcast(&id, sizeof id, 0);
    NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
}

NcclComm::~NcclComm() {
    if (comm_) {
        if (aborted_) ncclCommAbort(comm_);
        else ncclCommDestroy(comm_);
    }
    if (stream_) cudaStreamDestroy(stream_);
}

void NcclComm::all_reduce_sum(void* data, size_t n, DType dt) {
    NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(dt), ncclSum, comm_, stream_));
}

void NcclComm::all_gather(const void* in, size_t bytes, void* out) {
    NCCL_CHECK(ncclAllGather(in, out, bytes, ncclUint8, comm_, stream_));
}

void NcclComm::broadcast(void* data, size_t bytes, int root) {
    NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
}

void NcclComm::synchronize(int timeout_ms) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
        const cudaError_t q = cudaStreamQuery(stream_);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) CUDA_CHECK(q);
        ncclResult_t async = ncclSuccess;
        NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
        const auto waited = std::chrono::steady_clock::now() - t0;
        if (async != ncclSuccess || waited > std::chrono::milliseconds(timeout_ms)) {
            // A peer failed or hangs: tear the communicator down so no kernel waits forever.
            ncclCommAbort(comm_);
            comm_ = nullptr;
            aborted_ = true;
            if (async != ncclSuccess) fail("rank ", rank_, ": NCCL error from a peer: ", ncclGetErrorString(async));
            fail("rank ", rank_, ": NCCL collective did not finish within ", timeout_ms, " ms");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

void NcclComm::barrier() {
    synchronize();
    mpi_.barrier();
}

void NcclComm::abort(int code) {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
    mpi_.abort(code);
}

}  // namespace shardlm
