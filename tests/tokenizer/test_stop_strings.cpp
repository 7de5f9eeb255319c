// StopMatcher (tokenizer/stop_strings.h): it stops at the first id whose text completes a stop
// string, cuts the text before it (or after it, keep_stop), and holds back for streaming only
// what may begin one; skip_special_tokens leaves special tokens out of the text.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tiny_tokenizer.h"
#include "tokenizer/stop_strings.h"
#include "tokenizer/tokenizer.h"

using namespace shardlm;
using namespace shardlm::test;

namespace {

Tokenizer byte_level() { return Tokenizer::from_json_text(tiny_byte_level_tokenizer().dump(), "{}"); }

// The ids' text decoded prefix by prefix: the first prefix length whose text contains `stop`.
size_t first_prefix_with(const Tokenizer& t, const std::vector<int32_t>& ids, const std::string& stop) {
    for (size_t n = 1; n <= ids.size(); ++n)
        if (t.decode(std::vector<int32_t>(ids.begin(), ids.begin() + long(n))).find(stop) != std::string::npos) return n;
    return 0;
}

}  // namespace

// Every substring of up to 6 characters of an ASCII text as the stop string: the matcher stops
// at the first id whose prefix decodes to text containing it, and its text ends just before it;
// until then its text is the prefix's text and what it holds back begins the stop string.
TEST(StopMatcher, StopsAtTheFirstIdThatCompletesTheString) {
    const Tokenizer t = byte_level();
    const std::string text = "the cat sat on the mat, then the cat ran.";
    const std::vector<int32_t> ids = t.encode(text);
    ASSERT_EQ(t.decode(ids), text);
    for (size_t at = 0; at < text.size(); ++at)
        for (size_t len = 1; len <= 6 && at + len <= text.size(); ++len) {
            const std::string stop = text.substr(at, len);
            StopMatcher m(t, {stop});
            StopMatcher keep(t, {stop}, {}, true);  // include_stop_str_in_output
            size_t stopped_at = 0;
            for (size_t i = 0; i < ids.size() && !stopped_at; ++i) {
                const bool stopped = m.push(ids[i]);
                EXPECT_EQ(keep.push(ids[i]), stopped) << stop;
                if (stopped) {
                    stopped_at = i + 1;
                    break;
                }
                const std::string sofar = t.decode(std::vector<int32_t>(ids.begin(), ids.begin() + long(i + 1)));
                ASSERT_EQ(m.text(), sofar) << stop;
                const std::string held = m.text().substr(m.settled());
                ASSERT_EQ(stop.compare(0, held.size(), held), 0) << "holds back \"" << held << "\" for \"" << stop << "\"";
                ASSERT_LT(held.size(), stop.size());
            }
            ASSERT_EQ(stopped_at, first_prefix_with(t, ids, stop)) << stop;
            EXPECT_TRUE(m.stopped());
            EXPECT_EQ(m.text(), text.substr(0, text.find(stop))) << stop;
            EXPECT_EQ(keep.text(), text.substr(0, text.find(stop) + stop.size())) << stop;
            EXPECT_EQ(m.settled(), m.text().size());
            EXPECT_TRUE(m.push(ids[0]));  // nothing changes after the stop
            EXPECT_EQ(m.text(), text.substr(0, text.find(stop))) << stop;
        }
}

TEST(StopMatcher, EarliestOfSeveralAndMultibyteCharacters) {
    const Tokenizer t = byte_level();
    const std::vector<int32_t> cat = t.encode("the cat sat");
    StopMatcher two(t, {"cat ran", "at"});  // "at" appears first, inside "cat"
    for (int32_t id : cat) two.push(id);
    EXPECT_TRUE(two.stopped());
    EXPECT_EQ(two.text(), "the c");
    StopMatcher kept(t, {"cat ran", "at"}, {}, true);
    for (int32_t id : cat) kept.push(id);
    EXPECT_EQ(kept.text(), "the cat");
    // A stop string made of one four-byte character, split over four byte tokens: the decoder
    // settles it with the last byte, and only then does the matcher stop.
    const std::string smile = "\xF0\x9F\x98\x80";
    const std::vector<int32_t> ids = t.encode("a" + smile + "b");
    ASSERT_EQ(ids.size(), 6u);
    StopMatcher m(t, {smile});
    for (size_t i = 0; i < 4; ++i) {
        EXPECT_FALSE(m.push(ids[i])) << i;
        EXPECT_EQ(m.text(), "a");
        EXPECT_EQ(m.settled(), 1u);
    }
    EXPECT_TRUE(m.push(ids[4]));
    EXPECT_EQ(m.text(), "a");
}

TEST(StopMatcher, WithoutStopsItOnlyStreamsAndEmptyStopsAreRefused) {
    const Tokenizer t = byte_level();
    const std::vector<int32_t> ids = t.encode("a b c");
    StopMatcher m(t, {});
    for (int32_t id : ids) EXPECT_FALSE(m.push(id));
    m.push(-1);                   // an id outside the tokenizer (a padded embedding) adds nothing
    m.push(t.vocab_size() + 5);
    EXPECT_FALSE(m.finish());
    EXPECT_EQ(m.text(), "a b c");
    EXPECT_EQ(m.settled(), 5u);
    EXPECT_THROW(StopMatcher(t, {"x", ""}), Error);
    // skip_special_tokens: a special token adds nothing to the text (and cannot complete a stop).
    std::vector<int32_t> with = t.encode("a b");
    with.insert(with.begin() + 1, 351);  // <|im_start|>
    DecodeOptions skip;
    skip.skip_special_tokens = true;
    StopMatcher keeps(t, {}), skips(t, {"<|im"}, skip);
    for (int32_t id : with) {
        keeps.push(id);
        EXPECT_FALSE(skips.push(id));
    }
    EXPECT_EQ(keeps.text(), "a<|im_start|> b");
    EXPECT_EQ(skips.text(), "a b");
}
