#include "core/host_memory.h"

#include <sys/sysinfo.h>

#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/error.h"

namespace shardlm {

namespace {

// "123" -> 123; false for anything but decimal digits, or a value past size_t.
bool parse_bytes(const std::string& s, size_t& out) {
    if (s.empty() || s.size() > 20) return false;
    unsigned long long v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return false;
        const unsigned d = unsigned(c - '0');
        if (v > (std::numeric_limits<unsigned long long>::max() - d) / 10) return false;
        v = v * 10 + d;
    }
    if (v > std::numeric_limits<size_t>::max()) return false;
    out = size_t(v);
    return true;
}

size_t saturating_add(size_t a, size_t b) { return b > SIZE_MAX - a ? SIZE_MAX : a + b; }

}  // namespace

size_t meminfo_available_bytes(const std::string& meminfo) {
    std::istringstream in(meminfo);
    std::string line;
    bool have_avail = false;
    size_t total = 0;
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string key, unit;
        unsigned long long n = 0;
        if (!(f >> key >> n)) continue;
        if (key != "MemAvailable:" && key != "SwapFree:") continue;
        f >> unit;  // "kB" (the only unit the kernel writes); none means bytes
        const size_t scale = unit == "kB" ? 1024 : 1;
        const size_t bytes = n > SIZE_MAX / scale ? SIZE_MAX : size_t(n) * scale;
        total = saturating_add(total, bytes);
        have_avail = have_avail || key == "MemAvailable:";
    }
    return have_avail ? total : SIZE_MAX;
}

HostMemory host_memory_available() {
    if (const char* env = std::getenv(kHostMemEnv)) {
        size_t v = 0;
        if (!parse_bytes(env, v)) fail(kHostMemEnv, "=\"", env, "\": expected a byte count (decimal digits)");
        return {v, kHostMemEnv};
    }
    std::ifstream f("/proc/meminfo");
    if (f) {
        std::ostringstream text;
        text << f.rdbuf();
        const size_t v = meminfo_available_bytes(text.str());
        if (v != SIZE_MAX) return {v, "MemAvailable + SwapFree"};
    }
    struct sysinfo si {};
    if (sysinfo(&si) == 0) {
        const size_t unit = si.mem_unit ? si.mem_unit : 1;
        const size_t units = saturating_add(saturating_add(size_t(si.freeram), size_t(si.bufferram)), size_t(si.freeswap));
        return {units > SIZE_MAX / unit ? SIZE_MAX : units * unit, "free RAM + buffers + free swap"};
    }
    return {};
}

}  // namespace shardlm
