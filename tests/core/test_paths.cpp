// unwritable_reason (core/mmap_file.h): whether an output path can be written, found without
// creating anything, for flags checked before a long load (generate --dump-logits, quantize --out).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include "core/mmap_file.h"
#include "fixtures.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {
bool exists(const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0;
}
}  // namespace

TEST(Paths, UnwritableReasonOfAFile) {
    TempDir d;
    write_file(d.file("f"), "x");
    EXPECT_EQ(unwritable_reason(d.file("f")), "");    // truncated
    EXPECT_EQ(unwritable_reason(d.file("new")), "");  // created
    EXPECT_EQ(unwritable_reason(d.path()), "Is a directory");
    EXPECT_EQ(unwritable_reason(d.file("no-such/new")), "No such file or directory");
    EXPECT_EQ(unwritable_reason(d.file("f/new")), "Not a directory");
    EXPECT_EQ(unwritable_reason(""), "No such file or directory");
    EXPECT_FALSE(exists(d.file("new")));
    EXPECT_EQ(read_file(d.file("f")), "x");
}

TEST(Paths, UnwritableReasonOfAFolder) {
    TempDir d;
    write_file(d.file("f"), "x");
    EXPECT_EQ(unwritable_reason(d.path(), true), "");  // written into
    EXPECT_EQ(unwritable_reason(d.path() + "/", true), "");
    EXPECT_EQ(unwritable_reason(d.file("new"), true), "");  // created (one level)
    EXPECT_EQ(unwritable_reason(d.file("new/"), true), "");
    EXPECT_EQ(unwritable_reason(d.file("no-such/new"), true), "No such file or directory");
    EXPECT_EQ(unwritable_reason(d.file("f"), true), "Not a directory");
    EXPECT_EQ(unwritable_reason(d.file("f/new"), true), "Not a directory");
    EXPECT_FALSE(exists(d.file("new")));
}

// Permissions (root passes every access check, so only as another user).
TEST(Paths, UnwritableReasonOfAReadOnlyFolder) {
    if (::geteuid() == 0) GTEST_SKIP() << "root may write anywhere";
    TempDir d;
    const std::string ro = d.file("ro");
    ASSERT_EQ(::mkdir(ro.c_str(), 0500), 0);
    EXPECT_EQ(unwritable_reason(ro, true), "Permission denied");
    EXPECT_EQ(unwritable_reason(ro + "/new", true), "Permission denied");
    EXPECT_EQ(unwritable_reason(ro + "/new"), "Permission denied");
    ::chmod(ro.c_str(), 0700);  // for TempDir's removal
}
