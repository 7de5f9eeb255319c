#include "comm/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>
#include <vector>

namespace shardlm {

std::string mpi_error_string(int rc) {
    char buf[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
    return std::string(buf, size_t(len));
}

MpiComm::MpiComm(int* argc, char*** argv) {
    int inited = 0;
    MPI_CHECK(MPI_Initialized(&inited));
    if (!inited) {
        int provided = 0;
        // Only the main thread calls MPI; OpenMP threads never do.
        MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
        owns_init_ = true;
    }
    MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank_));
    MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size_));
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &local_rank_));
    MPI_CHECK(MPI_Comm_size(node, &local_size_));
    MPI_CHECK(MPI_Comm_free(&node));
}

MpiComm::~MpiComm() {
    if (owns_init_) MPI_Finalize();  // no check: destructors must not throw
}

void MpiComm::all_reduce_sum(void* data, size_t n, DType dt) {
    std::vector<float> wide;
    float* f = static_cast<float*>(data);
    if (dt != DType::F32) {
        // MPI has no 16-bit float sum: reduce in f32 and round back once.
        SHARDLM_CHECK(dt == DType::F16 || dt == DType::BF16, "all_reduce of ", dtype_name(dt));
        const uint16_t* h = static_cast<const uint16_t*>(data);
        wide.resize(n);
        for (size_t i = 0; i < n; ++i) wide[i] = dt == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
        f = wide.data();
    }
    // MPI counts are int: reduce in pieces for very large buffers.
    for (size_t off = 0; off < n; off += size_t(INT_MAX)) {
        const int cnt = int(std::min(n - off, size_t(INT_MAX)));
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, f + off, cnt, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
    }
    if (dt == DType::F32) return;
    uint16_t* h = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < n; ++i) h[i] = dt == DType::F16 ? f32_to_f16(wide[i]) : f32_to_bf16(wide[i]);
}

void MpiComm::all_gather(const void* in, size_t bytes, void* out) {
    SHARDLM_CHECK(bytes <= size_t(INT_MAX), "all_gather of ", bytes, " bytes per rank");
    MPI_CHECK(MPI_Allgather(in, int(bytes), MPI_BYTE, out, int(bytes), MPI_BYTE, MPI_COMM_WORLD));
}

void MpiComm::broadcast(void* data, size_t bytes, int root) {
    auto* p = static_cast<uint8_t*>(data);
    for (size_t off = 0; off < bytes; off += size_t(INT_MAX)) {
        const int cnt = int(std::min(bytes - off, size_t(INT_MAX)));
        MPI_CHECK(MPI_Bcast(p + off, cnt, MPI_BYTE, root, MPI_COMM_WORLD));
    }
}

// MPI_Bcast polls until the data comes (OpenMPI's progress loop spins): a rank that waits
// seconds for rank 0's user burns a core. A non-blocking broadcast tested with growing naps
// costs a few wake-ups per millisecond instead.
void MpiComm::broadcast_idle(void* data, size_t bytes, int root) {
    SHARDLM_CHECK(bytes <= size_t(INT_MAX), "broadcast_idle of ", bytes, " bytes");
    MPI_Request req;
    MPI_CHECK(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req));
    using namespace std::chrono;
    const auto start = steady_clock::now();
    microseconds nap(50);
    for (;;) {
        int done = 0;
        MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
        if (done) return;
        if (steady_clock::now() - start < microseconds(200)) continue;  // a busy loop's message is near
        std::this_thread::sleep_for(nap);
        nap = std::min<microseconds>(nap * 2, milliseconds(2));
    }
}

void MpiComm::barrier() { MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD)); }

void MpiComm::abort(int code) {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case it does
}

}  // namespace shardlm
