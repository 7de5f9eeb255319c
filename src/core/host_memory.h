// Memory the machine can still back, to refuse a large allocation before touching it.
//
// Why: under Linux's default overcommit (vm.overcommit_memory 0) the allocator grants more than
// the machine holds; the missing pages only show when they are touched, and then the OOM killer
// ends the process with SIGKILL and no message. A buffer that is touched at once (the KV cache is
// zeroed when allocated, weights converted on load are written as they are made) is compared with
// this figure first, so that a --ctx x batch or a --weights too large for the machine is refused
// with one line naming the flags and the bytes instead.
//
// Inside a container (Docker, Kubernetes) /proc/meminfo shows the host's memory, not the
// container's: its limit is the cgroup's memory.max, and past it the kernel's OOM killer ends the
// process just the same. So the figure is also bounded by the cgroup v2 limits of this process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

struct HostMemory {
    size_t bytes = SIZE_MAX;  // SIZE_MAX: unknown, nothing is refused
    std::string source = "unknown";  // where the figure came from, for messages
};

// The environment variable that replaces the figure (a byte count): tests, or a cap on what one
// job may take where several share a machine (the job's ranks on the node divide it, as they
// divide the machine's own figure: runtime/kv_cache.h).
constexpr const char* kHostMemEnv = "SHARDLM_HOST_MEM_AVAILABLE";

// The cgroup v2 hierarchy's mount point (the unified mount of a cgroup v2 host or container).
constexpr const char* kCgroupRoot = "/sys/fs/cgroup";

// $SHARDLM_HOST_MEM_AVAILABLE when set (throws Error unless it is a byte count; it overrides
// everything below). Else the smaller of the machine's figure and this process's cgroup v2
// headroom (cgroup_headroom under kCgroupRoot, at the path /proc/self/cgroup names), source naming
// the one that won. The machine's figure: MemAvailable + SwapFree from /proc/meminfo (what can be
// had without the OOM killer: free and reclaimable RAM, and swap); else sysinfo()'s free RAM +
// buffers + free swap; else unknown. Read anew on each call (other processes, and this one's
// earlier allocations, change it). Unreadable cgroup files leave the machine's figure.
HostMemory host_memory_available();

// MemAvailable + SwapFree in bytes from the text of a /proc/meminfo ("MemAvailable: 123 kB" lines);
// SIZE_MAX when it has no MemAvailable line (kernels before 3.14).
size_t meminfo_available_bytes(const std::string& meminfo);

// This process's cgroup v2 path ("/kubepods/pod1/c2") from the text of /proc/self/cgroup: the
// "0::PATH" line. "" when there is none: no cgroups, or cgroup v1 only. cgroup v1 (the "N:memory:"
// line, memory.limit_in_bytes) is not read: v1 hosts are on their way out (Kubernetes and Docker
// default to v2 since 2022); on a hybrid host the "0::" line names folders of the v2 hierarchy,
// which holds no memory controller there (nor, under kCgroupRoot, any memory.max): no limit.
std::string cgroup_v2_path(const std::string& proc_self_cgroup);

// What the cgroup v2 memory limits let this process still allocate: over the folder root + path
// and each of its parents up to root itself (a parent's limit binds its children too), the
// smallest headroom memory.max - (memory.current - inactive_file) among the levels whose
// memory.max is a byte count ("max" is no limit). inactive_file (memory.stat) is page cache the
// kernel reclaims before it OOM-kills, as MemAvailable counts it (current minus it is the
// "working set" Kubernetes and cAdvisor evict on). The cgroup's swap allowance (memory.swap.max)
// is not added: the figure errs on the side of refusing. A level whose memory.max or
// memory.current cannot be read is skipped (root itself has neither on a v2 host; inside a
// container without a cgroup namespace the path names folders the container does not see, and
// its own cgroup is mounted at root). Returns {SIZE_MAX, "unknown"} when no level has a limit,
// else the headroom with source "cgroup FOLDER/memory.max" of the level that gave it.
HostMemory cgroup_headroom(const std::string& root, const std::string& path);

// "1.234": bytes in GiB with three decimals, as the memory messages print them.
std::string format_gib(size_t bytes);

// The end of a "needs N bytes" refusal: " but the machine can back only X GiB (N bytes, SOURCE)",
// or, with several ranks on the node, each one's part of it and the whole figure shared by them.
std::string can_back_only(const HostMemory& avail, int ranks_on_node);

}  // namespace shardlm
