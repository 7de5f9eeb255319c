// The memory figure large allocations are checked against before they are touched
// (core/host_memory.h): /proc/meminfo's MemAvailable + SwapFree, or SHARDLM_HOST_MEM_AVAILABLE.
#include <gtest/gtest.h>

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
        EXPECT_STREQ(m.source, kHostMemEnv);
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
