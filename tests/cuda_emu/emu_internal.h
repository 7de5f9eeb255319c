// What the emulator's runtime (runtime.cpp, cublas.cpp) needs from its SIMT core (scheduler.cpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

namespace shardlm_emu {

// Runs `body` once per thread of grid x block, blocks in order (reversed with
// SHARDLM_EMU_ORDER=reverse), with `smem` bytes of dynamic shared memory per block.
void run_grid(const char* name, dim3 grid, dim3 block, size_t smem, const std::function<void()>& body);

// SHARDLM_EMU_ORDER=reverse: blocks, and threads between collectives, run last to first.
bool reverse_order();

// Dynamic shared memory a launch of `fn` may ask for: 48 KiB, or what cudaFuncSetAttribute allowed.
size_t max_dynamic_smem(const void* fn);

// Prints, once per process, that CUDA runs on the emulator here.
void announce();

}  // namespace shardlm_emu
