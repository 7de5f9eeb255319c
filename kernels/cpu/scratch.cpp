#include "kernels/cpu/scratch.h"

#include "core/buffer.h"

namespace shardlm {

uint8_t* kernel_scratch(ScratchSlot slot, size_t bytes) {
    thread_local Buffer bufs[size_t(ScratchSlot::Count)];
    Buffer& b = bufs[size_t(slot)];
    if (b.size() < bytes) b = Buffer(bytes);
    return b.data();
}

}  // namespace shardlm
