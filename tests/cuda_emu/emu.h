// The CPU CUDA emulator's internal interface: what the device-code shim (cuda_emu.h, force-included
// into kernels/cuda/*.cu compiled as C++) and the host-side launch path (kernels/cuda/launch.h)
// call, implemented by scheduler.cpp (threads, blocks, collectives) and runtime.cpp (streams,
// memory, graphs). See README.md, "The CUDA emulator".
//
// Model: a launch runs its blocks one after another on the calling host thread; inside a block
// every CUDA thread is a fiber with its own small stack. A fiber runs until it finishes or reaches
// a collective (__syncthreads, __syncwarp, a shuffle, a vote, a match); when no fiber can run, the
// collectives whose participants have all arrived complete and their fibers run again. Everything
// a stream does happens at the call (streams are synchronous), except while a stream is being
// captured, when it is recorded for cudaGraphLaunch to replay.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

namespace shardlm_emu {

// Where device code called a collective, filled in at the call site by a default argument, so
// that a divergence or a deadlock report names the line.
struct Site {
    const char* file;
    int line;
};
#define SHARDLM_EMU_HERE ::shardlm_emu::Site{__builtin_FILE(), __builtin_LINE()}

// The running thread's and block's built-in variables, set by the scheduler before it switches
// to a thread; threadIdx & co. (cuda_emu.h) are read-only references to them.
extern uint3 g_thread_idx, g_block_idx;
extern dim3 g_block_dim, g_grid_dim;

enum class Op : uint8_t { None, SyncThreads, SyncWarp, ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, MatchAny, Call };

// Blocks the calling CUDA thread until every lane of `mask` has reached the same warp collective,
// then returns this lane's result (raw bits): the shuffled value, the ballot, the match mask.
uint64_t warp_collective(Op op, unsigned mask, uint64_t value, int arg, int width, Site site);
// A warp-synchronous instruction that combines the lanes' registers (mma.sync): each lane of
// `mask` brings its operands in a struct that starts with a WarpCall; when the last one arrives,
// `fn` runs once with every lane's struct (null outside the mask) while they all still wait, so it
// can read all the inputs and write each lane's outputs. All lanes must bring the same fn.
struct WarpCall {
    void (*fn)(WarpCall* const* lanes);
};
void warp_call(WarpCall* mine, unsigned mask, Site site);

// __syncthreads(): every thread of the block that has not exited.
void sync_threads(Site site);

// The running block's dynamic shared memory (the launch's smem bytes, followed by a guard page).
void* dynamic_smem();

// Reports a fault of the running kernel (its name, block and thread) and aborts the process: a
// real GPU would stop the kernel with an error, and the tests should stop at the first one.
[[noreturn]] void device_fault(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// One launch: validates the configuration like cudaLaunchKernelEx and runs `body` once per CUDA
// thread of the grid, now or (on a capturing stream) at each replay of the graph.
cudaError_t submit_launch(const char* name, const void* fn, const cudaLaunchConfig_t& cfg,
                          std::function<void()> body);

// A kernel's pointer argument must be null, device memory or pinned host memory (or just past the
// end of one): anything else is a host pointer the GPU cannot read. Faults naming the kernel.
void check_pointer_argument(const char* kernel, int index, const void* p);

template <typename Tuple, size_t... I>
void check_pointer_arguments(const char* kernel, const Tuple& t, std::index_sequence<I...>) {
    auto one = [kernel](int index, const auto& v) {
        if constexpr (std::is_pointer_v<std::decay_t<decltype(v)>>) check_pointer_argument(kernel, index, (const void*)v);
    };
    (one(int(I), std::get<I>(t)), ...);
}

// kernel<<<cfg>>>(args...): the arguments are converted to the kernel's parameter types and
// copied now, as cudaLaunchKernelEx does, so a captured graph replays these values.
template <typename... Params, typename... Args>
cudaError_t launch(const char* name, const cudaLaunchConfig_t& cfg, void (*kernel)(Params...), Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "kernel called with the wrong number of arguments");
    auto params = std::make_shared<const std::tuple<std::decay_t<Params>...>>(std::forward<Args>(args)...);
    check_pointer_arguments(name, *params, std::index_sequence_for<Params...>{});
    return submit_launch(name, reinterpret_cast<const void*>(kernel), cfg,
                         [kernel, params] { std::apply(kernel, *params); });
}

// Runs `op` on `stream` now, or records it when the stream is being captured (runtime.cpp).
cudaError_t enqueue(cudaStream_t stream, std::function<void()> op);

// Whether [p, p + bytes) lies inside one live device allocation.
bool is_device_range(const void* p, size_t bytes);

}  // namespace shardlm_emu
