// The prefix cache's file (runtime/prefix_file.h): what it reads back, the keys it refuses with
// the field named, and the damage it reports with the file named before using anything.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"
#include "fixtures.h"
#include "runtime/prefix_file.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

std::vector<SavedPrefix> two_prefixes(size_t per) {
    std::vector<SavedPrefix> v(2);
    v[0].tokens = {3, 1, 4, 1, 5};
    v[1].tokens = {9, 2, 6};
    for (SavedPrefix& p : v) {
        p.kv.resize(p.tokens.size() * per);
        for (size_t i = 0; i < p.kv.size(); ++i) p.kv[i] = uint8_t(i * 7 + p.tokens[0]);
    }
    return v;
}

std::string bytes_of(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void put(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << bytes;
}

// Expects read_prefix_file to throw an Error holding the path and `needle`.
void expect_damaged(const std::string& path, const PrefixFileKey& key, const std::string& needle) {
    std::vector<SavedPrefix> out;
    std::string why;
    try {
        read_prefix_file(path, key, out, why);
        ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind(path + ": ", 0), 0u) << msg;
        EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
    EXPECT_TRUE(out.empty()) << needle;
}

}  // namespace

TEST(PrefixFile, ReadsBackWhatItWrote) {
    TempDir d;
    const PrefixFileKey key = {{"model", "m1"}, {"kv", "int8"}, {"position_bytes", "12"}};
    const std::vector<SavedPrefix> saved = two_prefixes(12);
    const std::string path = d.file("p.kv");
    write_prefix_file(path, key, saved);
    std::vector<SavedPrefix> out;
    std::string why = "x";
    ASSERT_TRUE(read_prefix_file(path, key, out, why));
    EXPECT_TRUE(why.empty());
    ASSERT_EQ(out.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(out[i].tokens, saved[i].tokens);
        EXPECT_EQ(out[i].kv, saved[i].kv);
    }
    // No temporary file is left beside it, and a rewrite replaces it whole.
    size_t files = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path())) files += e.is_regular_file();
    EXPECT_EQ(files, 1u);
    write_prefix_file(path, key, {saved[1]});
    ASSERT_TRUE(read_prefix_file(path, key, out, why));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(out[0].tokens, saved[1].tokens);
    write_prefix_file(path, key, {});
    ASSERT_TRUE(read_prefix_file(path, key, out, why));
    EXPECT_TRUE(out.empty());
    // No file: false without a reason.
    EXPECT_FALSE(read_prefix_file(d.file("none.kv"), key, out, why));
    EXPECT_TRUE(why.empty());
    // Ranks keep their own files.
    EXPECT_EQ(prefix_file_path("/x/p.kv", 0), "/x/p.kv");
    EXPECT_EQ(prefix_file_path("/x/p.kv", 3), "/x/p.kv.rank3");
    // A kv that is not tokens x position_bytes is a caller's bug, not written.
    std::vector<SavedPrefix> bad = two_prefixes(12);
    bad[1].kv.pop_back();
    EXPECT_THROW(write_prefix_file(path, key, bad), Error);
    // A folder that does not exist: the error names the file.
    try {
        write_prefix_file(d.file("no/such/p.kv"), key, saved);
        ADD_FAILURE() << "wrote into a missing folder";
    } catch (const Error& e) {
        EXPECT_EQ(std::string(e.what()).rfind(d.file("no/such/p.kv") + ": cannot write", 0), 0u) << e.what();
    }
}

TEST(PrefixFile, AnotherKeyIsNamedNotUsed) {
    TempDir d;
    const PrefixFileKey key = {{"model", "m1"}, {"kv", "int8"}, {"ranks", "2"}, {"position_bytes", "12"}};
    const std::string path = d.file("p.kv");
    write_prefix_file(path, key, two_prefixes(12));
    auto why_not = [&](PrefixFileKey k) {
        std::vector<SavedPrefix> out;
        std::string why;
        EXPECT_FALSE(read_prefix_file(path, k, out, why));
        EXPECT_TRUE(out.empty());
        return why;
    };
    PrefixFileKey k = key;
    k["kv"] = "fp32";
    EXPECT_EQ(why_not(k), "kv is int8 there, fp32 here");
    // The bytes per position follow from the other fields: those are named first.
    k = key;
    k["ranks"] = "1";
    k["position_bytes"] = "24";
    EXPECT_EQ(why_not(k), "ranks is 2 there, 1 here");
    k = key;
    k["position_bytes"] = "24";
    EXPECT_EQ(why_not(k), "position_bytes is 12 there, 24 here");
    k = key;
    k["lora"] = "a x 1";
    EXPECT_EQ(why_not(k), "lora is not given there, a x 1 here");
    k = key;
    k.erase("model");
    EXPECT_EQ(why_not(k), "model is m1 there, not given here");
}

TEST(PrefixFile, DamageIsAnErrorNamingTheFile) {
    TempDir d;
    const PrefixFileKey key = {{"model", "m1"}, {"position_bytes", "12"}};
    const std::string good = d.file("good.kv"), path = d.file("p.kv");
    write_prefix_file(good, key, two_prefixes(12));
    const std::string bytes = bytes_of(good);
    const uint64_t head = *reinterpret_cast<const uint64_t*>(bytes.data() + 8);
    const std::string json = bytes.substr(16, size_t(head));
    put(path, "");
    expect_damaged(path, key, "not a shardlm prefix cache");
    put(path, "{\"model\": \"m1\"}\n");
    expect_damaged(path, key, "not a shardlm prefix cache");
    put(path, "SHLMKV99" + bytes.substr(8));
    expect_damaged(path, key, "another format (99, this build reads 01)");
    for (const size_t keep : {size_t(12), size_t(16 + head / 2), bytes.size() - 1}) {
        put(path, bytes.substr(0, keep));  // cut off: in the header's size, in its text, in the last prefix
        expect_damaged(path, key, "damaged prefix cache");
    }
    put(path, bytes + "x");
    expect_damaged(path, key, "1 bytes past its last prefix");
    auto with_header = [&](const std::string& text, const std::string& rest) {
        const uint64_t n = text.size();
        return bytes.substr(0, 8) + std::string(reinterpret_cast<const char*>(&n), 8) + text + rest;
    };
    const std::string body = bytes.substr(16 + size_t(head));
    put(path, with_header("[1, 2]", body));
    expect_damaged(path, key, "its header is not the JSON it writes");
    std::string longer = json;
    longer.replace(longer.find("[5,3]"), 5, "[5,300]");
    put(path, with_header(longer, body));
    expect_damaged(path, key, "prefix 1 of 2 has more positions than the file holds");
    std::string negative = body;
    const int32_t minus = -7;
    negative.replace(0, 4, std::string(reinterpret_cast<const char*>(&minus), 4));
    put(path, with_header(json, negative));
    expect_damaged(path, key, "token id -7 in prefix 0");
    std::filesystem::create_directory(d.file("dir.kv"));
    expect_damaged(d.file("dir.kv"), key, "a folder, not a prefix cache file");
}
