#include "core/host_memory.h"

#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdio>
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

// The whole text of a file; false when it cannot be opened or read.
bool read_text(const std::string& path, std::string& out) {
    std::ifstream f(path);
    if (!f) return false;
    std::ostringstream text;
    text << f.rdbuf();
    if (f.bad()) return false;
    out = text.str();
    return true;
}

// A cgroup file holding one value ("123\n", "max\n"): the text without surrounding blanks.
std::string trimmed(const std::string& s) {
    const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// The value of `key` in a memory.stat text ("inactive_file 4096" lines); 0 when absent or malformed.
size_t stat_value(const std::string& stat, const std::string& key) {
    std::istringstream in(stat);
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream f(line);
        std::string k, v;
        size_t n = 0;
        if (f >> k >> v && k == key) return parse_bytes(v, n) ? n : 0;
    }
    return 0;
}

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

std::string cgroup_v2_path(const std::string& proc_self_cgroup) {
    std::istringstream in(proc_self_cgroup);
    std::string line;
    while (std::getline(in, line))
        if (line.compare(0, 3, "0::") == 0 && line.size() > 3 && line[3] == '/') return line.substr(3);
    return "";
}

HostMemory cgroup_headroom(const std::string& root, const std::string& path) {
    HostMemory best;
    std::string rel = path;  // "/a/b" -> "/a" -> "": the folder, then its parents up to root
    while (true) {
        while (!rel.empty() && rel.back() == '/') rel.pop_back();
        const std::string dir = root + rel;
        std::string max_s, cur_s, stat;
        size_t max = 0, cur = 0;
        if (read_text(dir + "/memory.max", max_s) && read_text(dir + "/memory.current", cur_s) &&
            parse_bytes(trimmed(max_s), max) && parse_bytes(trimmed(cur_s), cur)) {
            // "max" fails parse_bytes above: no limit at this level.
            const size_t reclaimable = read_text(dir + "/memory.stat", stat) ? stat_value(stat, "inactive_file") : 0;
            const size_t used = cur - std::min(cur, reclaimable);
            const size_t room = max > used ? max - used : 0;
            if (room < best.bytes) best = {room, "cgroup " + dir + "/memory.max"};
        }
        if (rel.empty()) break;
        const size_t slash = rel.rfind('/');
        rel.erase(slash == std::string::npos ? 0 : slash);
    }
    return best;
}

HostMemory host_memory_available() {
    if (const char* env = std::getenv(kHostMemEnv)) {
        size_t v = 0;
        if (!parse_bytes(env, v)) fail(kHostMemEnv, "=\"", env, "\": expected a byte count (decimal digits)");
        return {v, kHostMemEnv};
    }
    HostMemory machine;
    std::string text;
    const size_t v = read_text("/proc/meminfo", text) ? meminfo_available_bytes(text) : SIZE_MAX;
    struct sysinfo si {};
    if (v != SIZE_MAX) {
        machine = {v, "/proc/meminfo MemAvailable + SwapFree"};
    } else if (sysinfo(&si) == 0) {
        const size_t unit = si.mem_unit ? si.mem_unit : 1;
        const size_t units = saturating_add(saturating_add(size_t(si.freeram), size_t(si.bufferram)), size_t(si.freeswap));
        machine = {units > SIZE_MAX / unit ? SIZE_MAX : units * unit, "sysinfo() free RAM + buffers + free swap"};
    }
    // A container's limit: /proc/meminfo shows the host (core/host_memory.h).
    if (read_text("/proc/self/cgroup", text)) {
        const std::string path = cgroup_v2_path(text);
        if (!path.empty()) {
            HostMemory cg = cgroup_headroom(kCgroupRoot, path);
            if (cg.bytes < machine.bytes) return cg;
        }
    }
    return machine;
}

std::string format_gib(size_t bytes) {
    char s[32];
    std::snprintf(s, sizeof s, "%.3f", double(bytes) / (1024.0 * 1024.0 * 1024.0));
    return s;
}

std::string can_back_only(const HostMemory& avail, int ranks_on_node) {
    const std::string whole = cat(format_gib(avail.bytes), " GiB (", avail.bytes, " bytes, ", avail.source, ")");
    if (ranks_on_node <= 1) return " but the machine can back only " + whole;
    const size_t part = avail.bytes / size_t(ranks_on_node);
    return cat(" but the machine can back only ", format_gib(part), " GiB (", part, " bytes) per rank: ", whole,
               " shared by ", ranks_on_node, " ranks on this node");
}

}  // namespace shardlm
