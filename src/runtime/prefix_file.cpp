#include "runtime/prefix_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace shardlm {
namespace {

constexpr char kMagic[8] = {'S', 'H', 'L', 'M', 'K', 'V', '0', '1'};
constexpr uint64_t kMaxHeader = uint64_t(64) << 20;  // a header is a few bytes per prefix

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

size_t position_bytes(const PrefixFileKey& key, const std::string& path) {
    const auto it = key.find("position_bytes");
    SHARDLM_CHECK(it != key.end(), "prefix file key without position_bytes (", path, ")");
    return size_t(std::stoull(it->second));
}

}  // namespace

std::string prefix_file_path(const std::string& path, int rank) {
    return rank == 0 ? path : path + ".rank" + std::to_string(rank);
}

void write_prefix_file(const std::string& path, const PrefixFileKey& key, const std::vector<SavedPrefix>& saved) {
    const size_t per = position_bytes(key, path);
    nlohmann::json head = {{"key", key}, {"prefixes", nlohmann::json::array()}};
    for (const SavedPrefix& p : saved) {
        SHARDLM_CHECK(p.kv.size() == p.tokens.size() * per, "a saved prefix of ", p.tokens.size(), " tokens has ",
                      p.kv.size(), " bytes (", per, " per position)");
        head["prefixes"].push_back(p.tokens.size());
    }
    const std::string text = head.dump();
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    {
        File f(std::fopen(tmp.c_str(), "wb"));
        if (!f) fail(path, ": cannot write the prefix cache (", tmp, ": ", std::strerror(errno), ")");
        const uint64_t n = text.size();
        bool ok = std::fwrite(kMagic, 1, sizeof kMagic, f.get()) == sizeof kMagic &&
                  std::fwrite(&n, sizeof n, 1, f.get()) == 1 && std::fwrite(text.data(), 1, text.size(), f.get()) == text.size();
        for (size_t i = 0; ok && i < saved.size(); ++i) {
            const SavedPrefix& p = saved[i];
            ok = std::fwrite(p.tokens.data(), sizeof(int32_t), p.tokens.size(), f.get()) == p.tokens.size() &&
                 std::fwrite(p.kv.data(), 1, p.kv.size(), f.get()) == p.kv.size();
        }
        ok = ok && std::fclose(f.release()) == 0;  // a full disk may show only when the buffer goes
        if (!ok) {
            const std::string why = std::strerror(errno);
            f.reset();
            std::remove(tmp.c_str());
            fail(path, ": writing the prefix cache failed (", why, ")");
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string why = std::strerror(errno);
        std::remove(tmp.c_str());
        fail(path, ": cannot replace the prefix cache (", why, ")");
    }
}

bool read_prefix_file(const std::string& path, const PrefixFileKey& key, std::vector<SavedPrefix>& out, std::string& why) {
    out.clear();
    why.clear();
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return false;
    if (std::filesystem::is_directory(path, ec)) fail(path, ": a folder, not a prefix cache file");
    const uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) fail(path, ": cannot read the prefix cache (", ec.message(), ")");
    File f(std::fopen(path.c_str(), "rb"));
    if (!f) fail(path, ": cannot read the prefix cache (", std::strerror(errno), ")");
    char magic[sizeof kMagic];
    uint64_t n = 0;
    if (size < sizeof magic || std::fread(magic, 1, sizeof magic, f.get()) != sizeof magic || std::memcmp(magic, kMagic, 6) != 0)
        fail(path, ": not a shardlm prefix cache (it does not start with SHLMKV); give another file name");
    if (std::memcmp(magic, kMagic, sizeof magic) != 0)
        fail(path, ": a prefix cache of another format (", std::string(magic + 6, 2), ", this build reads ",
             std::string(kMagic + 6, 2), "); delete it");
    if (size < sizeof magic + sizeof n || std::fread(&n, sizeof n, 1, f.get()) != 1 || n > kMaxHeader ||
        n > size - sizeof magic - sizeof n)
        fail(path, ": damaged prefix cache (a header of ", n, " bytes in a file of ", size, ")");
    std::string text(size_t(n), '\0');
    if (std::fread(text.data(), 1, text.size(), f.get()) != text.size()) fail(path, ": damaged prefix cache (cut off in its header)");
    nlohmann::json head = nlohmann::json::parse(text, nullptr, false);
    if (head.is_discarded() || !head.is_object() || !head.contains("key") || !head["key"].is_object() ||
        !head.contains("prefixes") || !head["prefixes"].is_array())
        fail(path, ": damaged prefix cache (its header is not the JSON it writes)");
    PrefixFileKey theirs;
    for (const auto& [k, v] : head["key"].items()) {
        if (!v.is_string()) fail(path, ": damaged prefix cache (key field ", k, " is not a string)");
        theirs[k] = v.get<std::string>();
    }
    // The bytes per position last: they follow from the others, which say more.
    for (const bool derived : {false, true})
        for (const auto& [k, v] : key) {
            if ((k == "position_bytes") != derived) continue;
            const auto it = theirs.find(k);
            if (it == theirs.end() || it->second != v) {
                why = k + " is " + (it == theirs.end() ? std::string("not given") : it->second) + " there, " + v + " here";
                return false;
            }
        }
    for (const auto& [k, v] : theirs)
        if (key.find(k) == key.end()) {
            why = k + " is " + v + " there, not given here";
            return false;
        }
    // The sizes the header names must add up to the file's, before anything is allocated.
    const size_t per = position_bytes(key, path);
    const uint64_t row = sizeof(int32_t) + uint64_t(per);
    uint64_t rest = size - sizeof magic - sizeof n - n;
    std::vector<size_t> lengths;
    for (const nlohmann::json& t : head["prefixes"]) {
        if (!t.is_number_unsigned() || t.get<uint64_t>() == 0 || t.get<uint64_t>() > rest / row)
            fail(path, ": damaged prefix cache (prefix ", lengths.size(), " of ", head["prefixes"].size(),
                 " has more positions than the file holds)");
        lengths.push_back(size_t(t.get<uint64_t>()));
        rest -= t.get<uint64_t>() * row;
    }
    if (rest != 0) fail(path, ": damaged prefix cache (", rest, " bytes past its last prefix)");
    out.resize(lengths.size());
    for (size_t i = 0; i < lengths.size(); ++i) {
        SavedPrefix& p = out[i];
        p.tokens.resize(lengths[i]);
        p.kv.resize(lengths[i] * per);
        if (std::fread(p.tokens.data(), sizeof(int32_t), p.tokens.size(), f.get()) != p.tokens.size() ||
            std::fread(p.kv.data(), 1, p.kv.size(), f.get()) != p.kv.size()) {
            out.clear();
            fail(path, ": cannot read the prefix cache (prefix ", i, ")");
        }
        for (const int32_t t : p.tokens)
            if (t < 0) {
                out.clear();
                fail(path, ": damaged prefix cache (token id ", t, " in prefix ", i, ")");
            }
    }
    return true;
}

}  // namespace shardlm
