#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "fixtures.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"

using namespace shardlm;
using shardlm::test::TempDir;

namespace {

std::string file_bytes(const std::string& header, const std::string& data) {
    std::string s(8, '\0');
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
    return s + header + data;
}

void expect_error(const std::string& bytes, const std::string& needle) {
    TempDir d;
    const std::string path = d.file("bad.safetensors");
    test::write_file(path, bytes);
    try {
        SafetensorsFile f(path);
        FAIL() << "expected an error containing " << needle;
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
}

}  // namespace

TEST(Safetensors, ReadsWhatTheWriterWrites) {
    TempDir d;
    std::vector<TensorToWrite> ts;
    ts.push_back({"a", "F32", {2, 2}, std::vector<uint8_t>(16, 1)});
    ts.push_back({"b.bias", "BF16", {3}, std::vector<uint8_t>(6, 2)});
    ts.push_back({"empty", "F16", {0, 4}, {}});
    write_safetensors(d.file("m.safetensors"), ts);
    SafetensorsFile f(d.file("m.safetensors"));
    ASSERT_EQ(f.tensors().size(), 3u);
    const TensorInfo* a = f.find("a");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->dtype, DType::F32);
    EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(a->nbytes, 16u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 128, 0u);  // the writer aligns the data
    EXPECT_EQ(f.find("b.bias")->dtype, DType::BF16);
    EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, MalformedFiles) {
    expect_error("", "truncated");
    expect_error("abc", "truncated");
    expect_error(file_bytes("{}", "").substr(0, 7), "truncated");
    {
        std::string s = file_bytes("{}", "");
        s[0] = char(200);  // header length 200 > file
        expect_error(s, "larger than the file");
    }
    expect_error(file_bytes("{not json", ""), "malformed safetensors header");
    expect_error(file_bytes("[1,2]", ""), "not a JSON object");
    expect_error(file_bytes(R"({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", "1234"), "past the end");
    expect_error(file_bytes(R"({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", "12345678"), "needs 12");
    expect_error(file_bytes(R"({"t": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", "12"), "unknown dtype");
    expect_error(file_bytes(R"({"t": {"dtype": "F16", "shape": [-2], "data_offsets": [0, 4]}})", "1234"), "negative");
    expect_error(file_bytes(R"({"t": {"dtype": "F16", "shape": [2], "data_offsets": [4, 0]}})", "1234"), "begin > end");
    expect_error(file_bytes(R"({"t": {"dtype": "F16", "shape": [2]}})", "1234"), "data_offsets");
    expect_error(file_bytes(R"({"t": {"dtype": "F16", "shape": [2], "data_offsets": [0]}})", "1234"), "data_offsets");
    expect_error(file_bytes(R"({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                                "b": {"dtype": "F16", "shape": [2], "data_offsets": [2, 6]}})", "123456"), "overlap");
    expect_error(file_bytes(R"({"t": {"dtype": "F16", "shape": [4611686018427387904, 4], "data_offsets": [0, 4]}})", "1234"),
                 "overflows");
}

TEST(Checkpoint, ShardedIndexErrors) {
    TempDir d;
    EXPECT_THROW(Checkpoint c(d.path()), Error);  // no files
    test::write_file(d.file("model.safetensors.index.json"), "{\"weight_map\": 3}");
    EXPECT_THROW(Checkpoint c(d.path()), Error);
    test::write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"a": "../x.safetensors"}})");
    EXPECT_THROW(Checkpoint c(d.path()), Error);
    test::write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"a": "missing.safetensors"}})");
    try {
        Checkpoint c(d.path());
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
    }
    write_safetensors(d.file("one.safetensors"), {{"b", "F32", {1}, std::vector<uint8_t>(4)}});
    test::write_file(d.file("model.safetensors.index.json"), R"({"weight_map": {"a": "one.safetensors"}})");
    try {
        Checkpoint c(d.path());
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("does not contain"), std::string::npos) << e.what();
    }
}
