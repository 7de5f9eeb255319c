// Memory the machine can still back, to refuse a large allocation before touching it.
//
// Why: under Linux's default overcommit (vm.overcommit_memory 0) the allocator grants more than
// the machine holds; the missing pages only show when they are touched, and then the OOM killer
// ends the process with SIGKILL and no message. A buffer that is touched at once (the KV cache is
// zeroed when allocated) is compared with this figure first, so that a --ctx x batch too large for
// the machine is refused with one line naming the flags and the bytes instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

struct HostMemory {
    size_t bytes = SIZE_MAX;  // SIZE_MAX: unknown, nothing is refused
    const char* source = "unknown";  // where the figure came from, for messages
};

// The environment variable that replaces the figure (a byte count): tests, or a cap on what one
// job may take where several share a machine (the job's ranks on the node divide it, as they
// divide the machine's own figure: runtime/kv_cache.h).
constexpr const char* kHostMemEnv = "SHARDLM_HOST_MEM_AVAILABLE";

// $SHARDLM_HOST_MEM_AVAILABLE when set (throws Error unless it is a byte count); else MemAvailable
// + SwapFree from /proc/meminfo (what can be had without the OOM killer: free and reclaimable RAM,
// and swap); else sysinfo()'s free RAM + buffers + free swap; else unknown. Read anew on each call
// (other processes, and this one's earlier allocations, change it).
HostMemory host_memory_available();

// MemAvailable + SwapFree in bytes from the text of a /proc/meminfo ("MemAvailable: 123 kB" lines);
// SIZE_MAX when it has no MemAvailable line (kernels before 3.14).
size_t meminfo_available_bytes(const std::string& meminfo);

}  // namespace shardlm
