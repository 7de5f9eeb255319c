// Per-thread scratch memory of the CPU kernels: 128-byte aligned, grown on demand and kept between
// calls. Defined in scratch.cpp, which is built with the base flags: the files built with -mavx2 or
// -mavx512* must not instantiate an inline function with external linkage (Buffer's members,
// std::vector's), since the linker keeps one copy of it for the whole program and may keep theirs,
// which would then run on a CPU without those instructions. tests/check_isa_objects.sh enforces it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace shardlm {

// Buffers a kernel holds at the same time take different slots.
enum class ScratchSlot { Panels, GroupSums, Reordered, Count };

uint8_t* kernel_scratch(ScratchSlot slot, size_t bytes);

}  // namespace shardlm
