#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/utf8.h"

namespace shardlm {

namespace {

using json = nlohmann::json;

// Cuts `text` into segments at the matches `find` reports ([begin, end), in order) and keeps the
// delimiters as HF's Split does for `behavior`; `invert` swaps the roles of matches and the text
// between them. Empty segments are dropped.
template <typename FindAll>
std::vector<std::pair<size_t, size_t>> split_segments(std::string_view text, SplitBehavior behavior, bool invert,
                                                      FindAll&& find) {
    struct Seg { size_t b, e; bool delim; };
    std::vector<Seg> segs;
    size_t prev = 0;
    find(text, [&](size_t b, size_t e) {
        if (b > prev) segs.push_back({prev, b, invert});
        if (e > b) segs.push_back({b, e, !invert});
        prev = e;
    });
    if (prev < text.size()) segs.push_back({prev, text.size(), invert});

    std::vector<std::pair<size_t, size_t>> out;
    bool prev_delim = false;
    switch (behavior) {
        case SplitBehavior::Removed:
            for (const Seg& s : segs)
                if (!s.delim) out.emplace_back(s.b, s.e);
            break;
        case SplitBehavior::Isolated:
            for (const Seg& s : segs) out.emplace_back(s.b, s.e);
            break;
        case SplitBehavior::MergedWithPrevious:
            for (const Seg& s : segs) {
                if (s.delim && !prev_delim && !out.empty()) out.back().second = s.e;
                else out.emplace_back(s.b, s.e);
                prev_delim = s.delim;
            }
            break;
        case SplitBehavior::MergedWithNext:
            for (size_t i = segs.size(); i-- > 0;) {
                const Seg& s = segs[i];
                if (s.delim && !prev_delim && !out.empty()) out.back().first = s.b;
                else out.emplace_back(s.b, s.e);
                prev_delim = s.delim;
            }
            std::reverse(out.begin(), out.end());
            break;
        case SplitBehavior::Contiguous:
            for (size_t i = 0; i < segs.size(); ++i) {
                const Seg& s = segs[i];
                if (i > 0 && s.delim == prev_delim) out.back().second = s.e;
                else out.emplace_back(s.b, s.e);
                prev_delim = s.delim;
            }
            break;
    }
    return out;
}


// GPT-2's split pattern, used by ByteLevel when use_regex is true.
const char* kGpt2Pattern = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

SplitBehavior parse_behavior(const std::string& b, const std::string& where) {
    if (b == "Removed") return SplitBehavior::Removed;
    if (b == "Isolated") return SplitBehavior::Isolated;
    if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
    if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
    if (b == "Contiguous") return SplitBehavior::Contiguous;
    fail(where, ": unknown Split behavior \"", b, "\"");
}

// Reports the non-overlapping occurrences of a literal string.
struct LiteralFinder {
    std::string_view needle;
    template <typename F>
    void operator()(std::string_view text, F&& on_match) const {
        if (needle.empty()) return;
        for (size_t at = text.find(needle); at != std::string_view::npos; at = text.find(needle, at + needle.size()))
            on_match(at, at + needle.size());
    }
};

struct RegexFinder {
    const Regex& re;
    template <typename F>
    void operator()(std::string_view text, F&& on_match) const {
        re.for_each_match(text, on_match);
    }
};

// Runs of ASCII digits (or single digits) as matches, for the Digits pre-tokenizer.
struct DigitFinder {
    bool individual;
    template <typename F>
    void operator()(std::string_view text, F&& on_match) const {
        for (size_t i = 0; i < text.size();) {
            if (text[i] >= '0' && text[i] <= '9') {
                size_t j = i + 1;
                if (!individual)
                    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
                on_match(i, j);
                i = j;
            } else {
                ++i;
            }
        }
    }
};

template <typename Finder>
void split_pieces(const Finder& f, SplitBehavior behavior, bool invert, std::vector<std::string>& pieces,
                  std::vector<char>& origin) {
    std::vector<std::string> out;
    std::vector<char> out_origin;
    out.reserve(pieces.size() * 2);
    for (size_t k = 0; k < pieces.size(); ++k) {
        const std::string_view p = pieces[k];
        for (const auto& [b, e] : split_segments(p, behavior, invert, f)) {
            out.emplace_back(p.substr(b, e - b));
            out_origin.push_back(b == 0 ? origin[k] : 0);  // the first piece keeps the origin's kind
        }
    }
    pieces.swap(out);
    origin.swap(out_origin);
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const json& j, const std::string& where) {
    PreTokenizer p;
    if (!j.is_null()) p.add(j, where);
    for (size_t i = 0; i < p.steps_.size(); ++i)
        if (p.steps_[i].kind == Kind::ByteLevel && i + 1 != p.steps_.size())
            fail(where, ": a ByteLevel pre-tokenizer must be the last of its Sequence");
    return p;
}

void PreTokenizer::add(const json& j, const std::string& where) {
    if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
        fail(where, ": pre_tokenizer without a \"type\"");
    const std::string type = j["type"];
    Step s;
    if (type == "Sequence") {
        if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
            fail(where, ": Sequence pre_tokenizer needs a \"pretokenizers\" array");
        for (const auto& x : j["pretokenizers"]) add(x, where);
        return;
    } else if (type == "Split") {
        s.kind = Kind::Split;
        const json& p = j.contains("pattern") ? j["pattern"] : json();
        if (p.contains("Regex") && p["Regex"].is_string())
            s.regex = std::make_shared<Regex>(p["Regex"].get<std::string>(), where + " Split pre_tokenizer");
        else if (p.contains("String") && p["String"].is_string())
            s.literal = p["String"];
        else
            fail(where, ": Split pre_tokenizer needs a pattern {\"Regex\"} or {\"String\"}");
        s.behavior = parse_behavior(j.value("behavior", std::string("Isolated")), where);
        s.invert = j.value("invert", false);
    } else if (type == "ByteLevel") {
        s.kind = Kind::ByteLevel;
        s.add_prefix_space = j.value("add_prefix_space", true);
        if (j.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern, where + " ByteLevel pre_tokenizer");
        byte_level_ = true;
    } else if (type == "Metaspace") {
        s.kind = Kind::Metaspace;
        s.replacement = j.value("replacement", std::string("\xE2\x96\x81"));
        if (s.replacement.empty() || utf8_invalid_offset(s.replacement) != std::string::npos)
            fail(where, ": Metaspace replacement must be one character");
        if (j.contains("prepend_scheme") && j["prepend_scheme"].is_string()) {
            const std::string ps = j["prepend_scheme"];
            if (ps == "always") s.prepend = Step::Prepend::Always;
            else if (ps == "first") s.prepend = Step::Prepend::First;
            else if (ps == "never") s.prepend = Step::Prepend::Never;
            else fail(where, ": unknown Metaspace prepend_scheme \"", ps, "\"");
        } else {
            s.prepend = j.value("add_prefix_space", true) ? Step::Prepend::Always : Step::Prepend::Never;
        }
        s.metaspace_split = j.value("split", true);
    } else if (type == "Digits") {
        s.kind = Kind::Digits;
        s.individual_digits = j.value("individual_digits", false);
    } else {
        fail(where, ": unsupported pre_tokenizer type \"", type,
             "\" (supported: Sequence, Split, ByteLevel, Metaspace, Digits)");
    }
    steps_.push_back(std::move(s));
}

void PreTokenizer::apply(const Step& s, std::vector<std::string>& pieces, std::vector<char>& origin) const {
    switch (s.kind) {
        case Kind::Split:
            if (s.regex) split_pieces(RegexFinder{*s.regex}, s.behavior, s.invert, pieces, origin);
            else split_pieces(LiteralFinder{s.literal}, s.behavior, s.invert, pieces, origin);
            break;
        case Kind::Digits:
            split_pieces(DigitFinder{s.individual_digits}, SplitBehavior::Isolated, false, pieces, origin);
            break;
        case Kind::ByteLevel:
            if (s.add_prefix_space)
                for (size_t k = 0; k < pieces.size(); ++k)
                    if (origin[k] != kOriginNoSpace && (pieces[k].empty() || pieces[k][0] != ' ')) pieces[k].insert(0, " ");
            if (s.regex) split_pieces(RegexFinder{*s.regex}, SplitBehavior::Isolated, false, pieces, origin);
            break;
        case Kind::Metaspace:
            for (size_t k = 0; k < pieces.size(); ++k) {
                std::string& p = pieces[k];
                p = replace_literal(p, " ", s.replacement);
                const bool prepend = origin[k] != kOriginNoSpace &&
                                     (s.prepend == Step::Prepend::Always || (s.prepend == Step::Prepend::First && origin[k]));
                if (prepend && p.compare(0, s.replacement.size(), s.replacement) != 0) p.insert(0, s.replacement);
            }
            if (s.metaspace_split)
                split_pieces(LiteralFinder{s.replacement}, SplitBehavior::MergedWithNext, false, pieces, origin);
            break;
    }
}

void PreTokenizer::split(std::string_view section, bool at_origin,
                         const std::function<void(std::string_view)>& on_word, bool prefix_space) const {
    if (steps_.empty()) {
        if (!section.empty()) on_word(section);
        return;
    }
    // Fast path for the byte-level families (GPT-2, Llama 3, Qwen2/3): one regex split whose words
    // are views of the section, no copies.
    if (steps_.size() <= 2 && steps_[0].kind == Kind::Split && steps_[0].regex &&
        steps_[0].behavior == SplitBehavior::Isolated && !steps_[0].invert &&
        (steps_.size() == 1 || (steps_[1].kind == Kind::ByteLevel && !steps_[1].regex && !steps_[1].add_prefix_space))) {
        size_t prev = 0;
        steps_[0].regex->for_each_match(section, [&](size_t b, size_t e) {
            if (b > prev) on_word(section.substr(prev, b - prev));
            if (e > b) on_word(section.substr(b, e - b));
            prev = e;
        });
        if (prev < section.size()) on_word(section.substr(prev));
        return;
    }
    std::vector<std::string> pieces{std::string(section)};
    std::vector<char> origin{!at_origin ? kNotOrigin : prefix_space ? kOrigin : kOriginNoSpace};
    for (const Step& s : steps_) apply(s, pieces, origin);
    for (const auto& p : pieces)
        if (!p.empty()) on_word(p);
}

void PreTokenizer::split(std::string_view section, bool at_origin, std::vector<std::string>& out) const {
    split(section, at_origin, [&](std::string_view w) { out.emplace_back(w); });
}

}  // namespace shardlm
