// The memory figure large allocations are checked against before they are touched
// (core/host_memory.h): /proc/meminfo's MemAvailable + SwapFree bounded by the cgroup v2 limits,
// or SHARDLM_HOST_MEM_AVAILABLE.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdint>

#include "core/error.h"
#include "core/host_memory.h"
#include "fixtures.h"

using namespace shardlm;
using namespace shardlm::test;

TEST(HostMemory, MeminfoAvailablePlusFreeSwap) {
    const std::string meminfo =
        "MemTotal:       24684084 kB\n"
        "MemFree:        23958420 kB\n"
        "MemAvailable:   24212444 kB\n"
        "Cached:           418056 kB\n"
        "SwapTotal:       2097148 kB\n"
        "SwapFree:        1000000 kB\n"
        "HugePages_Total:       0\n";
    EXPECT_EQ(meminfo_available_bytes(meminfo), (size_t(24212444) + 1000000) * 1024);
    // No swap lines: MemAvailable alone. No MemAvailable (kernels before 3.14): unknown.
    EXPECT_EQ(meminfo_available_bytes("MemAvailable: 4 kB\n"), size_t(4096));
    EXPECT_EQ(meminfo_available_bytes("MemTotal: 4 kB\nSwapFree: 8 kB\n"), SIZE_MAX);
    EXPECT_EQ(meminfo_available_bytes(""), SIZE_MAX);
}

TEST(HostMemory, EnvironmentReplacesTheFigure) {
    {
        ScopedEnv env(kHostMemEnv, "12345");
        const HostMemory m = host_memory_available();
        EXPECT_EQ(m.bytes, size_t(12345));
        EXPECT_EQ(m.source, kHostMemEnv);
    }
    for (const char* bad : {"", "12k", "-1", "1e9", "99999999999999999999999"}) {
        ScopedEnv env(kHostMemEnv, bad);
        EXPECT_THROW(host_memory_available(), Error) << "\"" << bad << "\"";
    }
}

// The machine's own figure: known on Linux, and more than the few MiB the test models need.
TEST(HostMemory, MachineFigureIsPlausible) {
    ScopedEnv env(kHostMemEnv, nullptr);
    const HostMemory m = host_memory_available();
    EXPECT_NE(m.bytes, SIZE_MAX) << m.source;
    EXPECT_GT(m.bytes, size_t(64) << 20) << m.source;
}

namespace {

// A cgroup v2 folder under `root` (created with its parents) holding memory.max and memory.current
// (each skipped when nullptr) and, when given, a memory.stat.
void cgroup_level(const std::string& root, const std::string& rel, const char* max, const char* current,
                  const char* stat = nullptr) {
    std::string dir = root;
    for (size_t i = 1; i <= rel.size(); ++i)
        if (i == rel.size() || rel[i] == '/') ::mkdir((root + rel.substr(0, i)).c_str(), 0755);
    dir += rel;
    if (max) write_file(dir + "/memory.max", max);
    if (current) write_file(dir + "/memory.current", current);
    if (stat) write_file(dir + "/memory.stat", stat);
}

}  // namespace

// The "0::" line of /proc/self/cgroup is the cgroup v2 path; cgroup v1 lines ("4:memory:/x") are
// not read, and a v1-only host has no such line.
TEST(HostMemory, CgroupV2PathFromProcSelfCgroup) {
    EXPECT_EQ(cgroup_v2_path("0::/kubepods/burstable/pod1/c2\n"), "/kubepods/burstable/pod1/c2");
    EXPECT_EQ(cgroup_v2_path("0::/\n"), "/");
    EXPECT_EQ(cgroup_v2_path("9:name=systemd:/\n4:memory:/docker/abc\n0::/user.slice\n1:cpu:/\n"), "/user.slice");
    EXPECT_EQ(cgroup_v2_path("4:memory:/docker/abc\n1:cpu:/\n"), "");
    EXPECT_EQ(cgroup_v2_path(""), "");
}

