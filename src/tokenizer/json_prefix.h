// JSON text read as far as it goes, for a reply that is still being generated: a tool call's
// arguments streamed while the model writes them (vLLM's streaming tool parsers send them so).
// The scan writes the value's python_json text (chat_template.h: ", " and ": " between items,
// strings and numbers as nlohmann's dump writes them), but only the part that the text so far
// fixes: a string's characters as they come, a number or a literal once it has ended. So the
// text a scan writes for a prefix of a reply is a prefix of what it writes for the whole reply,
// and for a whole value it equals python_json(parse(text)) (duplicate keys aside: the scan keeps
// each, where parsing keeps the last).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace shardlm {

struct JsonPrefix {
    // false: the text is not the start of one JSON value (nlohmann's parser would refuse it), or
    // nests deeper than kMaxPythonJsonDepth. The scan stops where it found that out.
    bool valid = true;
    bool complete = false;  // the value has ended; `end` is one past its last character
    size_t end = 0;
    std::string out;  // python_json of what the text fixes so far (all of the value once complete)
    // The values one and two levels in (a root object's members or a root array's items, and
    // theirs), in the order they begin: where each one's text is in `out` so far.
    struct Item {
        int parent = -1;   // -1: the root's; else the index of the item it is in
        std::string key;   // a member's key (decoded)
        char kind = 0;     // the value's first character: '{', '[', '"', 't', 'f', 'n', '-' or a digit
        size_t begin = 0, end = 0;
        bool complete = false;
    };
    std::vector<Item> items;
};

// Scans the JSON value that starts at text[at] (after white space). `final`: the text will not
// grow, so a number at its very end has ended (a number inside a container ends at the next
// character anyway).
JsonPrefix scan_json_prefix(const std::string& text, size_t at, bool final);

}  // namespace shardlm