// Inside a container /proc/meminfo shows the host: the limit that ends the process is the cgroup's
// memory.max, its own or a parent's. The headroom is the smallest max - (current - inactive_file)
// over the levels with a limit, named by that level's memory.max.
TEST(HostMemory, CgroupHeadroomOverTheLevelsWithALimit) {
    TempDir t;
    const std::string root = t.path();
    // The limit is the parent's; the process's own folder says "max".
    cgroup_level(root, "", nullptr, "999999999");  // the root of a v2 host: no memory.max
    cgroup_level(root, "/kubepods", "max\n", "700\n");
    cgroup_level(root, "/kubepods/pod1", "1000\n", "600\n");
    cgroup_level(root, "/kubepods/pod1/c2", "max\n", "500\n");
    HostMemory m = cgroup_headroom(root, "/kubepods/pod1/c2");
    EXPECT_EQ(m.bytes, size_t(400));
    EXPECT_EQ(m.source, "cgroup " + root + "/kubepods/pod1/memory.max");

    // Two levels with a limit: the smaller headroom wins, whichever level holds the smaller limit.
    cgroup_level(root, "/kubepods/pod1/c2", "450\n", "400\n");
    m = cgroup_headroom(root, "/kubepods/pod1/c2");
    EXPECT_EQ(m.bytes, size_t(50));
    EXPECT_EQ(m.source, "cgroup " + root + "/kubepods/pod1/c2/memory.max");
    cgroup_level(root, "/kubepods/pod1/c2", "2000\n", "400\n");
    EXPECT_EQ(cgroup_headroom(root, "/kubepods/pod1/c2").bytes, size_t(400));  // the parent's 1000 - 600

    // Inactive page cache is reclaimed before the OOM killer acts: it does not count as used.
    cgroup_level(root, "/kubepods/pod1", "1000\n", "600\n", "anon 100\nfile 500\ninactive_file 300\nactive_file 200\n");
    EXPECT_EQ(cgroup_headroom(root, "/kubepods/pod1/c2").bytes, size_t(700));
    // Usage past the limit: no room, not a wrapped figure.
    cgroup_level(root, "/kubepods/pod1/c2", "100\n", "150\n");
    EXPECT_EQ(cgroup_headroom(root, "/kubepods/pod1/c2").bytes, size_t(0));

    // A limit on the mount point itself: a container's own cgroup, mounted at root (the path it
    // is given names folders it does not see).
    TempDir u;
    cgroup_level(u.path(), "", "4096\n", "1024\n");
    m = cgroup_headroom(u.path(), "/docker/abc");
    EXPECT_EQ(m.bytes, size_t(3072));
    EXPECT_EQ(m.source, "cgroup " + u.path() + "/memory.max");
    EXPECT_EQ(cgroup_headroom(u.path(), "/").bytes, size_t(3072));
}

// Nothing to go by: no limit anywhere ("max"), missing or unreadable files, a folder that does
// not exist. The figure is then unknown (SIZE_MAX) and the machine's own stands.
TEST(HostMemory, CgroupWithoutALimitOrFilesIsNoLimit) {
    TempDir t;
    const std::string root = t.path();
    EXPECT_EQ(cgroup_headroom(root, "/nowhere/at/all").bytes, SIZE_MAX);
    cgroup_level(root, "/a", "max\n", "100\n");
    cgroup_level(root, "/a/b", "max\n", "100\n");
    HostMemory m = cgroup_headroom(root, "/a/b");
    EXPECT_EQ(m.bytes, SIZE_MAX);
    EXPECT_EQ(m.source, "unknown");
    cgroup_level(root, "/c", "1000\n", nullptr);  // no memory.current
    cgroup_level(root, "/d", nullptr, "10\n");    // no memory.max
    cgroup_level(root, "/e", "lots\n", "10\n");  // not a byte count
    for (const char* p : {"/c", "/d", "/e"}) EXPECT_EQ(cgroup_headroom(root, p).bytes, SIZE_MAX) << p;
    // A level without files between two: skipped, the limited one still counts.
    cgroup_level(root, "/f", "800\n", "300\n");
    cgroup_level(root, "/f/g/h", "max\n", "100\n");
    EXPECT_EQ(cgroup_headroom(root, "/f/g/h/").bytes, size_t(500));
}

// The environment variable overrides a cgroup limit as it overrides /proc/meminfo; without it the
// machine's figure is never above this process's cgroup headroom.
TEST(HostMemory, FigureIsBoundedByThisProcessCgroup) {
    ScopedEnv env(kHostMemEnv, nullptr);
    const HostMemory m = host_memory_available();
    const std::string cg = read_file("/proc/self/cgroup");
    const std::string path = cgroup_v2_path(cg);
    if (!path.empty()) {
        const HostMemory c = cgroup_headroom(kCgroupRoot, path);
        // Read a moment apart: allow for what changed in between.
        if (c.bytes != SIZE_MAX) {
            EXPECT_LE(m.bytes, c.bytes + (size_t(64) << 20)) << m.source << " vs " << c.source;
        }
    }
    ScopedEnv small(kHostMemEnv, "77");
    EXPECT_EQ(host_memory_available().bytes, size_t(77));
}
