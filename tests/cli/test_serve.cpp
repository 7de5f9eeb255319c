// shardlm serve over HTTP, on the shipped model (given a ChatML template for the chat endpoint):
// its completions are generate's, alone or many at once through fewer slots, streamed or not,
// with stop strings; bad requests get OpenAI-style errors; SIGTERM stops it cleanly; two ranks
// serve what one does.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "fixtures.h"
#include "model/synthetic.h"
#include "runtime/json_mode.h"

using namespace shardlm::test;
using json = nlohmann::json;

namespace {

const std::string kModel = SHARDLM_SOURCE_DIR "/launch/models/kjv-small";

// The CLI under test: the build's, or the one SHARDLM_TEST_CLI names (launch/test.sh runs these
// tests once more against the CLI compiled with AddressSanitizer).
const std::string kCli = [] {
    const char* env = std::getenv("SHARDLM_TEST_CLI");
    return std::string(env && *env ? env : SHARDLM_BIN);
}();

// A `shardlm serve` (or an mpirun of it) in the background on a free port; SIGTERM on destruction.
class Server {
public:
    Server(const std::string& cmdline, const std::string& log) : log_(log) {
        pid_ = ::fork();
        if (pid_ == 0) {
            ::setpgid(0, 0);
            const std::string sh = "exec " + cmdline + " --port 0 >" + log + ".out 2>" + log;
            ::execl("/bin/sh", "sh", "-c", sh.c_str(), static_cast<char*>(nullptr));
            ::_exit(127);
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
        while (port_ == 0 && std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const std::string err = read_all();
            const std::string tag = "://127.0.0.1:";  // http or https
            const size_t at = err.find(tag, err.find("listening on "));
            if (at != std::string::npos && err.find(' ', at + tag.size()) != std::string::npos)
                port_ = std::stoi(err.substr(at + tag.size()));
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                break;
            }
        }
    }
    ~Server() {
        if (pid_ > 0) {
            ::kill(-pid_, SIGKILL);
            ::waitpid(pid_, nullptr, 0);
        }
    }
    int port() const { return port_; }
    std::string read_all() const {
        std::ifstream f(log_);
        std::stringstream s;
        s << f.rdbuf();
        return s.str();
    }
    // SIGTERM (to the process started, or to the pid the listening line names: rank 0 under
    // mpirun), then the exit status of the process started (-1: it did not end within a minute).
    int stop(bool to_listener = false) {
        if (pid_ <= 0) return -1;  // it has ended: never kill(-1), which signals every process we may
        pid_t to = pid_;
        if (to_listener) {
            const std::string err = read_all(), tag = ", pid ";
            const size_t at = err.find(tag, err.find("listening on"));
            if (at == std::string::npos) return -2;
            to = pid_t(std::stol(err.substr(at + tag.size())));
            if (to <= 0) return -2;
        }
        ::kill(to, SIGTERM);
        for (int i = 0; i < 1200; ++i) {
            int status = 0;
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        return -1;
    }

private:
    std::string log_;
    pid_t pid_ = -1;
    int port_ = 0;
};

struct Reply {
    int status = 0;
    json body;
    std::string raw;
};

// A body as text: an ordered_json keeps its keys in order (a schema's properties), json sorts them.
Reply post_text(int port, const std::string& path, const std::string& body) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(120, 0);
    const auto r = c.Post(path.c_str(), body, "application/json");
    Reply out;
    if (!r) return out;
    out.status = r->status;
    out.raw = r->body;
    try {
        out.body = json::parse(r->body);
    } catch (const json::exception&) {
    }
    return out;
}
Reply post(int port, const std::string& path, const json& body) { return post_text(port, path, body.dump()); }

// A streamed chat reply's events, put together: its content and reasoning deltas, its tool-call
// entries and the finish reason of its last event.
struct StreamedChat {
    std::string content, reasoning, finish;
    json calls = json::array();  // the tool calls, their deltas merged as OpenAI's clients merge them
    size_t call_deltas = 0;      // the tool_calls entries the stream held
};
StreamedChat streamed_chat(const std::string& raw) {
    StreamedChat out;
    std::istringstream events(raw);
    for (std::string line; std::getline(events, line);) {
        if (line.rfind("data: {", 0) != 0) continue;
        const json d = json::parse(line.substr(6))["choices"][0];
        if (d["delta"].contains("content")) out.content += d["delta"]["content"].get<std::string>();
        if (d["delta"].contains("reasoning_content")) out.reasoning += d["delta"]["reasoning_content"].get<std::string>();
        if (d["delta"].contains("tool_calls"))
            for (const json& c : d["delta"]["tool_calls"]) {
                // A call's first entry has its index, id, type and name; later ones add arguments.
                ++out.call_deltas;
                const size_t k = c["index"];
                if (k == out.calls.size()) {
                    EXPECT_TRUE(c.contains("id") && c["type"] == "function" && c["function"].contains("name")) << line;
                    out.calls.push_back(c);
                    continue;
                }
                EXPECT_LT(k, out.calls.size()) << line;
                EXPECT_FALSE(c.contains("id") || c["function"].contains("name")) << line;
                if (k >= out.calls.size()) continue;
                json& args = out.calls[k]["function"]["arguments"];
                args = args.get<std::string>() + c["function"]["arguments"].get<std::string>();
            }
        if (!d["finish_reason"].is_null()) out.finish = d["finish_reason"];
    }
    return out;
}

// A chat reply's reasoning and content (null: none) under a reasoning parser, whole and streamed
// (streamed, null is ""); the request's guided_choice makes the model write `reply`.
void expect_reasoning_parts(int port, json req, const std::string& reply, const json& reasoning, const json& content) {
    req["max_tokens"] = 100;
    req["temperature"] = 0;
    req["guided_choice"] = {reply};
    const Reply r = post(port, "/v1/chat/completions", req);
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& m = r.body["choices"][0]["message"];
    EXPECT_EQ(m["reasoning_content"], reasoning) << reply << ": " << r.raw;
    EXPECT_EQ(m["content"], content) << reply << ": " << r.raw;
    req["stream"] = true;
    const Reply s = post(port, "/v1/chat/completions", req);
    ASSERT_EQ(s.status, 200);
    const StreamedChat sc = streamed_chat(s.raw);
    EXPECT_EQ(sc.reasoning, reasoning.is_null() ? "" : reasoning.get<std::string>()) << reply << ": " << s.raw;
    EXPECT_EQ(sc.content, content.is_null() ? "" : content.get<std::string>()) << reply << ": " << s.raw;
    EXPECT_EQ(sc.finish, "stop");
}

// A streamed completion's text: its events' text deltas joined.
std::string streamed_text(const std::string& raw) {
    std::string text;
    for (size_t at = raw.find("data: {"); at != std::string::npos; at = raw.find("data: {", at + 1))
        text += json::parse(raw.substr(at + 6, raw.find('\n', at) - at - 6))["choices"][0]["text"].get<std::string>();
    return text;
}

// A sample's value in /metrics' text (-1, and a failure, when it is not there).
double metric_value(const std::string& metrics, const std::string& name) {
    const size_t at = metrics.find("\n" + name + " ");
    EXPECT_NE(at, std::string::npos) << name << "\n" << metrics;
    return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + name.size() + 2));
}

// generate's text for a prompt (greedy).
std::string generate_text(const std::string& model, const std::string& flags) {
    const CommandResult r = run_command(kCli + " generate --model " + model + " --json --temperature 0 " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return json::parse(r.out)["results"][0]["text"];
}

class Serve : public ::testing::Test {
protected:
    void SetUp() override {
        for (const std::string f : {"config.json", "model.safetensors", "tokenizer.json"})
            write_file(model_.file(f), read_file(kModel + "/" + f));
        json cfg = json::parse(read_file(kModel + "/tokenizer_config.json"));
        cfg["chat_template"] =
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
            "'\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
        write_file(model_.file("tokenizer_config.json"), cfg.dump());
    }
    // The model's chat template replaced by the file's (tokenizer_config.json's chat_template).
    void use_chat_template(const std::string& file) {
        json cfg = json::parse(read_file(model_.file("tokenizer_config.json")));
        cfg["chat_template"] = read_file(file);
        write_file(model_.file("tokenizer_config.json"), cfg.dump());
    }
    TempDir model_, logs_;
};

}  // namespace

// skip_special_tokens (vLLM's, default on): a special token (one of the shipped tokenizer's last
// merges made an added token here) forced by a bias is left out of the text, or in it when the
// request says false, whole and streamed; with tools on it stays (tool-call markers).
TEST_F(Serve, SkipSpecialTokensLeavesThemOut) {
    json t = json::parse(read_file(model_.file("tokenizer.json")));
    json& merges = t["model"]["merges"];
    ASSERT_EQ(t["model"]["vocab"]["cy"], 3071);
    ASSERT_EQ(merges[merges.size() - 1], "c y");
    t["model"]["vocab"].erase("cy");
    merges.erase(merges.size() - 1);
    t["added_tokens"].push_back({{"id", 3071}, {"content", "<|im_start|>"}, {"single_word", false}, {"lstrip", false},
                                 {"rstrip", false}, {"normalized", false}, {"special", true}});
    write_file(model_.file("tokenizer.json"), t.dump());
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 128", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    for (const bool stream : {false, true})
        for (const json& skip : {json(nullptr), json(false), json(true)}) {  // null: the default
            const Reply r = post(srv.port(), "/v1/completions",
                                 {{"prompt", "And God said"}, {"max_tokens", 2}, {"temperature", 0}, {"stream", stream},
                                  {"logit_bias", {{"3071", 100}}}, {"skip_special_tokens", skip}});
            ASSERT_EQ(r.status, 200) << r.raw;
            const std::string text = stream ? streamed_text(r.raw) : r.body["choices"][0]["text"].get<std::string>();
            EXPECT_EQ(text, skip == false ? "<|im_start|><|im_start|>" : "") << r.raw;
        }
    EXPECT_EQ(srv.stop(), 0);
    // With tools on, special tokens stay in the text whatever the request says (as vLLM's tool
    // parsers keep them): Mistral's [TOOL_CALLS] marks the calls.
    t["added_tokens"].back()["content"] = "[TOOL_CALLS]";
    write_file(model_.file("tokenizer.json"), t.dump());
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/mistral_v3.jinja");
    Server mistral(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024", logs_.file("mistral.log"));
    ASSERT_GT(mistral.port(), 0) << mistral.read_all();
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "now"}}])");
    for (const bool with_tools : {false, true}) {
        json ask = {{"messages", {{{"role", "user"}, {"content", "Time?"}}}}, {"max_tokens", 1}, {"temperature", 0},
                    {"logit_bias", {{"3071", 100}}}};
        if (with_tools) ask["tools"] = tools;
        const Reply r = post(mistral.port(), "/v1/chat/completions", ask);
        ASSERT_EQ(r.status, 200) << r.raw;
        EXPECT_EQ(r.body["choices"][0]["message"]["content"], with_tools ? "[TOOL_CALLS]" : "") << r.raw;
    }
    EXPECT_EQ(mistral.stop(), 0);
}

// vLLM's prompt_logprobs, allowed_token_ids, bad_words, return_tokens_as_token_ids and
// truncate_prompt_tokens (the Batcher's tests check the bans token by token): prompt_logprobs
// gives echo's logprobs of the prompt with ranks and texts, for completions and chat; allowed ids
// make a text of those tokens only; a banned word's token is where the free run had it no more,
// nor anywhere after; token ids name the tokens of logprobs; a truncated prompt is its last tokens.
TEST_F(Serve, VllmSamplingAndLogprobsFields) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 128", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const json prompt = {5, 6, 7, 300, 41, 9, 1200};
    const Reply echo = post(port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 3}});
    ASSERT_EQ(echo.status, 200) << echo.raw;
    const json& el = echo.body["choices"][0]["logprobs"];
    for (const int top : {0, 3, 5})
        for (const bool chat : {false, true}) {
            json body = {{"prompt_logprobs", top}, {"max_tokens", chat ? 1 : 0}};
            if (chat) body["messages"] = {{{"role", "user"}, {"content", "And God said"}}};
            else body["prompt"] = prompt;
            const Reply r = post(port, chat ? "/v1/chat/completions" : "/v1/completions", body);
            ASSERT_EQ(r.status, 200) << r.raw;
            const nlohmann::ordered_json body_in_order = nlohmann::ordered_json::parse(r.raw);  // the server's key order
            const nlohmann::ordered_json& pl = chat ? body_in_order["prompt_logprobs"] : body_in_order["choices"][0]["prompt_logprobs"];
            ASSERT_TRUE(pl.is_array()) << r.raw;
            EXPECT_EQ(pl.size(), r.body["usage"]["prompt_tokens"].get<size_t>()) << r.raw;
            EXPECT_TRUE(pl[0].is_null());
            for (size_t i = 1; i < pl.size(); ++i) {
                const nlohmann::ordered_json& e = pl[i];
                ASSERT_TRUE(e.is_object() && !e.empty()) << e;
                const std::string first = e.begin().key();  // the prompt token's entry comes first
                const nlohmann::ordered_json& own = e.begin().value();
                std::vector<double> by_rank(size_t(top) + 1, 1.0);
                for (const auto& [id, v] : e.items()) {
                    const int64_t rank = v["rank"];
                    ASSERT_GE(rank, 1) << e;
                    if (id != first || rank <= top) {
                        ASSERT_LE(rank, top) << e;
                        EXPECT_EQ(by_rank[size_t(rank)], 1.0) << "rank " << rank << " twice: " << e;
                        by_rank[size_t(rank)] = v["logprob"];
                    }
                }
                EXPECT_EQ(e.size(), size_t(top) + (own["rank"] > top)) << e;
                for (int k = 2; k <= top; ++k) EXPECT_GE(by_rank[size_t(k - 1)], by_rank[size_t(k)]) << e;
                if (top > 0) {
                    EXPECT_GE(by_rank[1], own["logprob"].get<double>()) << e;
                }
                if (chat) continue;
                EXPECT_EQ(first, std::to_string(prompt[i].get<int>()));
                EXPECT_NEAR(own["logprob"].get<double>(), el["token_logprobs"][i].get<double>(), 1e-5) << i;
                EXPECT_EQ(own["decoded_token"].get<std::string>(), el["tokens"][i].get<std::string>()) << i;
                if (top == 3) {  // echo's top_logprobs by text: the same three
                    for (const auto& [id, v] : e.items()) {
                        if (v["rank"] <= 3) {
                            EXPECT_NEAR(el["top_logprobs"][i][v["decoded_token"].get<std::string>()].get<double>(), v["logprob"].get<double>(), 1e-5);
                        }
                    }
                }
            }
            if (!chat) {
                EXPECT_EQ(r.body["choices"][0]["text"], "") << r.raw;
            }
        }
    // allowed_token_ids: the text is made of those tokens.
    const Reply the = post(port, "/tokenize", {{"prompt", " the"}, {"add_special_tokens", false}});
    const Reply and_ = post(port, "/tokenize", {{"prompt", " and"}, {"add_special_tokens", false}});
    ASSERT_EQ(the.body["tokens"].size(), 1u) << the.raw;
    ASSERT_EQ(and_.body["tokens"].size(), 1u) << and_.raw;
    for (const double temperature : {0.0, 1.0}) {
        const Reply r = post(port, "/v1/completions",
                             {{"prompt", "And God said"}, {"max_tokens", 8}, {"temperature", temperature}, {"seed", 3},
                              {"allowed_token_ids", {the.body["tokens"][0], and_.body["tokens"][0]}}});
        ASSERT_EQ(r.status, 200) << r.raw;
        EXPECT_TRUE(std::regex_match(r.body["choices"][0]["text"].get<std::string>(), std::regex("( the| and){8}"))) << r.raw;
    }
    // bad_words: the free run's first word token that recurs, banned.
    const json ask = {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"logprobs", 0}};
    const Reply free_run = post(port, "/v1/completions", ask);
    ASSERT_EQ(free_run.status, 200) << free_run.raw;
    const json& ft = free_run.body["choices"][0]["logprobs"]["tokens"];
    size_t k = 0;
    while (k < ft.size() && !std::regex_match(ft[k].get<std::string>(), std::regex(" [a-z]+"))) ++k;
    ASSERT_LT(k, ft.size()) << free_run.raw;
    const std::string word = ft[k];
    json banned = ask;
    banned["bad_words"] = {word.substr(1)};
    const Reply r = post(port, "/v1/completions", banned);
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& bt = r.body["choices"][0]["logprobs"]["tokens"];
    ASSERT_GT(bt.size(), k) << r.raw;
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(bt[i], ft[i]) << i;
    for (size_t i = k; i < bt.size(); ++i) EXPECT_NE(bt[i], word) << i << ": " << r.raw;

    // return_tokens_as_token_ids: the same logprobs, tokens named by id; offsets still the text's.
    const json lreq = {{"prompt", prompt}, {"max_tokens", 4}, {"echo", true}, {"logprobs", 2}};
    json as_ids_req = lreq;
    as_ids_req["return_tokens_as_token_ids"] = true;
    const Reply by_text = post(port, "/v1/completions", lreq), by_id = post(port, "/v1/completions", as_ids_req);
    ASSERT_EQ(by_id.status, 200) << by_id.raw;
    const json &lt = by_text.body["choices"][0]["logprobs"], &li = by_id.body["choices"][0]["logprobs"];
    ASSERT_EQ(li["tokens"].size(), 11u) << by_id.raw;
    EXPECT_EQ(li["text_offset"], lt["text_offset"]);
    EXPECT_EQ(li["token_logprobs"], lt["token_logprobs"]);
    for (size_t i = 0; i < 7; ++i) EXPECT_EQ(li["tokens"][i], "token_id:" + std::to_string(prompt[i].get<int>())) << i;
    for (size_t i = 1; i < 11; ++i) {
        EXPECT_EQ(li["top_logprobs"][i].size(), lt["top_logprobs"][i].size()) << i;
        for (const auto& [key, v] : li["top_logprobs"][i].items()) EXPECT_EQ(key.rfind("token_id:", 0), 0u) << key;
    }
    json chat_ids = {{"messages", {{{"role", "user"}, {"content", "And God said"}}}}, {"max_tokens", 3},
                     {"logprobs", true}, {"top_logprobs", 1}, {"return_tokens_as_token_ids", true}};
    const Reply ci = post(port, "/v1/chat/completions", chat_ids);
    ASSERT_EQ(ci.status, 200) << ci.raw;
    for (const json& e : ci.body["choices"][0]["logprobs"]["content"]) {
        const std::string name = e["token"];
        EXPECT_TRUE(std::regex_match(name, std::regex("token_id:[0-9]+"))) << e;
        EXPECT_EQ(e["bytes"].size(), name.size()) << e;
        EXPECT_EQ(e["top_logprobs"][0]["token"].get<std::string>().rfind("token_id:", 0), 0u) << e;
    }

    // truncate_prompt_tokens: the prompt's last 3 tokens, as if sent alone (echo shows those).
    const json last3 = {prompt[4], prompt[5], prompt[6]};
    for (const bool echoed : {false, true}) {
        const Reply t = post(port, "/v1/completions",
                             {{"prompt", prompt}, {"max_tokens", 5}, {"temperature", 0}, {"echo", echoed}, {"truncate_prompt_tokens", 3}});
        const Reply alone = post(port, "/v1/completions", {{"prompt", last3}, {"max_tokens", 5}, {"temperature", 0}, {"echo", echoed}});
        ASSERT_EQ(t.status, 200) << t.raw;
        EXPECT_EQ(t.body["choices"][0]["text"], alone.body["choices"][0]["text"]) << t.raw;
        EXPECT_EQ(t.body["usage"]["prompt_tokens"], 3) << t.raw;
    }
    const Reply tc = post(port, "/v1/chat/completions",
                          {{"messages", {{{"role", "user"}, {"content", "And God said"}}}}, {"max_tokens", 1}, {"truncate_prompt_tokens", 4}});
    ASSERT_EQ(tc.status, 200) << tc.raw;
    EXPECT_EQ(tc.body["usage"]["prompt_tokens"], 4) << tc.raw;
    const Reply tz = post(port, "/v1/completions", {{"prompt", prompt}, {"truncate_prompt_tokens", 0}});
    EXPECT_EQ(tz.status, 400) << tz.raw;
    EXPECT_EQ(tz.body["error"]["message"].get<std::string>().rfind("\"truncate_prompt_tokens\" must be -1", 0), 0u) << tz.raw;

    // return_token_ids: the prompt's ids and the generated ones (those logprobs name, as many as
    // usage counts, the end-of-sequence id included); streamed, each choice's (completions) or
    // the stream's (chat) first event has the prompt's, and the events' ids add up to the whole's.
    auto ids_of_logprobs = [](const json& lp) {
        std::vector<int32_t> ids;
        for (const json& t : lp["tokens"]) ids.push_back(std::stoi(t.get<std::string>().substr(9)));
        return ids;
    };
    const json text_prompt = "And God said";
    const json want_prompt = post(port, "/tokenize", {{"prompt", text_prompt}}).body["tokens"];
    json ids_req = {{"prompt", {text_prompt, "In the beginning"}}, {"max_tokens", 6}, {"temperature", 0.9}, {"seed", 2}, {"n", 2},
                    {"logprobs", 0}, {"return_tokens_as_token_ids", true}, {"return_token_ids", true}};
    const Reply ri = post(port, "/v1/completions", ids_req);
    ASSERT_EQ(ri.status, 200) << ri.raw;
    ASSERT_EQ(ri.body["choices"].size(), 4u);
    EXPECT_EQ(ri.body["choices"][0]["prompt_token_ids"], want_prompt) << ri.raw;
    EXPECT_EQ(ri.body["choices"][1]["prompt_token_ids"], want_prompt) << ri.raw;
    EXPECT_EQ(ri.body["choices"][2]["prompt_token_ids"], post(port, "/tokenize", {{"prompt", "In the beginning"}}).body["tokens"]);
    int64_t counted = 0;
    for (const json& c : ri.body["choices"]) {
        EXPECT_EQ(c["token_ids"].get<std::vector<int32_t>>(), ids_of_logprobs(c["logprobs"])) << c;
        counted += int64_t(c["token_ids"].size());
    }
    EXPECT_EQ(counted, ri.body["usage"]["completion_tokens"]);
    ids_req["stream"] = true;
    {
        const Reply st = post(port, "/v1/completions", ids_req);
        std::vector<json> ids(4, json::array());
        std::vector<int> firsts(4, 0);
        std::istringstream lines(st.raw);
        for (std::string line; std::getline(lines, line);) {
            if (line.rfind("data: {", 0) != 0) continue;
            const json c = json::parse(line.substr(6))["choices"][0];
            const size_t i = c["index"];
            ASSERT_LT(i, 4u);
            ASSERT_TRUE(c.contains("token_ids")) << line;
            for (const json& id : c["token_ids"]) ids[i].push_back(id);
            if (c.contains("prompt_token_ids")) {
                EXPECT_EQ(firsts[i]++, 0) << line;  // the first event of the choice only
                EXPECT_EQ(c["prompt_token_ids"], ri.body["choices"][i]["prompt_token_ids"]);
            }
        }
        for (size_t i = 0; i < 4; ++i) {
            EXPECT_EQ(ids[i], ri.body["choices"][i]["token_ids"]) << st.raw;
            EXPECT_EQ(firsts[i], 1) << st.raw;
        }
    }
    // Chat: a reply the constraint ends (no end-of-sequence id: the constraint ends it).
    json chat_tok = {{"messages", {{{"role", "user"}, {"content", "And God said"}}}}, {"guided_choice", {"Let there be light"}},
                     {"max_tokens", 40}, {"return_token_ids", true}};
    const Reply rc = post(port, "/v1/chat/completions", chat_tok);
    ASSERT_EQ(rc.status, 200) << rc.raw;
    EXPECT_EQ(rc.body["prompt_token_ids"], post(port, "/tokenize", {{"messages", chat_tok["messages"]}}).body["tokens"]) << rc.raw;
    const json& generated = rc.body["choices"][0]["token_ids"];
    ASSERT_EQ(int64_t(generated.size()), rc.body["usage"]["completion_tokens"].get<int64_t>()) << rc.raw;
    EXPECT_EQ(rc.body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(rc.body["choices"][0]["message"]["content"], "Let there be light") << rc.raw;
    EXPECT_EQ(post(port, "/detokenize", {{"tokens", generated}}).body["prompt"], "Let there be light") << rc.raw;
    {  // an end-of-sequence id is among them, though not in the text
        const json cfg = json::parse(read_file(model_.file("config.json")));
        const int64_t eos = cfg["eos_token_id"].is_array() ? cfg["eos_token_id"][0].get<int64_t>() : cfg["eos_token_id"].get<int64_t>();
        const Reply re = post(port, "/v1/chat/completions", {{"messages", chat_tok["messages"]}, {"max_tokens", 5}, {"return_token_ids", true},
                                                              {"logit_bias", {{std::to_string(eos), 100}}}});
        ASSERT_EQ(re.status, 200) << re.raw;
        EXPECT_EQ(re.body["choices"][0]["token_ids"], json::array({eos})) << re.raw;
        EXPECT_EQ(re.body["choices"][0]["message"]["content"], "") << re.raw;
        EXPECT_EQ(re.body["usage"]["completion_tokens"], 1) << re.raw;
    }
    chat_tok["stream"] = true;
    {
        const Reply st = post(port, "/v1/chat/completions", chat_tok);
        json ids = json::array();
        size_t events = 0, prompts = 0;
        std::istringstream lines(st.raw);
        for (std::string line; std::getline(lines, line);) {
            if (line.rfind("data: {", 0) != 0) continue;
            const json ev = json::parse(line.substr(6));
            if (ev.contains("prompt_token_ids")) {
                EXPECT_EQ(events, 0u) << line;
                EXPECT_EQ(ev["prompt_token_ids"], rc.body["prompt_token_ids"]);
                ++prompts;
            }
            ++events;
            for (const json& id : ev["choices"][0]["token_ids"]) ids.push_back(id);
        }
        EXPECT_EQ(prompts, 1u);
        EXPECT_EQ(ids, generated) << st.raw;
    }
    chat_tok.erase("stream");
    chat_tok.erase("return_token_ids");
    const Reply plain_ids = post(port, "/v1/chat/completions", chat_tok);
    EXPECT_FALSE(plain_ids.body.contains("prompt_token_ids") || plain_ids.body["choices"][0].contains("token_ids")) << plain_ids.raw;
    EXPECT_EQ(srv.stop(), 0);
}

// vLLM's use_beam_search (runtime/beam_search.h is checked against exhaustive search): width 1
// without end-of-sequence ids is greedy; two beams of two tokens are what the rows' logprobs
// give, worked out here from three scoring requests (ids by return_tokens_as_token_ids); usage;
// the fields it does not go with are refused.
TEST_F(Serve, BeamSearchKeepsTheBestBeams) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 128", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const json prompt = {5, 6, 7, 300, 41};
    const Reply greedy = post(port, "/v1/completions", {{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}});
    const Reply one = post(port, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 6}, {"use_beam_search", true}, {"ignore_eos", true}});
    ASSERT_EQ(one.status, 200) << one.raw;
    EXPECT_EQ(one.body["choices"][0]["text"], greedy.body["choices"][0]["text"]) << one.raw;
    // Two beams, two tokens: the first row's 4 best, the 2 best of them go on, each with its 4 best.
    auto top = [&](const json& ids, int n) {  // id -> logprob of the next token's n best
        const Reply r = post(port, "/v1/completions", {{"prompt", ids}, {"max_tokens", 1}, {"logprobs", n},
                                                       {"return_tokens_as_token_ids", true}});
        std::vector<std::pair<double, int>> out;
        for (const auto& [key, v] : r.body["choices"][0]["logprobs"]["top_logprobs"][0].items())
            out.push_back({v.get<double>(), std::stoi(key.substr(9))});
        std::sort(out.begin(), out.end(), std::greater<>());
        out.resize(size_t(n));  // (the drawn token is listed too)
        return out;
    };
    std::vector<std::pair<double, std::vector<int>>> beams;
    const auto first = top(prompt, 4);
    for (size_t i = 0; i < 2; ++i) {
        json ids = prompt;
        ids.push_back(first[i].second);
        for (const auto& [lp, id] : top(ids, 4)) beams.push_back({first[i].first + lp, {first[i].second, id}});
    }
    std::stable_sort(beams.begin(), beams.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    const Reply two = post(port, "/v1/completions",
                           {{"prompt", prompt}, {"max_tokens", 2}, {"n", 2}, {"use_beam_search", true}, {"ignore_eos", true}});
    ASSERT_EQ(two.status, 200) << two.raw;
    ASSERT_EQ(two.body["choices"].size(), 2u) << two.raw;
    for (size_t j = 0; j < 2; ++j) {
        const Reply text = post(port, "/detokenize", {{"tokens", beams[j].second}});
        EXPECT_EQ(two.body["choices"][j]["text"], text.body["prompt"]) << "beam " << j << ": " << two.raw;
        EXPECT_EQ(two.body["choices"][j]["finish_reason"], "length");
    }
    EXPECT_EQ(two.body["usage"]["prompt_tokens"], 5);
    EXPECT_EQ(two.body["usage"]["completion_tokens"], 4);
    // Chat, and a list of prompts: n choices per prompt.
    const Reply chat = post(port, "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "And God said"}}}},
                                                           {"max_tokens", 3}, {"n", 3}, {"use_beam_search", true}});
    ASSERT_EQ(chat.status, 200) << chat.raw;
    EXPECT_EQ(chat.body["choices"].size(), 3u);
    const Reply many = post(port, "/v1/completions", {{"prompt", {"And God said", "In the beginning"}}, {"max_tokens", 3}, {"n", 2},
                                                      {"use_beam_search", true}, {"length_penalty", 0.5}});
    ASSERT_EQ(many.status, 200) << many.raw;
    EXPECT_EQ(many.body["choices"].size(), 4u);
    EXPECT_NE(many.body["choices"][0]["text"], many.body["choices"][1]["text"]);
    auto error_of = [&](const json& extra, const std::string& message) {
        json body = {{"prompt", "x"}, {"use_beam_search", true}};
        body.update(extra);
        const Reply r = post(port, "/v1/completions", body);
        EXPECT_EQ(r.status, 400) << r.raw;
        EXPECT_EQ(r.body["error"]["message"], message) << r.raw;
    };
    error_of({{"stream", true}}, "\"use_beam_search\" with \"stream\" is not supported");
    error_of({{"logprobs", 1}}, "\"use_beam_search\" with \"logprobs\" is not supported");
    error_of({{"stop", "x"}}, "\"use_beam_search\" with \"stop\" strings is not supported");
    error_of({{"use_beam_search", false}, {"length_penalty", 2}}, "\"length_penalty\" is beam search's: it needs \"use_beam_search\": true");
    EXPECT_EQ(srv.stop(), 0);
}

namespace {
// A Responses stream's events, each checked to name its type on its event line.
std::vector<json> responses_events(const std::string& raw) {
    std::vector<json> out;
    size_t at = 0;
    while (at < raw.size()) {
        const size_t end = raw.find("\n\n", at);
        const std::string block = raw.substr(at, end == std::string::npos ? std::string::npos : end - at);
        at = end == std::string::npos ? raw.size() : end + 2;
        if (block.empty()) continue;
        const size_t nl = block.find('\n');
        EXPECT_EQ(block.substr(0, 7), "event: ") << block;
        EXPECT_EQ(block.substr(nl + 1, 6), "data: ") << block;
        out.push_back(json::parse(block.substr(nl + 7)));
        EXPECT_EQ(out.back()["type"], block.substr(7, nl - 7)) << block;
    }
    return out;
}
// An output list without its ids (they name the request).
json without_ids(json output) {
    for (json& item : output) {
        item.erase("id");
        item.erase("call_id");
    }
    return output;
}
}  // namespace

// OpenAI's Responses API (/v1/responses) runs the chat path, and keeps what it made: the same prompt tokens as the chat
// request it stands for (instructions and developer messages as the system message, text parts,
// function tools, a later turn's function_call and function_call_output items as the assistant's
// tool calls and the tool's message), the reply as reasoning, message and function_call items
// with the chat response's texts; streamed, the deltas add up to those items and the last event
// carries the same output; a reply cut by max_output_tokens is incomplete; unsupported fields are
// refused by name.
// "background": the response comes back at once, queued; GET reads it while it runs and once it
// has ended (what the same request gives without background); a cancel ends it where it stands;
// what cannot be done to a running or a non-background response is refused by name; a shutdown
// with one running stops cleanly.
TEST_F(Serve, ResponsesInTheBackground) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/qwen25.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024 --batch 1", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    httplib::Client http("127.0.0.1", port);
    auto get = [&](const std::string& id) {
        const auto r = http.Get("/v1/responses/" + id);
        return r ? json::parse(r->body) : json();
    };
    const json req = {{"input", "And God said"}, {"max_output_tokens", 24}, {"temperature", 0}, {"store", false}};
    const Reply plain = post(port, "/v1/responses", req);
    ASSERT_EQ(plain.status, 200) << plain.raw;
    json breq = req;
    breq["background"] = true;
    breq.erase("store");
    const Reply b = post(port, "/v1/responses", breq);
    ASSERT_EQ(b.status, 200) << b.raw;
    EXPECT_EQ(b.body["status"], "queued");
    EXPECT_EQ(b.body["background"], true);
    EXPECT_TRUE(b.body["output"].empty());
    const std::string id = b.body["id"];
    json got;
    for (int i = 0; i < 600; ++i) {
        got = get(id);
        if (got.value("status", "") != "queued" && got.value("status", "") != "in_progress") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(got["status"], plain.body["status"]) << got.dump();
    EXPECT_EQ(got["output"][0]["content"][0]["text"], plain.body["output"][0]["content"][0]["text"]) << got.dump();
    EXPECT_EQ(got["usage"]["output_tokens"], 24);
    EXPECT_EQ(got["background"], true);
    // Its conversation goes on, as a stored response's.
    const Reply next = post(port, "/v1/responses", {{"previous_response_id", id}, {"input", "And?"}, {"max_output_tokens", 2}});
    EXPECT_EQ(next.status, 200) << next.raw;
    // An ended one is given as it is by a cancel.
    const auto again = http.Post("/v1/responses/" + id + "/cancel", "", "application/json");
    ASSERT_TRUE(again);
    EXPECT_EQ(again->status, 200);
    EXPECT_EQ(json::parse(again->body)["status"], plain.body["status"]);

    // One behind a long request in the only slot (four sequences of 900 tokens): not continued,
    // not deleted while it waits; cancelled, it ends with what it made.
    std::thread blocker([&] {
        post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 900}, {"ignore_eos", true}, {"n", 4}, {"temperature", 0}});
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    json longer = breq;
    longer["max_output_tokens"] = 900;
    longer["ignore_eos"] = true;
    const Reply l = post(port, "/v1/responses", longer);
    ASSERT_EQ(l.status, 200) << l.raw;
    const std::string lid = l.body["id"];
    const Reply early = post(port, "/v1/responses", {{"previous_response_id", lid}, {"input", "And?"}});
    EXPECT_EQ(early.status, 400) << early.raw;
    EXPECT_NE(early.body["error"]["message"].get<std::string>().find("is still running in the background"), std::string::npos) << early.raw;
    const auto del = http.Delete("/v1/responses/" + lid);
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 400) << del->body;
    const json waiting = get(lid);  // (the slot is the blocker's for a second or more)
    EXPECT_EQ(waiting["status"], "queued") << waiting.dump();
    EXPECT_TRUE(waiting["output"].empty());
    const auto cancel = http.Post("/v1/responses/" + lid + "/cancel", "", "application/json");
    ASSERT_TRUE(cancel);
    ASSERT_EQ(cancel->status, 200) << cancel->body;
    const json c = json::parse(cancel->body);
    EXPECT_EQ(c["status"], "cancelled") << c.dump();
    EXPECT_LT(c["usage"]["output_tokens"].get<int>(), 900);
    EXPECT_EQ(get(lid), c);
    blocker.join();

    // Refused: a non-background response's cancel, an unknown id's, background without store.
    const Reply stored = post(port, "/v1/responses", {{"input", "And God said"}, {"max_output_tokens", 1}});
    ASSERT_EQ(stored.status, 200) << stored.raw;
    const auto sync = http.Post("/v1/responses/" + stored.body["id"].get<std::string>() + "/cancel", "", "application/json");
    ASSERT_TRUE(sync);
    EXPECT_EQ(sync->status, 400);
    EXPECT_NE(sync->body.find("was not made in the background"), std::string::npos) << sync->body;
    EXPECT_EQ(http.Post("/v1/responses/resp_nothing/cancel", "", "application/json")->status, 404);
    const Reply unstored = post(port, "/v1/responses", {{"input", "x"}, {"background", true}, {"store", false}});
    EXPECT_EQ(unstored.status, 400);
    EXPECT_NE(unstored.raw.find("\\\"background\\\" needs \\\"store\\\": true"), std::string::npos) << unstored.raw;
    // Shutting down with one running: a clean stop.
    const Reply running = post(port, "/v1/responses", longer);
    ASSERT_EQ(running.status, 200) << running.raw;
    EXPECT_EQ(srv.stop(), 0) << srv.read_all();
}

// A response made in the background with "stream": its events come as they would without
// background (numbered from 0, created saying "queued"), and GET with ?stream=true gives them again
// from any sequence number, while it runs or once it has ended; a reader that goes away leaves it
// running; a cancelled one's stream ends after its last item, and its object says cancelled.
TEST_F(Serve, ResponsesStreamedInTheBackground) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/qwen25.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024 --batch 1", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    httplib::Client http("127.0.0.1", port);
    http.set_read_timeout(120, 0);
    auto get = [&](const std::string& path) {
        const auto r = http.Get(path.c_str());
        return r ? std::make_pair(r->status, r->body) : std::make_pair(0, std::string());
    };
    // A stream read until `enough` says so (the reader then goes away), or to its end.
    auto read_until = [&](const std::string& method, const std::string& path, const json& body,
                          const std::function<bool(const std::string&)>& enough) {
        httplib::Request rq;
        rq.method = method;
        rq.path = path;
        if (!body.is_null()) {
            rq.body = body.dump();
            rq.set_header("Content-Type", "application/json");
        }
        std::string raw;
        rq.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
            raw.append(data, n);
            return !enough(raw);
        };
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(120, 0);
        c.send(rq);
        return raw;
    };
    auto text_of = [](const std::vector<json>& ev) {
        std::string t;
        for (const json& e : ev)
            if (e["type"] == "response.output_text.delta") t += e["delta"].get<std::string>();
        return t;
    };
    const json req = {{"input", "And God said"}, {"max_output_tokens", 24}, {"temperature", 0}, {"store", false}};
    const Reply plain = post(port, "/v1/responses", req);
    ASSERT_EQ(plain.status, 200) << plain.raw;
    json breq = req;
    breq["background"] = true;
    breq["stream"] = true;
    breq.erase("store");
    const Reply b = post(port, "/v1/responses", breq);
    ASSERT_EQ(b.status, 200) << b.raw;
    const std::vector<json> ev = responses_events(b.raw);
    ASSERT_GE(ev.size(), 4u) << b.raw;
    for (size_t k = 0; k < ev.size(); ++k) EXPECT_EQ(ev[k]["sequence_number"], k) << b.raw;
    EXPECT_EQ(ev[0]["type"], "response.created");
    EXPECT_EQ(ev[0]["response"]["status"], "queued");
    EXPECT_EQ(ev[0]["response"]["background"], true);
    EXPECT_EQ(ev[1]["type"], "response.in_progress");
    EXPECT_EQ(ev.back()["type"], plain.body["status"] == "incomplete" ? "response.incomplete" : "response.completed");
    EXPECT_EQ(text_of(ev), plain.body["output"][0]["content"][0]["text"]) << b.raw;
    const std::string id = ev[0]["response"]["id"];
    const auto whole = get("/v1/responses/" + id);
    ASSERT_EQ(whole.first, 200) << whole.second;
    EXPECT_EQ(json::parse(whole.second), ev.back()["response"]);
    EXPECT_EQ(without_ids(json::parse(whole.second)["output"]), without_ids(plain.body["output"]));
    // Streamed again: all of it, or from after a sequence number.
    EXPECT_EQ(get("/v1/responses/" + id + "?stream=true").second, b.raw);
    const auto after3 = get("/v1/responses/" + id + "?stream=true&starting_after=3");
    EXPECT_EQ(responses_events(after3.second), std::vector<json>(ev.begin() + 4, ev.end()));
    for (const char* bad : {"-1", "x", "3x", ""}) {
        const auto r = get("/v1/responses/" + id + "?stream=true&starting_after=" + bad);
        EXPECT_EQ(r.first, 400) << bad;
        EXPECT_NE(r.second.find("starting_after must be a sequence number"), std::string::npos) << r.second;
    }
    const Reply sync = post(port, "/v1/responses", {{"input", "And God said"}, {"max_output_tokens", 1}});
    const auto not_background = get("/v1/responses/" + sync.body["id"].get<std::string>() + "?stream=true");
    EXPECT_EQ(not_background.first, 400);
    EXPECT_NE(not_background.second.find("was not made with \\\"background\\\" and \\\"stream\\\""), std::string::npos)
        << not_background.second;
    EXPECT_EQ(get("/v1/responses/resp_nothing?stream=true").first, 404);

    // A long one whose first reader goes away after its first text: it runs on to its end, and a
    // second reader goes on from where the first stopped.
    json longer = breq;
    longer["max_output_tokens"] = 600;
    longer["ignore_eos"] = true;
    const std::string first = read_until("POST", "/v1/responses", longer,
                                         [](const std::string& raw) { return raw.find("response.output_text.delta") != std::string::npos; });
    const std::vector<json> head = responses_events(first.substr(0, first.rfind("\n\n") + 2));
    ASSERT_GE(head.size(), 3u) << first;
    const std::string lid = head[0]["response"]["id"];
    const int64_t last = head.back()["sequence_number"];
    const auto rest = get("/v1/responses/" + lid + "?stream=true&starting_after=" + std::to_string(last));
    ASSERT_EQ(rest.first, 200);
    const std::vector<json> tail = responses_events(rest.second);
    ASSERT_FALSE(tail.empty());
    EXPECT_EQ(tail[0]["sequence_number"], last + 1);
    EXPECT_EQ(tail.back()["type"], "response.incomplete");
    EXPECT_EQ(tail.back()["response"]["usage"]["output_tokens"], 600);
    std::vector<json> all = head;
    all.insert(all.end(), tail.begin(), tail.end());
    EXPECT_EQ(all, responses_events(get("/v1/responses/" + lid + "?stream=true").second));

    // Cancelled behind a long request in the only slot: its stream holds what it made and no
    // last event; its object says cancelled.
    std::thread blocker([&] {
        post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 900}, {"ignore_eos", true}, {"n", 4}, {"temperature", 0}});
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string queued = read_until("POST", "/v1/responses", longer,
                                          [](const std::string& raw) { return raw.find("response.in_progress") != std::string::npos; });
    const std::vector<json> qhead = responses_events(queued.substr(0, queued.rfind("\n\n") + 2));
    ASSERT_FALSE(qhead.empty()) << queued;
    const std::string qid = qhead[0]["response"]["id"];
    const auto cancel = http.Post("/v1/responses/" + qid + "/cancel", "", "application/json");
    ASSERT_TRUE(cancel);
    ASSERT_EQ(cancel->status, 200) << cancel->body;
    EXPECT_EQ(json::parse(cancel->body)["status"], "cancelled");
    const std::vector<json> qev = responses_events(get("/v1/responses/" + qid + "?stream=true").second);
    ASSERT_GE(qev.size(), 2u);
    for (const json& e : qev) {
        EXPECT_NE(e["type"], "response.completed");
        EXPECT_NE(e["type"], "response.incomplete");
        EXPECT_NE(e["type"], "response.failed");
    }
    EXPECT_EQ(text_of(qev), json::parse(cancel->body)["output"].empty()
                                ? std::string()
                                : json::parse(cancel->body)["output"][0]["content"][0]["text"].get<std::string>());
    blocker.join();
    // Shutting down with one streaming in the background (behind the long request again): its
    // reader gets response.failed.
    std::thread blocker2([&] {
        post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 900}, {"ignore_eos", true}, {"n", 4}, {"temperature", 0}});
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::string failed;
    std::thread reader([&] { failed = read_until("POST", "/v1/responses", longer, [](const std::string&) { return false; }); });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(srv.stop(), 0) << srv.read_all();
    reader.join();
    blocker2.join();
    EXPECT_NE(failed.find("event: response.failed"), std::string::npos) << failed.substr(failed.size() > 2000 ? failed.size() - 2000 : 0);
}

TEST_F(Serve, ResponsesApiIsTheChatPath) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/qwen25.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024 --reasoning-parser qwen3", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const json params = json::parse(R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
    const json chat_tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"description", "Weather"}, {"parameters", params}}}}};
    const json resp_tools = {{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather"}, {"parameters", params}}};
    const std::string reply = "<think>\nA tool knows.\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const json chat_req = {{"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Weather in Paris?"}}}},
                           {"tools", chat_tools}, {"max_tokens", 200}, {"temperature", 0}, {"guided_choice", {reply}}};
    const Reply chat = post(port, "/v1/chat/completions", chat_req);
    ASSERT_EQ(chat.status, 200) << chat.raw;
    const json& msg = chat.body["choices"][0]["message"];
    ASSERT_EQ(msg["tool_calls"].size(), 1u) << chat.raw;
    json resp_req = {{"model", "kjv"}, {"instructions", "Be brief."},
                     {"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather in Paris?"}}}}}}},
                     {"tools", resp_tools}, {"max_output_tokens", 200}, {"temperature", 0}, {"guided_choice", {reply}}};
    resp_req.erase("model");
    const Reply r = post(port, "/v1/responses", resp_req);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["object"], "response");
    EXPECT_EQ(r.body["status"], "completed");
    EXPECT_EQ(r.body["id"].get<std::string>().substr(0, 5), "resp_");
    EXPECT_EQ(r.body["usage"]["input_tokens"], chat.body["usage"]["prompt_tokens"]) << r.raw;
    EXPECT_EQ(r.body["usage"]["output_tokens"], chat.body["usage"]["completion_tokens"]);
    EXPECT_GT(r.body["usage"]["output_tokens_details"]["reasoning_tokens"].get<int>(), 0);
    EXPECT_EQ(r.body["instructions"], "Be brief.");
    const json& out = r.body["output"];
    ASSERT_EQ(out.size(), 3u) << r.raw;
    EXPECT_EQ(out[0]["type"], "reasoning");
    EXPECT_EQ(out[0]["content"][0]["text"], msg["reasoning_content"]);
    EXPECT_EQ(out[1]["type"], "message");
    EXPECT_EQ(out[1]["content"][0]["type"], "output_text");
    EXPECT_EQ(out[1]["content"][0]["text"], msg["content"]);
    EXPECT_EQ(out[2]["type"], "function_call");
    EXPECT_EQ(out[2]["name"], "get_weather");
    EXPECT_EQ(out[2]["arguments"], msg["tool_calls"][0]["function"]["arguments"]);
    const std::string call_id = out[2]["call_id"];
    EXPECT_FALSE(call_id.empty());

    // Streamed: created and in_progress, each item added, its deltas, done; then completed with
    // the same output.
    json sreq = resp_req;
    sreq["stream"] = true;
    const Reply streamed = post(port, "/v1/responses", sreq);
    ASSERT_EQ(streamed.status, 200) << streamed.raw;
    const std::vector<json> ev = responses_events(streamed.raw);
    ASSERT_GE(ev.size(), 10u) << streamed.raw;
    std::map<std::string, std::string> deltas;
    std::vector<int> added, done;
    for (size_t i = 0; i < ev.size(); ++i) {
        EXPECT_EQ(ev[i]["sequence_number"], i);
        const std::string type = ev[i]["type"];
        if (type.size() > 6 && type.substr(type.size() - 6) == ".delta") deltas[type] += ev[i]["delta"].get<std::string>();
        if (type == "response.output_item.added") added.push_back(ev[i]["output_index"]);
        if (type == "response.output_item.done") done.push_back(ev[i]["output_index"]);
    }
    EXPECT_EQ(ev[0]["type"], "response.created");
    EXPECT_EQ(ev[0]["response"]["status"], "in_progress");
    EXPECT_EQ(ev[1]["type"], "response.in_progress");
    EXPECT_EQ(deltas["response.reasoning_text.delta"], msg["reasoning_content"]);
    EXPECT_EQ(deltas["response.output_text.delta"], msg["content"]);
    EXPECT_EQ(deltas["response.function_call_arguments.delta"], msg["tool_calls"][0]["function"]["arguments"]);
    EXPECT_EQ(added, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(done, (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(ev.back()["type"], "response.completed");
    EXPECT_EQ(without_ids(ev.back()["response"]["output"]), without_ids(out)) << streamed.raw;
    json usage = ev.back()["response"]["usage"], whole_usage = r.body["usage"];
    usage.erase("input_tokens_details");  // (the prefix cache holds more of the prompt by now)
    whole_usage.erase("input_tokens_details");
    EXPECT_EQ(usage, whole_usage);

    // The next turn: the call and its output as items, the prompt of the chat turn with the
    // assistant's tool call and the tool's message.
    json next_chat = chat_req;
    next_chat["messages"].push_back({{"role", "assistant"}, {"content", nullptr},
                                     {"tool_calls", {{{"id", call_id}, {"type", "function"},
                                                      {"function", {{"name", "get_weather"}, {"arguments", out[2]["arguments"]}}}}}}});
    next_chat["messages"].push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", "Sunny"}});
    next_chat["guided_choice"] = {"Sunny."};
    json next_resp = resp_req;
    next_resp["input"].push_back({{"type", "function_call"}, {"call_id", call_id}, {"name", "get_weather"}, {"arguments", out[2]["arguments"]}});
    next_resp["input"].push_back({{"type", "function_call_output"}, {"call_id", call_id}, {"output", "Sunny"}});
    next_resp["input"].push_back({{"type", "reasoning"}, {"id", "rs_x"}, {"summary", json::array()}});  // dropped
    next_resp["guided_choice"] = {"Sunny."};
    const Reply nc = post(port, "/v1/chat/completions", next_chat), nr = post(port, "/v1/responses", next_resp);
    ASSERT_EQ(nr.status, 200) << nr.raw;
    EXPECT_EQ(nr.body["usage"]["input_tokens"], nc.body["usage"]["prompt_tokens"]) << nr.raw;
    ASSERT_EQ(nr.body["output"].size(), 1u) << nr.raw;
    EXPECT_EQ(nr.body["output"][0]["content"][0]["text"], "Sunny.");

    // Stored responses (store defaults to true): GET gives the object back; previous_response_id
    // continues its conversation, the reply's text and call as the assistant's turn, with this
    // request's instructions; a streamed response is stored too; store false, a deleted id and an
    // unknown one are not there.
    httplib::Client http("127.0.0.1", port);
    const std::string rid = r.body["id"];
    const auto got = http.Get("/v1/responses/" + rid);
    ASSERT_TRUE(got);
    EXPECT_EQ(json::parse(got->body), r.body);
    json cont = {{"previous_response_id", rid}, {"instructions", "Be brief."}, {"tools", resp_tools}, {"guided_choice", {"Sunny."}},
                 {"input", {{{"type", "function_call_output"}, {"call_id", call_id}, {"output", "Sunny"}}}}};
    const Reply cr = post(port, "/v1/responses", cont);
    ASSERT_EQ(cr.status, 200) << cr.raw;
    EXPECT_EQ(cr.body["previous_response_id"], rid);
    json as_chat = chat_req["messages"];
    as_chat.push_back({{"role", "assistant"}, {"content", msg["content"]},
                       {"tool_calls", {{{"id", call_id}, {"type", "function"},
                                        {"function", {{"name", "get_weather"}, {"arguments", out[2]["arguments"]}}}}}}});
    as_chat.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", "Sunny"}});
    const Reply counted = post(port, "/tokenize", {{"messages", as_chat}, {"tools", chat_tools}});
    ASSERT_EQ(counted.status, 200) << counted.raw;
    EXPECT_EQ(cr.body["usage"]["input_tokens"], counted.body["count"]) << cr.raw;
    EXPECT_EQ(cr.body["output"][0]["content"][0]["text"], "Sunny.");
    const std::string sid = ev.back()["response"]["id"];
    const auto got_streamed = http.Get("/v1/responses/" + sid);
    ASSERT_TRUE(got_streamed);
    EXPECT_EQ(got_streamed->status, 200);
    EXPECT_EQ(json::parse(got_streamed->body)["output"], ev.back()["response"]["output"]);
    json unstored = resp_req;
    unstored["store"] = false;
    const Reply u = post(port, "/v1/responses", unstored);
    ASSERT_EQ(u.status, 200) << u.raw;
    EXPECT_EQ(u.body["store"], false);
    EXPECT_EQ(http.Get("/v1/responses/" + u.body["id"].get<std::string>())->status, 404);
    const auto deleted = http.Delete("/v1/responses/" + rid);
    ASSERT_TRUE(deleted);
    EXPECT_EQ(json::parse(deleted->body), (json{{"id", rid}, {"object", "response"}, {"deleted", true}}));
    EXPECT_EQ(http.Get("/v1/responses/" + rid)->status, 404);
    EXPECT_EQ(http.Delete("/v1/responses/" + rid)->status, 404);
    const Reply gone = post(port, "/v1/responses", cont);
    EXPECT_EQ(gone.status, 404) << gone.raw;
    EXPECT_EQ(gone.body["error"]["message"], "no stored response \"" + rid + "\" (made without \"store\", dropped, or deleted)");
    {
        // --max-stored-responses 2: the least recently made or read goes first.
        Server two(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024 --max-stored-responses 2", logs_.file("two.log"));
        ASSERT_GT(two.port(), 0) << two.read_all();
        httplib::Client c("127.0.0.1", two.port());
        std::vector<std::string> ids;
        for (int i = 0; i < 3; ++i) {
            if (i == 2) {
                EXPECT_EQ(c.Get("/v1/responses/" + ids[0])->status, 200);  // read: the most recent now
            }
            const Reply made = post(two.port(), "/v1/responses", {{"input", "And God said"}, {"max_output_tokens", 1}});
            ASSERT_EQ(made.status, 200) << made.raw;
            ids.push_back(made.body["id"]);
        }
        EXPECT_EQ(c.Get("/v1/responses/" + ids[0])->status, 200);
        EXPECT_EQ(c.Get("/v1/responses/" + ids[1])->status, 404);
        EXPECT_EQ(c.Get("/v1/responses/" + ids[2])->status, 200);
        EXPECT_EQ(two.stop(), 0);
    }

    // Cut by max_output_tokens: incomplete.
    const Reply cut = post(port, "/v1/responses", {{"input", "And God said"}, {"max_output_tokens", 3}, {"temperature", 0}, {"tool_choice", "none"}});
    ASSERT_EQ(cut.status, 200) << cut.raw;
    EXPECT_EQ(cut.body["status"], "incomplete");
    EXPECT_EQ(cut.body["incomplete_details"]["reason"], "max_output_tokens");
    EXPECT_EQ(cut.body["usage"]["output_tokens"], 3);
    // include message.output_text.logprobs with top_logprobs 2: the chat request's logprobs (every
    // generated token's, as vLLM's) on the output text; streamed, the text deltas' logprobs add up
    // to them, and the done event and the last event's response hold them whole.
    {
        const std::string said = "It is sunny in Paris today.";
        const json lreq = {{"input", "Weather in Paris?"}, {"max_output_tokens", 40}, {"guided_choice", {said}},
                           {"include", {"message.output_text.logprobs"}}, {"top_logprobs", 2}, {"store", false}};
        const Reply whole = post(port, "/v1/responses", lreq);
        ASSERT_EQ(whole.status, 200) << whole.raw;
        const Reply chat_lp = post(port, "/v1/chat/completions",
                                   {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"max_tokens", 40},
                                    {"guided_choice", {said}}, {"logprobs", true}, {"top_logprobs", 2}});
        ASSERT_EQ(chat_lp.status, 200) << chat_lp.raw;
        ASSERT_EQ(whole.body["output"].size(), 1u) << whole.raw;
        const json& part = whole.body["output"][0]["content"][0];
        EXPECT_EQ(part["text"], said);
        const json& lps = part["logprobs"];
        // The same tokens and bytes, and logprobs within float noise (the runs differ in what the
        // prefix cache held).
        auto near = [](const json& x, const json& y) {
            return x.is_number() && y.is_number() ? std::abs(x.get<double>() - y.get<double>()) <= 1e-4 : x == y;
        };
        auto same = [&](const json& a, const json& b) {
            if (!a.is_array() || !b.is_array() || a.size() != b.size()) return false;
            for (size_t i = 0; i < a.size(); ++i) {
                if (a[i]["token"] != b[i]["token"] || a[i]["bytes"] != b[i]["bytes"] || !near(a[i]["logprob"], b[i]["logprob"]) ||
                    a[i]["top_logprobs"].size() != b[i]["top_logprobs"].size())
                    return false;
                for (size_t k = 0; k < a[i]["top_logprobs"].size(); ++k)
                    if (!near(a[i]["top_logprobs"][k]["logprob"], b[i]["top_logprobs"][k]["logprob"])) return false;
            }
            return true;
        };
        EXPECT_TRUE(same(lps, chat_lp.body["choices"][0]["logprobs"]["content"])) << whole.raw << chat_lp.raw;
        // A constraint's masked ids (-inf) show as -9999, as vLLM clamps them: numbers, never null.
        size_t masked = 0;
        for (const json& e : lps)
            for (const json& t : e["top_logprobs"]) {
                ASSERT_TRUE(t["logprob"].is_number()) << e;
                EXPECT_GE(t["logprob"].get<double>(), -9999.0);
                masked += t["logprob"] == -9999.0;
            }
        EXPECT_GT(masked, 0u) << whole.raw;
        ASSERT_GT(lps.size(), 2u) << whole.raw;
        std::string text;
        for (const json& e : lps) {
            text += e["token"].get<std::string>();
            EXPECT_EQ(e["top_logprobs"].size(), 2u) << e;
        }
        EXPECT_EQ(text, said);
        json sl = lreq;
        sl["stream"] = true;
        const Reply st = post(port, "/v1/responses", sl);
        json from_deltas = json::array(), at_done, at_end;
        for (const json& e : responses_events(st.raw)) {
            if (e["type"] == "response.output_text.delta")
                for (const json& l : e["logprobs"]) from_deltas.push_back(l);
            if (e["type"] == "response.output_text.done") at_done = e["logprobs"];
            if (e["type"] == "response.completed") at_end = e["response"]["output"][0]["content"][0]["logprobs"];
        }
        EXPECT_TRUE(same(from_deltas, lps)) << st.raw;
        EXPECT_EQ(at_done, from_deltas) << st.raw;
        EXPECT_EQ(at_end, from_deltas) << st.raw;
        // Without include, none.
        json plain = lreq;
        plain.erase("include");
        plain.erase("top_logprobs");
        EXPECT_EQ(post(port, "/v1/responses", plain).body["output"][0]["content"][0]["logprobs"], json::array());
    }
    auto error_of = [&](const json& body, const std::string& message) {
        const Reply e = post(port, "/v1/responses", body);
        EXPECT_EQ(e.status, 400) << e.raw;
        EXPECT_EQ(e.body["error"]["message"], message) << e.raw;
    };
    error_of({{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "\"tools[0]\": only function tools are supported, not \"web_search\"");
    error_of({{"instructions", "x"}}, "\"input\" is required");
    error_of({{"input", "x"}, {"include", {"file_search_call.results"}}},
             "\"include\": \"file_search_call.results\" is not supported (message.output_text.logprobs is)");
    error_of({{"input", "x"}, {"top_logprobs", 2}}, "\"top_logprobs\" needs \"include\": [\"message.output_text.logprobs\"]");
    const Reply typed = post(port, "/v1/responses", {{"input", {{{"type", 7}}}}});  // a type that is no string
    EXPECT_EQ(typed.status, 400) << typed.raw;
    EXPECT_EQ(typed.body["error"]["message"].get<std::string>().rfind("a field of the request has the wrong type: ", 0), 0u) << typed.raw;
    error_of({{"input", {{{"type", "input_image"}}}}},
             "input[0]: items of type \"input_image\" are not supported (message, function_call, function_call_output, reasoning)");
    EXPECT_EQ(srv.stop(), 0);
}

// serve --batch-invariant: a request's logprobs are the same bits alone and among others sent at
// the same moment (continuous batching puts its prefill and decode tokens in steps with theirs,
// however they fall), streamed or not.
TEST_F(Serve, BatchInvariantRepliesDoNotDependOnTheOthers) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 2 --ctx 256 --batch 4 --prefill-chunk 8 "
                      "--weights int8 --kv int8 --batch-invariant",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const json req = {{"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 0}, {"logprobs", 2}, {"ignore_eos", true}};
    const Reply alone = post(port, "/v1/completions", req);
    ASSERT_EQ(alone.status, 200) << alone.raw;
    const json& want = alone.body["choices"][0]["logprobs"];
    for (int round = 0; round < 3; ++round) {
        std::vector<Reply> others(3);
        std::vector<std::thread> threads;
        const char* prompts[] = {"In the beginning God created the heaven and the earth.", "Blessed are the",
                                 "And the LORD spake unto Moses, saying"};
        for (int i = 0; i < 3; ++i)
            threads.emplace_back([&, i] {
                others[size_t(i)] = post(port, "/v1/completions", {{"prompt", prompts[i]}, {"max_tokens", 30 + 7 * i}, {"temperature", 0},
                                                                   {"ignore_eos", true}});
            });
        std::this_thread::sleep_for(std::chrono::milliseconds(5 * round));
        const Reply shared = post(port, "/v1/completions", req);
        for (std::thread& t : threads) t.join();
        ASSERT_EQ(shared.status, 200) << shared.raw;
        EXPECT_EQ(shared.body["choices"][0]["logprobs"], want) << "round " << round;
        for (const Reply& o : others) EXPECT_EQ(o.status, 200) << o.raw;
    }
    EXPECT_EQ(srv.stop(), 0);
}

// A request's own id (vLLM's): the X-Request-Id header's, else the body's request_id, after the
// route's prefix in the response's id (every event's too when streamed), and back in the
// response's X-Request-Id header; without one the server numbers it. A stored response's id
// cannot be taken again (ARunningResponsesIdIsTaken: nor a running one's); malformed ids get a
// 400 naming the header or field.
TEST_F(Serve, RequestIdsAreTheClients) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    httplib::Client c("127.0.0.1", srv.port());
    auto send = [&](const std::string& path, const json& body, const std::string& header) {
        httplib::Headers h;
        if (!header.empty()) h.emplace("X-Request-Id", header);
        httplib::Result r = c.Post(path.c_str(), h, body.dump(), "application/json");
        EXPECT_TRUE(r) << path;
        return r;
    };
    const json chat = {{"messages", {{{"role", "user"}, {"content", "And God said"}}}}, {"max_tokens", 3}};
    const json completion = {{"prompt", "And God said"}, {"max_tokens", 3}};
    struct Case {
        std::string path;
        json body;
        std::string header, id, echoed;
    };
    json with_field = completion;
    with_field["request_id"] = "from-the-body";
    json chat_field = chat;
    chat_field["request_id"] = "7f3c2a90-1b2c-4d5e-8f90-123456789abc";
    const std::vector<Case> cases = {
        {"/v1/chat/completions", chat, "trace-42", "chatcmpl-trace-42", "trace-42"},
        {"/v1/chat/completions", chat_field, "", "chatcmpl-7f3c2a90-1b2c-4d5e-8f90-123456789abc", "7f3c2a90-1b2c-4d5e-8f90-123456789abc"},
        {"/v1/completions", with_field, "", "cmpl-from-the-body", "from-the-body"},
        {"/v1/completions", with_field, "header-wins", "cmpl-header-wins", "header-wins"},
        {"/v1/responses", {{"input", "And God said"}, {"max_output_tokens", 3}, {"request_id", "r1"}}, "", "resp_r1", "r1"},
    };
    for (const Case& k : cases)
        for (const bool stream : {false, true}) {
            json body = k.body;
            if (stream) body["stream"] = true;
            if (stream && k.path == "/v1/responses") continue;  // (stored already: taken)
            const auto r = send(k.path, body, k.header);
            ASSERT_TRUE(r);
            ASSERT_EQ(r->status, 200) << r->body;
            EXPECT_EQ(r->get_header_value("X-Request-Id"), k.echoed) << k.path;
            if (!stream) {
                EXPECT_EQ(json::parse(r->body)["id"], k.id) << r->body;
                continue;
            }
            size_t events = 0;
            std::istringstream lines(r->body);
            for (std::string line; std::getline(lines, line);) {
                if (line.rfind("data: {", 0) != 0) continue;
                EXPECT_EQ(json::parse(line.substr(6))["id"], k.id) << line;
                ++events;
            }
            EXPECT_GT(events, 1u) << r->body;
        }
    // The stored response is found by its id, and the id cannot be taken again.
    EXPECT_EQ(c.Get("/v1/responses/resp_r1")->status, 200);
    const auto again = send("/v1/responses", {{"input", "x"}, {"max_output_tokens", 1}}, "r1");
    EXPECT_EQ(again->status, 400);
    EXPECT_EQ(json::parse(again->body)["error"]["message"], "a stored response already has the id \"resp_r1\"");
    // Without one: numbered, and the header says which.
    const auto plain = send("/v1/completions", completion, "");
    ASSERT_EQ(plain->status, 200);
    const std::string n = plain->get_header_value("X-Request-Id");
    EXPECT_FALSE(n.empty());
    EXPECT_EQ(json::parse(plain->body)["id"], "cmpl-" + n);
    const std::vector<std::pair<json, std::string>> bad = {
        {{{"request_id", 5}}, "\"request_id\" must be a string"},
        {{{"request_id", "two words"}}, "\"request_id\" must be 1 to 128 visible ASCII characters (no spaces)"},
        {{{"request_id", std::string(129, 'x')}}, "\"request_id\" must be 1 to 128 visible ASCII characters (no spaces)"},
        {{{"request_id", ""}}, "\"request_id\" must be 1 to 128 visible ASCII characters (no spaces)"},
    };
    for (const auto& [field, message] : bad) {
        json body = completion;
        body.update(field);
        const auto r = send("/v1/completions", body, "");
        EXPECT_EQ(r->status, 400) << body.dump();
        EXPECT_EQ(json::parse(r->body)["error"]["message"], message) << r->body;
    }
    const auto long_header = send("/v1/chat/completions", chat, std::string(200, 'h'));
    EXPECT_EQ(long_header->status, 400);
    EXPECT_EQ(json::parse(long_header->body)["error"]["message"],
              "the X-Request-Id header must be 1 to 128 visible ASCII characters (no spaces)");
    EXPECT_EQ(srv.stop(), 0);
}

// A running response's id is taken too, stored or not: in the only slot a long completion runs,
// the response "live" waits behind it (the metrics say so), and a second "live" is refused. The
// store alone knew only responses that had ended: this one, not stored, it would never know.
TEST_F(Serve, ARunningResponsesIdIsTaken) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256 --batch 1", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    httplib::Client http("127.0.0.1", port);
    auto until = [&](const std::string& name) {  // the gauge reaches 1 (within 60 s)
        for (int i = 0; i < 6000; ++i) {
            const auto m = http.Get("/metrics");
            if (m && metric_value(m->body, name) == 1) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    };
    Reply blocker, first;
    std::thread b([&] {
        blocker = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 200}, {"ignore_eos", true}});
    });
    EXPECT_TRUE(until("shardlm_requests_running"));
    std::thread f([&] {
        first = post(port, "/v1/responses", {{"input", "x"}, {"max_output_tokens", 1}, {"store", false}, {"request_id", "live"}});
    });
    EXPECT_TRUE(until("shardlm_requests_waiting"));
    const Reply twin = post(port, "/v1/responses", {{"input", "x"}, {"max_output_tokens", 1}, {"request_id", "live"}});
    b.join();
    f.join();
    EXPECT_EQ(blocker.status, 200) << blocker.raw;
    EXPECT_EQ(first.status, 200) << first.raw;
    EXPECT_EQ(twin.status, 400) << twin.raw;
    EXPECT_EQ(twin.body["error"]["message"], "a response with the id \"resp_live\" is running") << twin.raw;
    // An answered response that was not stored leaves its id free, streamed too: the client may
    // take it again at once (the hold goes before the last byte; fails where a hold outlives it).
    for (int i = 0; i < 10; ++i)
        for (const bool stream : {false, true}) {
            json body = {{"input", "x"}, {"max_output_tokens", 2}, {"store", false}, {"request_id", "again"}};
            if (stream) body["stream"] = true;
            const Reply r = post(port, "/v1/responses", body);
            EXPECT_EQ(r.status, 200) << "try " << i << (stream ? " streamed: " : ": ") << r.raw;
        }
    EXPECT_EQ(srv.stop(), 0);
}

// vLLM's cache_salt (the Batcher's test follows every path of the cache): a prompt served again
// takes its prefix from the cache only under the salt it ran with (no salt is one too), for
// completions, chat and the Responses API; the text is the same either way; a salt that is not a
// non-empty string gets a 400.
TEST_F(Serve, CacheSaltKeepsTenantsApart) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256 --batch 2", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const std::string text = "In the beginning God created the heaven and the earth. And the earth was without form";
    auto cached = [&](const std::string& path, json body, const json& salt) {
        if (!salt.is_null()) body["cache_salt"] = salt;
        const Reply r = post(port, path, body);
        EXPECT_EQ(r.status, 200) << r.raw;
        const json& u = r.body["usage"];
        const json& details = u.contains("prompt_tokens_details") ? u["prompt_tokens_details"] : u["input_tokens_details"];
        return std::make_pair(details["cached_tokens"].get<int64_t>(), r.body);
    };
    const json completion = {{"prompt", text}, {"max_tokens", 4}, {"temperature", 0}};
    const auto first = cached("/v1/completions", completion, "tenant-a");
    EXPECT_EQ(first.first, 0);
    const auto again = cached("/v1/completions", completion, "tenant-a");
    EXPECT_GT(again.first, 0);
    EXPECT_EQ(again.second["choices"][0]["text"], first.second["choices"][0]["text"]);
    const auto other = cached("/v1/completions", completion, "tenant-b");
    EXPECT_EQ(other.first, 0);
    EXPECT_EQ(other.second["choices"][0]["text"], first.second["choices"][0]["text"]);
    EXPECT_EQ(cached("/v1/completions", completion, nullptr).first, 0);  // no salt: its own
    EXPECT_GT(cached("/v1/completions", completion, nullptr).first, 0);
    EXPECT_GT(cached("/v1/completions", completion, "tenant-b").first, 0);
    const json chat = {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 2}};
    EXPECT_EQ(cached("/v1/chat/completions", chat, "tenant-c").first, 0);
    EXPECT_GT(cached("/v1/chat/completions", chat, "tenant-c").first, 0);
    EXPECT_EQ(cached("/v1/chat/completions", chat, "tenant-d").first, 0);
    const json resp = {{"input", text}, {"max_output_tokens", 2}, {"store", false}};
    EXPECT_GT(cached("/v1/responses", resp, "tenant-c").first, 0);  // chat's prompt, tenant c's prefix
    EXPECT_EQ(cached("/v1/responses", resp, "tenant-e").first, 0);
    for (const json& bad : {json(""), json(5)}) {
        json body = completion;
        body["cache_salt"] = bad;
        const Reply r = post(port, "/v1/completions", body);
        EXPECT_EQ(r.status, 400) << r.raw;
        EXPECT_EQ(r.body["error"]["message"], "\"cache_salt\" must be a non-empty string") << r.raw;
    }
    EXPECT_EQ(srv.stop(), 0);
}

// --chat-template (vLLM's serve flag; chat and generate --chat take it too): a file, or the
// template's text, in place of the model's: the prompt is the one a model shipping that template
// gets; a value that is neither, or a template no renderer knows, stops the server naming it.
TEST_F(Serve, ChatTemplateFlagReplacesTheModels) {
    const std::string qwen = SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/qwen25.jinja";
    const json chatml = json::parse(read_file(model_.file("tokenizer_config.json")))["chat_template"];
    const json ask = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
    int servers = 0;  // a log each: a reused one could show the last server's port to the next
    auto count = [&](const std::string& flags) {
        Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024 " + flags,
                   logs_.file("serve" + std::to_string(servers++) + ".log"));
        EXPECT_GT(srv.port(), 0) << flags << ": " << srv.read_all();
        const Reply r = post(srv.port(), "/tokenize", ask);
        EXPECT_EQ(r.status, 200) << flags << ": " << r.raw << srv.read_all();
        EXPECT_EQ(srv.stop(), 0);
        return r.body.value("tokens", json(nullptr));
    };
    const json own = count("");
    const json by_file = count("--chat-template " + qwen);
    EXPECT_NE(by_file, own);
    std::string quoted = "'";  // the text itself, in single quotes for the shell
    for (const char c : chatml.get<std::string>()) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    EXPECT_EQ(count("--chat-template " + quoted + "'"), own);
    use_chat_template(qwen);
    EXPECT_EQ(count(""), by_file);  // the model shipping it
    // generate --chat takes it too.
    const CommandResult g = run_command(kCli + " generate --model " + model_.path() +
                                        " --chat --prompt 'Weather in Paris?' --max-new-tokens 1 --json --chat-template " + qwen);
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const json gen = json::parse(g.out);
    EXPECT_EQ(gen["results"][0]["prompt_tokens"], by_file.size()) << g.out;
    for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
             {"--chat-template /no/such.jinja", "--chat-template /no/such.jinja: no such file, and not a template's text"},
             {"--chat-template " + model_.file("config.json"), model_.file("config.json")}}) {
        const CommandResult r = run_command(kCli + " serve --model " + model_.path() + " --threads 1 --port 0 " + flags);
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    }
    const CommandResult plain = run_command(kCli + " generate --model " + model_.path() + " --prompt x --chat-template " + qwen);
    EXPECT_NE(plain.exit_code, 0);
    EXPECT_NE(plain.err.find("--chat-template needs --chat"), std::string::npos) << plain.err;
}

// vLLM's --generation-config auto (the default): the model's generation_config.json sets the
// sampling defaults of requests that leave them out (top_k 1 here: greedy), and a request's own
// value wins; vllm: the API's defaults (temperature 1). Bad values stop the server, naming them.
TEST_F(Serve, GenerationConfigSetsTheSamplingDefaults) {
    write_file(model_.file("generation_config.json"), R"({"temperature": 0.7, "top_k": 1, "top_p": 0.9})");
    const std::string want = generate_text(model_.path(), "--prompt 'And God said' --max-new-tokens 12");
    const json ask = {{"prompt", "And God said"}, {"max_tokens", 12}, {"seed", 3}};
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 128", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    Reply r = post(srv.port(), "/v1/completions", ask);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], want);
    json own = ask;
    own["top_k"] = 0;  // the request's own value: sampled at temperature 0.7 over the whole vocabulary
    std::set<std::string> texts;
    for (int seed = 1; seed <= 3; ++seed) {
        own["seed"] = seed;
        r = post(srv.port(), "/v1/completions", own);
        ASSERT_EQ(r.status, 200) << r.raw;
        texts.insert(r.body["choices"][0]["text"].get<std::string>());
    }
    EXPECT_GT(texts.size(), 1u);  // sampled, not greedy
    EXPECT_EQ(srv.stop(), 0);
    EXPECT_NE(srv.read_all().find("sampling defaults from generation_config.json: temperature 0.7, top_p 0.9, top_k 1"),
              std::string::npos)
        << srv.read_all();
    Server plain(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 128 --generation-config vllm",
                 logs_.file("plain.log"));
    ASSERT_GT(plain.port(), 0) << plain.read_all();
    texts.clear();
    for (int seed = 1; seed <= 3; ++seed) {
        json a = ask;
        a["seed"] = seed;
        r = post(plain.port(), "/v1/completions", a);
        ASSERT_EQ(r.status, 200) << r.raw;
        texts.insert(r.body["choices"][0]["text"].get<std::string>());
    }
    EXPECT_GT(texts.size(), 1u);
    EXPECT_EQ(plain.stop(), 0);
    write_file(model_.file("generation_config.json"), R"({"top_p": 0})");
    CommandResult bad = run_command(kCli + " serve --model " + model_.path() + " --threads 1");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("generation_config.json: top_p 0 is outside (0, 1]"), std::string::npos) << bad.err;
    bad = run_command(kCli + " serve --model " + model_.path() + " --generation-config " + logs_.path());
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("--generation-config " + logs_.path() + ": " + logs_.path() + "/generation_config.json does not exist"),
              std::string::npos)
        << bad.err;
}

// Completions' "suffix" on a tokenizer with Qwen2.5-Coder's FIM tokens: generate --suffix's text,
// plain and streamed; a FIM separator ends the middle without being text; requests that cannot
// be a FIM prompt are refused.
TEST_F(Serve, SuffixFillsInTheMiddle) {
    TempDir code;
    shardlm::ModelConfig c = shardlm::tiny_config(shardlm::Arch::Qwen2);
    c.vocab = 3076;
    shardlm::write_synthetic_checkpoint(code.path(), c, {shardlm::DType::F32, 1, 11});
    json tok = json::parse(read_file(kModel + "/tokenizer.json"));
    const std::vector<std::pair<int, std::string>> fim = {
        {3072, "<|fim_prefix|>"}, {3073, "<|fim_middle|>"}, {3074, "<|fim_suffix|>"}, {3075, "<|fim_pad|>"}};
    for (const auto& [id, content] : fim)
        tok["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false}, {"lstrip", false},
                                       {"rstrip", false}, {"normalized", false}, {"special", true}});
    write_file(code.file("tokenizer.json"), tok.dump());
    write_file(code.file("tokenizer_config.json"), read_file(kModel + "/tokenizer_config.json"));
    const std::string prefix = "And God said, Let there be", suffix = ": and there was light.";
    const CommandResult g = run_command(kCli + " generate --model " + code.path() +
                                        " --json --temperature 0 --max-new-tokens 8 --prompt '" + prefix + "' --suffix '" + suffix + "'");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const json want = json::parse(g.out)["results"][0];
    Server srv(kCli + " serve --model " + code.path() + " --threads 1 --ctx 128 --batch 2", logs_.file("fim.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json body = {{"prompt", prefix}, {"suffix", suffix}, {"max_tokens", 8}, {"temperature", 0}};
    const Reply r = post(srv.port(), "/v1/completions", body);
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["text"], want["text"]);
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], want["prompt_tokens"]);
    EXPECT_EQ(r.body["usage"]["completion_tokens"], want["tokens"].size());
    json streamed_body = body;
    streamed_body["stream"] = true;
    const Reply st = post(srv.port(), "/v1/completions", streamed_body);
    std::string text;
    std::istringstream events(st.raw);
    for (std::string line; std::getline(events, line);)
        if (line.rfind("data: {", 0) == 0) text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, want["text"]);
    // <|fim_pad|> forced first: an empty middle, "stop", one completion token; streamed too.
    json pad = body;
    pad["logit_bias"] = {{"3075", 100}};
    const Reply p = post(srv.port(), "/v1/completions", pad);
    ASSERT_EQ(p.status, 200) << p.raw;
    EXPECT_EQ(p.body["choices"][0]["text"], "");
    EXPECT_EQ(p.body["choices"][0]["finish_reason"], "stop");
    EXPECT_EQ(p.body["usage"]["completion_tokens"], 1);
    pad["stream"] = true;
    const Reply ps = post(srv.port(), "/v1/completions", pad);
    EXPECT_EQ(ps.raw.find("fim_pad"), std::string::npos) << ps.raw;
    auto error_of = [&](const json& b, const std::string& part) {
        const Reply e = post(srv.port(), "/v1/completions", b);
        EXPECT_EQ(e.status, 400) << e.raw;
        EXPECT_NE(e.body["error"]["message"].get<std::string>().find(part), std::string::npos) << e.raw;
    };
    error_of({{"prompt", {5, 6}}, {"suffix", "x"}}, "\"suffix\" needs the prompt as text, not token ids");
    error_of({{"prompt", "x"}, {"suffix", 5}}, "\"suffix\" must be a string");
    error_of({{"prompt", "x"}, {"suffix", "y"}, {"echo", true}}, "\"suffix\" with \"echo\" is not supported");
    error_of({{"prompt", "x"}, {"suffix", "y"}, {"stop_token_ids", std::vector<int>(16, 5)}},
             "\"stop_token_ids\" and the FIM separators of \"suffix\" (2) are more than 16");
    const Reply chat = post(srv.port(), "/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"suffix", "y"}});
    EXPECT_EQ(chat.status, 400) << chat.raw;
    EXPECT_EQ(srv.stop(), 0);
}

TEST_F(Serve, CompletionsAreGeneratesText) {
    // (Speculative decoding on: the greedy requests' texts are still generate's, which runs without.)
    Server srv(kCli + " serve --model " + model_.path() + " --batch 2 --ctx 256 --threads 1 --speculate 3",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    httplib::Client c("127.0.0.1", port);
    const auto models = c.Get("/v1/models");
    ASSERT_TRUE(models);
    EXPECT_EQ(json::parse(models->body)["data"][0]["id"], model_.path().substr(model_.path().find_last_of('/') + 1));
    const auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);

    // One request: generate's text, usage counted.
    const Reply one = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}});
    ASSERT_EQ(one.status, 200) << one.raw;
    const std::string want = generate_text(model_.path(), "--prompt 'And God said' --max-new-tokens 24");
    EXPECT_EQ(one.body["object"], "text_completion");
    EXPECT_EQ(one.body["choices"][0]["text"], want);
    EXPECT_EQ(one.body["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(one.body["usage"]["completion_tokens"], 24);
    EXPECT_EQ(one.body["usage"]["total_tokens"].get<int>(), 24 + one.body["usage"]["prompt_tokens"].get<int>());

    // Six at once through two slots: each is what it is alone.
    const std::vector<std::string> prompts = {"In the beginning", "And the LORD", "Blessed are", "Now it came to pass",
                                              "And he said", "Behold"};
    std::vector<Reply> replies(prompts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < prompts.size(); ++i)
        clients.emplace_back([&, i] {
            replies[i] = post(port, "/v1/completions",
                              {{"prompt", prompts[i]}, {"max_tokens", 6 + int(i) * 3}, {"temperature", 0}});
        });
    for (auto& t : clients) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) {
        ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
        EXPECT_EQ(replies[i].body["choices"][0]["text"],
                  generate_text(model_.path(), "--prompt '" + prompts[i] + "' --max-new-tokens " + std::to_string(6 + i * 3)))
            << prompts[i];
    }

    // A stop string cuts the text, as generate --stop does.
    const std::string stop = want.substr(want.size() / 2, 4);
    const Reply cut = post(port, "/v1/completions",
                           {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", {"zzz", stop}}});
    ASSERT_EQ(cut.status, 200) << cut.raw;
    EXPECT_EQ(cut.body["choices"][0]["text"], want.substr(0, want.find(stop)));
    EXPECT_EQ(cut.body["choices"][0]["finish_reason"], "stop");
    // vLLM's include_stop_str_in_output: the text ends after it, whole and streamed.
    for (const bool stream : {false, true}) {
        const Reply kept = post(port, "/v1/completions",
                                {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"stop", stop},
                                 {"include_stop_str_in_output", true}, {"stream", stream}});
        ASSERT_EQ(kept.status, 200) << kept.raw;
        const std::string text = stream ? streamed_text(kept.raw) : kept.body["choices"][0]["text"].get<std::string>();
        EXPECT_EQ(text, want.substr(0, want.find(stop) + stop.size())) << kept.raw;
    }

    // Streamed: server-sent events whose deltas make the same text, the last with the reason.
    const Reply streamed = post(port, "/v1/completions",
                                {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"stream", true}});
    ASSERT_EQ(streamed.status, 200);
    std::string text, reason;
    std::istringstream events(streamed.raw);
    std::vector<std::string> data;
    for (std::string line; std::getline(events, line);)
        if (line.rfind("data: ", 0) == 0) data.push_back(line.substr(6));
    ASSERT_GE(data.size(), 2u) << streamed.raw;
    EXPECT_EQ(data.back(), "[DONE]");
    for (size_t i = 0; i + 1 < data.size(); ++i) {
        const json chunk = json::parse(data[i]);
        text += chunk["choices"][0]["text"].get<std::string>();
        if (!chunk["choices"][0]["finish_reason"].is_null()) reason = chunk["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, want);
    EXPECT_EQ(reason, "length");
    // stream_options.include_usage: "usage": null in every chunk, then one with no choices and
    // the usage the whole response gives, then [DONE]; with continuous_usage_stats, each chunk's.
    {
        const json body = {{"prompt", "And God said"}, {"max_tokens", 24},      {"temperature", 0},
                           {"stream", true},           {"stream_options", {{"include_usage", true}}}};
        const Reply r = post(port, "/v1/completions", body);
        ASSERT_EQ(r.status, 200);
        std::istringstream ev(r.raw);
        std::vector<json> chunks;
        std::string done;
        for (std::string line; std::getline(ev, line);) {
            if (line.rfind("data: {", 0) == 0) chunks.push_back(json::parse(line.substr(6)));
            else if (line.rfind("data: ", 0) == 0) done = line.substr(6);
        }
        EXPECT_EQ(done, "[DONE]");
        ASSERT_GE(chunks.size(), 2u);
        std::string streamed_text;
        for (size_t i = 0; i + 1 < chunks.size(); ++i) {
            EXPECT_TRUE(chunks[i].contains("usage") && chunks[i]["usage"].is_null()) << chunks[i];
            streamed_text += chunks[i]["choices"][0]["text"].get<std::string>();
        }
        EXPECT_EQ(streamed_text, want);
        EXPECT_TRUE(chunks.back()["choices"].empty());
        json whole = body;
        whole.erase("stream");
        whole.erase("stream_options");
        const Reply w = post(port, "/v1/completions", whole);
        ASSERT_EQ(w.status, 200) << w.raw;
        EXPECT_EQ(chunks.back()["usage"], w.body["usage"]);
        EXPECT_EQ(chunks.back()["usage"]["completion_tokens"], 24);
        // Without it, no usage in the chunks.
        EXPECT_FALSE(json::parse(data[0]).contains("usage"));
        // vLLM's continuous_usage_stats: every chunk has its choice's usage so far, growing to the
        // whole response's; without include_usage it does nothing (as vLLM's).
        json cont = body;
        cont["stream_options"]["continuous_usage_stats"] = true;
        std::istringstream cev(post(port, "/v1/completions", cont).raw);
        std::vector<json> cchunks;
        for (std::string line; std::getline(cev, line);)
            if (line.rfind("data: {", 0) == 0) cchunks.push_back(json::parse(line.substr(6)));
        ASSERT_GE(cchunks.size(), 2u);  // (a loaded machine may merge the text into one chunk)
        int64_t last = 0;
        for (size_t i = 0; i + 1 < cchunks.size(); ++i) {
            const json& u = cchunks[i]["usage"];
            ASSERT_TRUE(u.is_object()) << cchunks[i];
            EXPECT_EQ(u["prompt_tokens"], w.body["usage"]["prompt_tokens"]);
            EXPECT_GE(u["completion_tokens"].get<int64_t>(), std::max<int64_t>(last, 1)) << cchunks[i];
            last = u["completion_tokens"];
            EXPECT_EQ(u["total_tokens"], u["prompt_tokens"].get<int64_t>() + last);
        }
        EXPECT_EQ(last, 24);
        EXPECT_EQ(cchunks.back()["usage"], w.body["usage"]);
        cont["stream_options"].erase("include_usage");
        EXPECT_EQ(post(port, "/v1/completions", cont).raw.find("\"usage\""), std::string::npos);
    }

    // Token ids as the prompt; sampled requests repeat with their seed.
    const Reply ids = post(port, "/v1/completions", {{"prompt", {5, 6, 7}}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(ids.status, 200) << ids.raw;
    EXPECT_EQ(ids.body["usage"]["prompt_tokens"], 3);
    // logprobs: generate --logprobs's numbers for the same tokens; the tokens' texts make the text;
    // streamed, the events' entries make the same list.
    const json lp_req = {{"prompt", "And God said"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
    const Reply lp = post(port, "/v1/completions", lp_req);
    ASSERT_EQ(lp.status, 200) << lp.raw;
    const json& L = lp.body["choices"][0]["logprobs"];
    const CommandResult g = run_command(kCli + " generate --model " + model_.path() +
                                        " --json --temperature 0 --prompt 'And God said' --max-new-tokens 6 --logprobs 2");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const json want_lp = json::parse(g.out)["results"][0]["logprobs"];
    ASSERT_EQ(L["tokens"].size(), 6u) << lp.raw;
    std::string joined;
    for (size_t i = 0; i < 6; ++i) {
        EXPECT_EQ(L["text_offset"][i].get<size_t>(), joined.size());
        joined += L["tokens"][i].get<std::string>();
        EXPECT_NEAR(L["token_logprobs"][i].get<double>(), want_lp[i]["logprob"].get<double>(), 1e-4) << i;
        EXPECT_EQ(L["top_logprobs"][i].size(), 2u) << lp.raw;  // greedy: the sampled token is the most probable
        EXPECT_EQ(L["top_logprobs"][i][L["tokens"][i].get<std::string>()], L["token_logprobs"][i]);
    }
    EXPECT_EQ(joined, lp.body["choices"][0]["text"]);
    {
        json st = lp_req;
        st["stream"] = true;
        const Reply r = post(port, "/v1/completions", st);
        std::istringstream ev(r.raw);
        json tokens = json::array(), offsets = json::array();
        for (std::string line; std::getline(ev, line);) {
            if (line.rfind("data: {", 0) != 0) continue;
            const json l = json::parse(line.substr(6))["choices"][0]["logprobs"];
            if (l.is_null()) continue;
            for (size_t i = 0; i < l["tokens"].size(); ++i) {
                tokens.push_back(l["tokens"][i]);
                offsets.push_back(l["text_offset"][i]);
            }
        }
        EXPECT_EQ(tokens, L["tokens"]) << r.raw;
        EXPECT_EQ(offsets, L["text_offset"]) << r.raw;
    }
    // echo with max_tokens 0 scores a text (lm-eval's loglikelihood): a prompt followed by the
    // model's own greedy continuation gets, for those tokens, the logprobs generating them gave.
    {
        const Reply a = post(port, "/v1/completions", {{"prompt", {5, 6, 7}}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 0}});
        ASSERT_EQ(a.status, 200) << a.raw;
        const CommandResult ids = run_command(kCli + " generate --model " + model_.path() +
                                              " --json --temperature 0 --prompt-ids 5,6,7 --max-new-tokens 5");
        ASSERT_EQ(ids.exit_code, 0) << ids.err;
        json whole = {5, 6, 7};
        const json gen = json::parse(ids.out);
        for (const json& t : gen["results"][0]["tokens"]) whole.push_back(t);
        const Reply b = post(port, "/v1/completions",
                             {{"prompt", whole}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}, {"temperature", 0}});
        ASSERT_EQ(b.status, 200) << b.raw;
        const json& la = a.body["choices"][0]["logprobs"];
        const json& lb = b.body["choices"][0]["logprobs"];
        ASSERT_EQ(lb["tokens"].size(), 8u) << b.raw;
        EXPECT_TRUE(lb["token_logprobs"][0].is_null());
        EXPECT_TRUE(lb["top_logprobs"][0].is_null());
        std::string joined;
        for (size_t i = 0; i < 8; ++i) joined += lb["tokens"][i].get<std::string>();
        EXPECT_EQ(b.body["choices"][0]["text"], joined);  // the prompt's text, nothing generated
        EXPECT_EQ(b.body["usage"]["completion_tokens"], 0);
        for (size_t i = 0; i < 5; ++i) {
            EXPECT_EQ(lb["tokens"][3 + i], la["tokens"][i]);
            EXPECT_NEAR(lb["token_logprobs"][3 + i].get<double>(), la["token_logprobs"][i].get<double>(), 1e-4) << i;
        }
        // echo without logprobs: the prompt's text, then the completion's.
        const Reply c = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"echo", true}});
        ASSERT_EQ(c.status, 200) << c.raw;
        EXPECT_EQ(c.body["choices"][0]["text"], "And God said" + want);
        EXPECT_TRUE(c.body["choices"][0]["logprobs"].is_null());
    }
    // echo streamed (as vLLM's): each choice's prompt text (and its logprobs) first, then the
    // generated deltas; the events of a choice add up to the whole response's choice, the
    // logprobs' entries and text offsets included (the generated ones go on after the prompt's).
    {
        auto stream_vs_whole = [&](json body) {
            const Reply whole = post(port, "/v1/completions", body);
            ASSERT_EQ(whole.status, 200) << whole.raw;
            body["stream"] = true;
            const Reply st = post(port, "/v1/completions", body);
            ASSERT_EQ(st.status, 200) << st.raw;
            const json& choices = whole.body["choices"];
            std::vector<json> merged(choices.size(), json{{"text", ""}, {"logprobs", nullptr}});
            std::vector<int> events(choices.size(), 0);
            std::istringstream lines(st.raw);
            for (std::string line; std::getline(lines, line);) {
                if (line.rfind("data: {", 0) != 0) continue;
                const json c = json::parse(line.substr(6))["choices"][0];
                const size_t i = c["index"];
                ASSERT_LT(i, merged.size()) << line;
                const std::string prompt = body["prompt"].is_array() && body["prompt"][0].is_string() ? body["prompt"][i / size_t(body.value("n", 1))] : body["prompt"];
                if (events[i]++ == 0) {
                    EXPECT_EQ(c["text"], prompt) << line;  // the prompt's own event first
                }
                merged[i]["text"] = merged[i]["text"].get<std::string>() + c["text"].get<std::string>();
                if (c["logprobs"].is_null()) continue;
                json& m = merged[i]["logprobs"];
                if (m.is_null()) m = json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
                for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
                    for (const json& v : c["logprobs"][key]) m[key].push_back(v);
            }
            for (size_t i = 0; i < choices.size(); ++i) {
                EXPECT_GE(events[i], 2) << st.raw;  // the prompt's, and at least the finish
                EXPECT_EQ(merged[i]["text"], choices[i]["text"]) << st.raw;
                EXPECT_EQ(merged[i]["logprobs"], choices[i]["logprobs"]) << st.raw;
            }
        };
        stream_vs_whole({{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}, {"echo", true}});
        stream_vs_whole({{"prompt", {"And God said", "In the beginning"}}, {"max_tokens", 5}, {"temperature", 0.8}, {"seed", 3},
                         {"n", 2}, {"echo", true}, {"logprobs", 2}});
        stream_vs_whole({{"prompt", "And God said"}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
    }
    // n choices: choice j is prompt's j-th sampler stream, as generate samples the j-th of a
    // batch of copies; a list of prompts gets a choice per prompt; streamed, each choice's deltas
    // (by index) make its text.
    {
        const json nreq = {{"prompt", {5, 6, 7}}, {"max_tokens", 6}, {"temperature", 0.9}, {"top_k", 40}, {"seed", 4}, {"n", 3}};
        const Reply r = post(port, "/v1/completions", nreq);
        ASSERT_EQ(r.status, 200) << r.raw;
        ASSERT_EQ(r.body["choices"].size(), 3u);
        const CommandResult g = run_command(kCli + " generate --model " + model_.path() +
                                            " --json --prompt-ids '5,6,7;5,6,7;5,6,7' --max-new-tokens 6 --temperature 0.9 "
                                            "--top-k 40 --top-p 1 --seed 4");
        ASSERT_EQ(g.exit_code, 0) << g.err;
        const json gen = json::parse(g.out);
        for (size_t j = 0; j < 3; ++j) {
            EXPECT_EQ(r.body["choices"][j]["index"], j);
            EXPECT_EQ(r.body["choices"][j]["text"], gen["results"][j]["text"]) << j;
        }
        EXPECT_NE(r.body["choices"][0]["text"], r.body["choices"][1]["text"]);  // 4^-6 odds of a false alarm at best
        EXPECT_EQ(r.body["usage"]["prompt_tokens"], 3);
        EXPECT_EQ(r.body["usage"]["completion_tokens"], 18);
        const Reply list = post(port, "/v1/completions", {{"prompt", {"And God said", "Behold"}}, {"max_tokens", 9}, {"temperature", 0}});
        ASSERT_EQ(list.status, 200) << list.raw;
        EXPECT_EQ(list.body["choices"][0]["text"], generate_text(model_.path(), "--prompt 'And God said' --max-new-tokens 9"));
        EXPECT_EQ(list.body["choices"][1]["text"], generate_text(model_.path(), "--prompt 'Behold' --max-new-tokens 9"));
        json st = nreq;
        st["stream"] = true;
        const Reply sr = post(port, "/v1/completions", st);
        std::istringstream ev(sr.raw);
        std::vector<std::string> texts(3);
        for (std::string line; std::getline(ev, line);) {
            if (line.rfind("data: {", 0) != 0) continue;
            const json c = json::parse(line.substr(6))["choices"][0];
            texts.at(c["index"].get<size_t>()) += c["text"].get<std::string>();
        }
        for (size_t j = 0; j < 3; ++j) EXPECT_EQ(texts[j], r.body["choices"][j]["text"]) << j;
    }
    const json sampled = {{"prompt", "And God said"}, {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 7}, {"top_k", 40}};
    EXPECT_EQ(post(port, "/v1/completions", sampled).body["choices"], post(port, "/v1/completions", sampled).body["choices"]);

    // logit_bias: what generate --logit-bias gives; the banned token never comes.
    {
        const std::string g = " generate --model " + model_.path() + " --json --temperature 0 --prompt 'And God said' --max-new-tokens 12";
        const CommandResult plain = run_command(kCli + g);
        ASSERT_EQ(plain.exit_code, 0) << plain.err;
        const int first = json::parse(plain.out)["results"][0]["tokens"][0];
        const CommandResult biased = run_command(kCli + g + " --logit-bias " + std::to_string(first) + "=-100 --logit-bias 7=2.5");
        ASSERT_EQ(biased.exit_code, 0) << biased.err;
        const json want = json::parse(biased.out)["results"][0];
        for (const json& t : want["tokens"]) EXPECT_NE(t.get<int>(), first);
        const Reply r = post(port, "/v1/completions",
                             {{"prompt", "And God said"}, {"max_tokens", 12}, {"temperature", 0},
                              {"logit_bias", {{std::to_string(first), -100}, {"7", 2.5}}}});
        ASSERT_EQ(r.status, 200) << r.raw;
        EXPECT_EQ(r.body["choices"][0]["text"], want["text"]);
    }

    // response_format json_object: the text is one JSON object's start, and all of one when the
    // choice ends with "stop"; a bias towards "}" closes it at once.
    {
        const Reply t = post(port, "/tokenize", {{"prompt", "}"}, {"add_special_tokens", false}});
        ASSERT_EQ(t.body["tokens"].size(), 1u) << t.raw;
        const std::string close = std::to_string(t.body["tokens"][0].get<int>());
        const json fmt = {{"type", "json_object"}};
        const Reply shut = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 8}, {"temperature", 0},
                                                          {"response_format", fmt}, {"logit_bias", {{close, 100}}}});
        ASSERT_EQ(shut.status, 200) << shut.raw;
        EXPECT_EQ(json::parse(shut.body["choices"][0]["text"].get<std::string>()), json::object()) << shut.raw;
        EXPECT_EQ(shut.body["choices"][0]["finish_reason"], "stop");
        const Reply many = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 1.0},
                                                          {"seed", 3}, {"n", 6}, {"response_format", fmt}});
        ASSERT_EQ(many.status, 200) << many.raw;
        for (const json& c : many.body["choices"]) {
            const std::string text = c["text"];
            shardlm::JsonAcceptor a;
            EXPECT_TRUE(a.push(text)) << text;
            EXPECT_EQ(a.complete(), c["finish_reason"] == "stop") << text;
            if (a.complete()) {
                EXPECT_TRUE(json::parse(text).is_object()) << text;
            }
        }
    }

    // response_format json_schema: keys in the schema's order (not the alphabet's), the required
    // ones there, values of their types; a complete text ends the choice with "stop".
    {
        const nlohmann::ordered_json sc = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
            "verse": {"type": "integer"}, "book": {"enum": ["Genesis", "Exodus"]},
            "text": {"type": "string", "maxLength": 12}, "amen": {"type": "boolean"}},
            "required": ["verse", "book", "text"], "additionalProperties": false})");
        nlohmann::ordered_json body = {{"prompt", "And God said"}, {"max_tokens", 160}, {"temperature", 1.0}, {"seed", 8}, {"n", 8}};
        body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "verse"}, {"schema", sc}}}};
        const Reply r = post_text(port, "/v1/completions", body.dump());
        ASSERT_EQ(r.status, 200) << r.raw;
        const auto schema = std::make_shared<const shardlm::JsonSchema>(shardlm::compile_json_schema(sc.dump(), "test"));
        int complete = 0;
        for (const json& c : r.body["choices"]) {
            const std::string text = c["text"];
            shardlm::JsonAcceptor a(schema);
            EXPECT_TRUE(a.push(text)) << text;
            EXPECT_EQ(a.complete(), c["finish_reason"] == "stop") << text;
            if (!a.complete()) continue;
            ++complete;
            const nlohmann::ordered_json v = nlohmann::ordered_json::parse(text);
            std::vector<std::string> keys;
            for (auto it = v.begin(); it != v.end(); ++it) keys.push_back(it.key());
            ASSERT_GE(keys.size(), 3u) << text;
            EXPECT_EQ(std::vector<std::string>(keys.begin(), keys.begin() + 3), (std::vector<std::string>{"verse", "book", "text"})) << text;
            EXPECT_TRUE(v["verse"].is_number_integer()) << text;
            EXPECT_TRUE(v["book"] == "Genesis" || v["book"] == "Exodus") << text;
            int64_t chars = 0;  // code points (what maxLength counts)
            for (const char ch : v["text"].get<std::string>()) chars += (uint8_t(ch) & 0xC0) != 0x80;
            EXPECT_LE(chars, 12) << text;
        }
        EXPECT_GE(complete, 2) << r.raw;
    }

    // A pattern and a format: the strings match them (std::regex checks the completed ones).
    {
        const json sc = json::parse(R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
            "day": {"type": "string", "format": "date"}}, "required": ["code", "day"]})");
        const json body = {{"prompt", "And God said"}, {"max_tokens", 250}, {"temperature", 1.0}, {"seed", 4}, {"n", 6},
                           {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "p"}, {"schema", sc}}}}}};
        const Reply r = post(port, "/v1/completions", body);
        ASSERT_EQ(r.status, 200) << r.raw;
        int complete = 0;
        for (const json& c : r.body["choices"]) {
            if (c["finish_reason"] != "stop") continue;
            ++complete;
            const json v = json::parse(c["text"].get<std::string>());
            EXPECT_TRUE(std::regex_match(v["code"].get<std::string>(), std::regex("[A-Z]{2}-[0-9]{3}"))) << c["text"];
            EXPECT_TRUE(std::regex_match(v["day"].get<std::string>(), std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}"))) << c["text"];
        }
        EXPECT_GE(complete, 2) << r.raw;
    }

    // vLLM's guided_regex (and structured_outputs.regex): each text matches the pattern whole; it
    // ends where the model draws its end in an accepting state, or where nothing can follow.
    {
        const json base = {{"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 1.0}, {"seed", 6}, {"n", 8}};
        json a = base, b = base;
        a["guided_regex"] = "[A-Z][a-z]{1,6}( [0-9]{1,3})?";
        b["structured_outputs"] = {{"regex", "(Genesis|Exodus) [1-9]:[1-9]"}};
        const Reply ra = post(port, "/v1/completions", a), rb = post(port, "/v1/completions", b);
        ASSERT_EQ(ra.status, 200) << ra.raw;
        ASSERT_EQ(rb.status, 200) << rb.raw;
        int early = 0;  // ended by the model in an accepting state that could have gone on
        for (size_t i = 0; i < 8; ++i) {
            const json& c = ra.body["choices"][i];
            early += !std::regex_match(c["text"].get<std::string>(), std::regex("[A-Z][a-z]{6} [0-9]{3}"));
            EXPECT_EQ(c["finish_reason"], "stop") << ra.raw;
            EXPECT_TRUE(std::regex_match(c["text"].get<std::string>(), std::regex("[A-Z][a-z]{1,6}( [0-9]{1,3})?"))) << c["text"];
            const json& d = rb.body["choices"][i];
            EXPECT_EQ(d["finish_reason"], "stop") << rb.raw;
            EXPECT_TRUE(std::regex_match(d["text"].get<std::string>(), std::regex("(Genesis|Exodus) [1-9]:[1-9]"))) << d["text"];
        }
        EXPECT_GT(early, 0) << ra.raw;
    }

    // vLLM's guided_grammar (structured_outputs.grammar, llama.cpp's grammar): GBNF, the text is
    // root's whole; a recursive one (nested brackets) is balanced in every prefix, and whole where
    // it stops.
    {
        const std::string verse = "root ::= book \" \" num \":\" num\nbook ::= \"Genesis\" | \"Exodus\"\nnum ::= [1-9] [0-9]?";
        // (brackets the model writes often: 't' opens, 'e' closes)
        const std::string lists = "root ::= \"t\" item* \"e\"\nitem ::= [a-df-su-z] | root";
        const json base = {{"prompt", "And God said"}, {"max_tokens", 40}, {"temperature", 1.0}, {"seed", 4}, {"n", 6}};
        json a = base, b = base, c = base;
        a["guided_grammar"] = verse;
        b["structured_outputs"] = {{"grammar", verse}};
        c["grammar"] = lists;
        for (const json* q : {&a, &b}) {
            const Reply r = post(port, "/v1/completions", *q);
            ASSERT_EQ(r.status, 200) << r.raw;
            for (const json& ch : r.body["choices"]) {
                EXPECT_EQ(ch["finish_reason"], "stop") << r.raw;
                EXPECT_TRUE(std::regex_match(ch["text"].get<std::string>(), std::regex("(Genesis|Exodus) [1-9][0-9]?:[1-9][0-9]?")))
                    << ch["text"];
            }
        }
        const Reply r = post(port, "/v1/completions", c);
        ASSERT_EQ(r.status, 200) << r.raw;
        int nested = 0;
        for (const json& ch : r.body["choices"]) {
            const std::string text = ch["text"];
            EXPECT_TRUE(std::regex_match(text, std::regex("t[a-z]*"))) << text;
            int depth = 0, deepest = 0;
            for (const char x : text) {
                depth += x == 't' ? 1 : x == 'e' ? -1 : 0;
                deepest = std::max(deepest, depth);
                EXPECT_GE(depth, 0) << text;
            }
            nested += deepest > 1;
            if (ch["finish_reason"] == "stop") {
                EXPECT_EQ(depth, 0) << text;
            }
        }
        EXPECT_GT(nested, 0) << r.raw;
    }

    // vLLM's guided_choice (and structured_outputs.choice): each text is one of the choices, whole;
    // guided_json is response_format json_schema's.
    {
        const json books = {"Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy"};
        const json base = {{"prompt", "And God said"}, {"max_tokens", 12}, {"temperature", 1.0}, {"seed", 2}, {"n", 6}};
        json a = base, b = base;
        a["guided_choice"] = books;
        b["structured_outputs"] = {{"choice", books}};
        const Reply ra = post(port, "/v1/completions", a), rb = post(port, "/v1/completions", b);
        ASSERT_EQ(ra.status, 200) << ra.raw;
        ASSERT_EQ(rb.status, 200) << rb.raw;
        std::set<std::string> seen;
        for (size_t i = 0; i < 6; ++i) {
            const json& c = ra.body["choices"][i];
            EXPECT_NE(std::find(books.begin(), books.end(), c["text"]), books.end()) << ra.raw;
            EXPECT_EQ(c["finish_reason"], "stop") << ra.raw;
            EXPECT_EQ(rb.body["choices"][i]["text"], c["text"]);
            seen.insert(c["text"].get<std::string>());
        }
        EXPECT_GE(seen.size(), 2u) << ra.raw;  // sampled: not one choice forced
        const json sc = {{"type", "object"}, {"properties", {{"n", {{"type", "integer"}}}}}, {"required", {"n"}}};
        json g = base, f = base;
        g["guided_json"] = sc;
        f["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "n"}, {"schema", sc}}}};
        g["max_tokens"] = f["max_tokens"] = 40;
        const Reply rg = post(port, "/v1/completions", g), rf = post(port, "/v1/completions", f);
        ASSERT_EQ(rg.status, 200) << rg.raw;
        EXPECT_EQ(rg.body["choices"], rf.body["choices"]);
    }

    // ignore_eos and min_tokens, on a request pushed to end at once.
    {
        const std::string eos = std::to_string(json::parse(read_file(model_.file("config.json")))["eos_token_id"].get<int>());
        auto count = [&](const json& extra) {
            json body = {{"prompt", "And God said"}, {"max_tokens", 7}, {"temperature", 0}, {"logit_bias", {{eos, 100}}}};
            body.update(extra);
            const Reply r = post(port, "/v1/completions", body);
            EXPECT_EQ(r.status, 200) << r.raw;
            return r.body["usage"]["completion_tokens"].get<int>();
        };
        EXPECT_EQ(count(json::object()), 1);
        EXPECT_EQ(count({{"ignore_eos", true}}), 7);
        EXPECT_EQ(count({{"min_tokens", 4}}), 5);
        EXPECT_EQ(count({{"min_tokens", 4}, {"priority", -3}}), 5);  // (the order among waiting requests only)
        // stop_token_ids: the greedy completion's third token ends it there.
        const Reply free_run = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 6}, {"temperature", 0},
                                                              {"logprobs", 0}});
        ASSERT_EQ(free_run.status, 200) << free_run.raw;
        const std::string third = free_run.body["choices"][0]["logprobs"]["tokens"][2];
        const Reply t = post(port, "/tokenize", {{"prompt", third}, {"add_special_tokens", false}});
        ASSERT_EQ(t.body["tokens"].size(), 1u) << t.raw;
        const Reply stopped = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 6}, {"temperature", 0},
                                                             {"stop_token_ids", {t.body["tokens"][0]}}});
        ASSERT_EQ(stopped.status, 200) << stopped.raw;
        EXPECT_EQ(stopped.body["choices"][0]["finish_reason"], "stop");
        EXPECT_LE(stopped.body["usage"]["completion_tokens"].get<int>(), 3);
        const std::string text = stopped.body["choices"][0]["text"];
        EXPECT_EQ(text, free_run.body["choices"][0]["text"].get<std::string>().substr(0, text.size()));
        EXPECT_EQ(text.substr(text.size() - third.size()), third);  // the stop token is kept
    }

    // Bad requests: one-line errors, and the server goes on.
    auto error_of = [&](const json& body, int status, const std::string& part) {
        const Reply r = post(port, "/v1/completions", body);
        EXPECT_EQ(r.status, status) << r.raw;
        EXPECT_NE(r.body["error"]["message"].get<std::string>().find(part), std::string::npos) << r.raw;
    };
    {
        httplib::Client raw("127.0.0.1", port);
        const auto r = raw.Post("/v1/completions", "{not json", "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400);
        EXPECT_NE(r->body.find("not valid JSON"), std::string::npos);
        // Nesting deep enough to overflow a recursive serialiser's stack: refused before parsing,
        // on the completions route and the tokenizer's, and the server goes on.
        const size_t deep = 100000;
        const std::string schema = std::string(deep, '[') + std::string(deep, ']');
        for (const char* path : {"/v1/completions", "/tokenize"}) {
            const auto d = raw.Post(path,
                                    "{\"prompt\": \"x\", \"max_tokens\": 1, \"response_format\": {\"type\": \"json_schema\", "
                                    "\"json_schema\": {\"name\": \"a\", \"schema\": " + schema + "}}}",
                                    "application/json");
            ASSERT_TRUE(d) << path;
            EXPECT_EQ(d->status, 400) << path;
            EXPECT_NE(d->body.find("deeper than 512 levels"), std::string::npos) << d->body;
        }
        const auto alive = raw.Get("/health");
        ASSERT_TRUE(alive);
        EXPECT_EQ(alive->status, 200);
    }
    // The same nesting inside a string (a schema given as text) reaches the schema compiler's check.
    error_of({{"prompt", "x"}, {"max_tokens", 1}, {"guided_json", std::string(600, '[') + std::string(600, ']')}}, 400,
             "nests deeper than 512 levels");
    error_of({{"prompt", "x"}, {"model", "gpt-4"}}, 404, "The model `gpt-4` does not exist");
    error_of({{"max_tokens", 3}}, 400, "\"prompt\" is required");
    error_of({{"prompt", "x"}, {"max_tokens", 300}}, 400, "maximum context length is 256 tokens");
    error_of({{"prompt", "x"}, {"temperature", -1}}, 400, "\"temperature\" must be in");
    error_of({{"prompt", "x"}, {"suffix", "y"}}, 400, "\"suffix\" (fill in the middle) needs a code model's FIM tokens, and this tokenizer has none");
    error_of({{"prompt", "x"}, {"stream_options", {{"include_usage", true}}}}, 400, "\"stream_options\" needs \"stream\": true");
    error_of({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"include_usage", 1}}}}, 400,
             "\"stream_options.include_usage\" must be true or false");
    error_of({{"prompt", "x"}, {"stream", true}, {"stream_options", 1}}, 400, "\"stream_options\" must be an object");
    error_of({{"prompt", "x"}, {"response_format", {{"type", "json_schema"}}}}, 400, "json_schema needs \"json_schema\": {\"name\"");
    error_of({{"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "object"},
             {"properties", {{"x", {{"type", "string"}, {"pattern", "(a)\\1"}}}}}}}}}}}}, 400,
             "response_format.json_schema.schema: json_schema at #/properties/x/pattern: backreferences are not supported");
    error_of({{"prompt", "x"}, {"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "number"}}}}}}}},
             400, "the top value must end by itself");
    error_of({{"prompt", "x"}, {"response_format", "json"}}, 400, "\"response_format\" must be an object");
    error_of({{"prompt", "x"}, {"guided_grammar", "root ::= x"}}, 400, "guided_grammar: line 1: rule x is used but not defined");
    error_of({{"prompt", "x"}, {"grammar", "root ::= root \"a\""}}, 400, "grammar: rule root can begin with itself");
    error_of({{"prompt", "x"}, {"guided_grammar", 5}}, 400, "\"guided_grammar\" must be a GBNF grammar");
    error_of({{"prompt", "x"}, {"guided_grammar", "root ::= \"a\""}, {"guided_regex", "a"}}, 400, "one constraint per request");
    error_of({{"prompt", "x"}, {"guided_regex", "a(?=b)"}}, 400, "guided_regex: lookahead and lookbehind");
    error_of({{"prompt", "x"}, {"guided_regex", 5}}, 400, "\"guided_regex\" must be a regular expression");
    error_of({{"prompt", "x"}, {"guided_regex", "a"}, {"guided_choice", {"a"}}}, 400, "one constraint per request");
    error_of({{"prompt", "x"}, {"guided_choice", {"a", "ab"}}}, 400, "guided_choice: \"a\" begins \"ab\"");
    error_of({{"prompt", "x"}, {"guided_choice", json::array()}}, 400, "\"guided_choice\" must be an array of 1 to 1024 strings");
    error_of({{"prompt", "x"}, {"guided_json", 5}}, 400, "\"guided_json\" must be a JSON schema");
    error_of({{"prompt", "x"}, {"guided_json", {{"type", "string"}, {"format", "iri"}}}}, 400,
             "guided_json: json_schema at #/format: format \"iri\" is not supported");
    error_of({{"prompt", "x"}, {"guided_choice", {"a"}}, {"response_format", {{"type", "json_object"}}}}, 400, "one constraint per request");
    error_of({{"prompt", "x"}, {"structured_outputs", {{"grammar", "root ::= \"a"}}}}, 400,
             "structured_outputs.grammar: line 1: a '\"' without its closing '\"'");
    error_of({{"prompt", "x"}, {"structured_outputs", {{"structural_tag", "x"}}}}, 400,
             "\"structured_outputs.structural_tag\" is not supported by shardlm serve (json, choice, regex and grammar are)");
    error_of({{"prompt", "x"}, {"response_format", {{"type", "yaml"}}}}, 400, "type \"yaml\" (text, json_object or json_schema)");
    error_of({{"prompt", "x"}, {"stream", true}, {"stream_options", {{"continuous_usage_stats", "yes"}}}}, 400,
             "\"stream_options.continuous_usage_stats\" must be true or false");
    error_of({{"prompt", "x"}, {"max_tokens", 0}}, 400, "\"max_tokens\" must be in [1, ");
    error_of({{"prompt", "x"}, {"include_stop_str_in_output", 1}}, 400, "\"include_stop_str_in_output\" must be true or false");
    error_of({{"prompt", "x"}, {"skip_special_tokens", "no"}}, 400, "\"skip_special_tokens\" must be true or false");
    error_of({{"prompt", "x"}, {"allowed_token_ids", json::array()}}, 400, "\"allowed_token_ids\" must be a non-empty array");
    error_of({{"prompt", "x"}, {"allowed_token_ids", {1, 1 << 20}}}, 400, "\"allowed_token_ids\" token ids must be integers in [0, ");
    error_of({{"prompt", "x"}, {"bad_words", "a"}}, 400, "\"bad_words\" must be an array of up to 128 strings");
    error_of({{"prompt", "x"}, {"bad_words", {"a", 1}}}, 400, "\"bad_words\" must be an array of up to 128 strings");
    error_of({{"prompt", "x"}, {"bad_words", {" "}}}, 400, "a \"bad_words\" entry is empty");
    error_of({{"prompt", "x"}, {"prompt_logprobs", 21}}, 400, "\"prompt_logprobs\" must be in [0, 20], not 21");
    error_of({{"prompt", "x"}, {"prompt_logprobs", 1}, {"stream", true}}, 400, "\"prompt_logprobs\" with \"stream\" is not supported");
    error_of({{"prompt", "x"}, {"max_tokens", 0}}, 400, "\"max_tokens\" must be in [1, ");
    error_of({{"prompt", "x"}, {"echo", 1}}, 400, "\"echo\" must be true or false");
    error_of({{"prompt", "x"}, {"logprobs", 21}}, 400, "\"logprobs\" must be in [0, 20]");
    error_of({{"prompt", "x"}, {"logprobs", true}}, 400, "\"logprobs\" must be an integer");
    error_of({{"prompt", "x"}, {"top_logprobs", 2}}, 400, "\"top_logprobs\" is the chat API's");
    error_of({{"prompt", "x"}, {"n", 17}}, 400, "\"n\" must be in [1, 16]");
    error_of({{"prompt", json::array({"x", json::array({5})})}}, 400, "\"prompt\" must be a string, an array of token ids, or a list of either");
    error_of({{"prompt", json::array({"a", "b", "c", "d", "e", "f", "g", "h", "i"})}, {"n", 16}}, 400,
             "9 prompts x \"n\" 16 asks for more than 128 choices");
    error_of({{"prompt", json::array({"x", ""})}}, 400, "a prompt is empty");
    error_of({{"prompt", {1, 99999}}}, 400, "token ids must be integers in [0, 3072)");
    error_of({{"prompt", "x"}, {"stop", {"a", ""}}}, 400, "a \"stop\" string is empty");
    error_of({{"prompt", "x"}, {"logit_bias", 5}}, 400, "\"logit_bias\" must be an object");
    error_of({{"prompt", "x"}, {"max_tokens", 3}, {"min_tokens", 4}}, 400, "\"min_tokens\" must be in [0, 3]");
    error_of({{"prompt", "x"}, {"priority", 1.5}}, 400, "\"priority\" must be an integer");
    error_of({{"prompt", "x"}, {"stop_token_ids", {1, -2}}}, 400, "\"stop_token_ids\" must be an array of up to 16 token ids in [0, ");
    error_of({{"prompt", "x"}, {"stop_token_ids", json::array({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})}}, 400,
             "\"stop_token_ids\" must be an array of up to 16");
    error_of({{"prompt", "x"}, {"ignore_eos", 1}}, 400, "\"ignore_eos\" must be true or false");
    error_of({{"prompt", "x"}, {"logit_bias", {{"abc", 1}}}}, 400, "\"logit_bias\": \"abc\" is not a token id of this model");
    error_of({{"prompt", "x"}, {"logit_bias", {{"3072", 1}}}}, 400, "(0 to 3071)");
    error_of({{"prompt", "x"}, {"logit_bias", {{"5", 101}}}}, 400, "the bias of token 5 must be a number in [-100, 100]");
    // The same prompt again: a freed slot holds it (prefix caching), all but its last token is
    // reused, and the completion is the same.
    const Reply again = post(port, "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0}});
    EXPECT_EQ(again.body["choices"], one.body["choices"]);
    EXPECT_EQ(one.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(again.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              again.body["usage"]["prompt_tokens"].get<int>() - 1);
    // /tokenize and /detokenize: the prompt's ids as the completion counted them, and back.
    const Reply ids_of = post(port, "/tokenize", {{"prompt", "And God said"}});
    ASSERT_EQ(ids_of.status, 200) << ids_of.raw;
    EXPECT_EQ(ids_of.body["count"], one.body["usage"]["prompt_tokens"]);
    EXPECT_EQ(ids_of.body["max_model_len"], 256);
    const Reply text_of = post(port, "/detokenize", {{"tokens", ids_of.body["tokens"]}});
    ASSERT_EQ(text_of.status, 200) << text_of.raw;
    const std::string back = text_of.body["prompt"];
    EXPECT_EQ(back.substr(back.size() - 12), "And God said");
    EXPECT_EQ(post(port, "/detokenize", {{"tokens", {1, -2}}}).status, 400);
    EXPECT_EQ(post(port, "/tokenize", {{"text", "x"}}).status, 400);
    // return_token_strs (vLLM's): each id's string in tokenizer.json's vocabulary (byte-level "Ġ").
    const Reply strs = post(port, "/tokenize", {{"prompt", "And God said"}, {"add_special_tokens", false}, {"return_token_strs", true}});
    ASSERT_EQ(strs.status, 200) << strs.raw;
    const json vocab = json::parse(read_file(kModel + "/tokenizer.json"))["model"]["vocab"];
    ASSERT_EQ(strs.body["token_strs"].size(), strs.body["tokens"].size()) << strs.raw;
    std::string spelled;
    for (size_t i = 0; i < strs.body["tokens"].size(); ++i) {
        EXPECT_EQ(vocab[strs.body["token_strs"][i].get<std::string>()], strs.body["tokens"][i]) << strs.raw;
        spelled += strs.body["token_strs"][i].get<std::string>();
    }
    EXPECT_EQ(spelled, "AndĠGodĠsaid");
    EXPECT_EQ(post(port, "/tokenize", {{"prompt", "x"}, {"return_token_strs", 1}}).status, 400);
    // /version (vLLM's): the version --version prints.
    {
        httplib::Client vc("127.0.0.1", port);
        const auto v = vc.Get("/version");
        ASSERT_TRUE(v);
        const CommandResult cli = run_command(kCli + " --version");
        EXPECT_NE(cli.out.find("shardlm " + json::parse(v->body)["version"].get<std::string>() + " "), std::string::npos)
            << v->body << cli.out;
    }
    // /metrics: Prometheus text with the requests that ended and the prefix cache's share.
    {
        httplib::Client mc("127.0.0.1", port);
        const auto m = mc.Get("/metrics");
        ASSERT_TRUE(m);
        auto value = [&](const std::string& name) { return metric_value(m->body, name); };
        EXPECT_GE(value("shardlm_sequences_finished_total{finish_reason=\"length\"}"), 10);
        EXPECT_GE(value("shardlm_sequences_finished_total{finish_reason=\"stop\"}"), 1);
        EXPECT_GT(value("shardlm_prompt_tokens_cached_total"), 0);
        // Every prompt token ran but the cached ones and the last of each of the three texts
        // scored with max_tokens 0 (nothing follows it to predict; echo's whole and streamed).
        EXPECT_EQ(value("shardlm_engine_prefill_tokens_total"),
                  value("shardlm_prompt_tokens_total") - value("shardlm_prompt_tokens_cached_total") - 3);
        EXPECT_EQ(value("shardlm_requests_running"), 0);
        EXPECT_NE(m->body.find("# TYPE shardlm_generation_tokens_total counter"), std::string::npos);
        EXPECT_NE(m->body.find("# TYPE shardlm_num_preemptions_total counter"), std::string::npos);
        // Latency histograms, one sample per sequence that made a token: cumulative buckets that
        // end with +Inf at the count, and the same count in each (a later token per sequence
        // for the time per output token: max_tokens 1 requests have none).
        const double seqs = value("shardlm_time_to_first_token_seconds_count");
        EXPECT_GE(seqs, 10);
        EXPECT_EQ(value("shardlm_e2e_request_latency_seconds_count"), seqs);
        EXPECT_LE(value("shardlm_time_per_output_token_seconds_count"), seqs);
        EXPECT_GT(value("shardlm_time_per_output_token_seconds_count"), 0);
        EXPECT_EQ(value("shardlm_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), seqs);
        EXPECT_LE(value("shardlm_time_to_first_token_seconds_bucket{le=\"0.005\"}"),
                  value("shardlm_time_to_first_token_seconds_bucket{le=\"60\"}"));
        EXPECT_GT(value("shardlm_e2e_request_latency_seconds_sum"), 0);
        EXPECT_GE(value("shardlm_e2e_request_latency_seconds_sum"), value("shardlm_time_to_first_token_seconds_sum"));
        EXPECT_NE(m->body.find("# TYPE shardlm_time_to_first_token_seconds histogram"), std::string::npos);
        // --speculate 3: proposals made, some confirmed.
        EXPECT_GT(value("shardlm_spec_decode_accepted_tokens_total"), 0);
        EXPECT_LE(value("shardlm_spec_decode_accepted_tokens_total"), value("shardlm_spec_decode_draft_tokens_total"));
    }
    EXPECT_EQ(srv.stop(), 0);
    EXPECT_NE(srv.read_all().find("shardlm serve: stopped"), std::string::npos) << srv.read_all();
}

// /v1/chat/completions renders the messages with the model's template: the reply is generate
// --chat's for the same system message and prompt; a conversation's later turns work; a bad
// message order is refused.
TEST_F(Serve, ChatCompletions) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json msgs = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "In the beginning"}}});
    const Reply r = post(srv.port(), "/v1/chat/completions", {{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["object"], "chat.completion");
    EXPECT_EQ(r.body["choices"][0]["message"]["role"], "assistant");
    EXPECT_EQ(r.body["choices"][0]["message"]["content"],
              generate_text(model_.path(), "--chat --system 'Be brief.' --prompt 'In the beginning' --max-new-tokens 10"));
    json more = msgs;
    more.push_back({{"role", "assistant"}, {"content", r.body["choices"][0]["message"]["content"]}});
    more.push_back({{"role", "user"}, {"content", "And God said"}});
    const Reply two = post(srv.port(), "/v1/chat/completions", {{"messages", more}, {"max_tokens", 5}, {"temperature", 0}});
    ASSERT_EQ(two.status, 200) << two.raw;
    EXPECT_GT(two.body["usage"]["prompt_tokens"].get<int>(), r.body["usage"]["prompt_tokens"].get<int>());
    // The second turn reuses at least the first one's prompt from the slot it ran in, and answers
    // what a server without prefix caching answers.
    EXPECT_GE(two.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
              r.body["usage"]["prompt_tokens"].get<int>());
    {
        Server plain(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512 --no-prefix-cache",
                     logs_.file("plain.log"));
        ASSERT_GT(plain.port(), 0) << plain.read_all();
        for (const json& m : {msgs, more}) {
            const Reply p = post(plain.port(), "/v1/chat/completions", {{"messages", m}, {"max_tokens", 5}, {"temperature", 0}});
            ASSERT_EQ(p.status, 200) << p.raw;
            EXPECT_EQ(p.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
            if (m == more) {
                EXPECT_EQ(p.body["choices"], two.body["choices"]);
            }
        }
        EXPECT_EQ(plain.stop(), 0);
    }
    const Reply streamed = post(srv.port(), "/v1/chat/completions",
                                {{"messages", msgs}, {"max_tokens", 10}, {"temperature", 0}, {"stream", true},
                                 {"stream_options", {{"include_usage", true}}}});
    EXPECT_NE(streamed.raw.find("chat.completion.chunk"), std::string::npos);
    {  // the first event carries the role (OpenAI's and vLLM's first delta), with empty content
        const size_t first = streamed.raw.find("data: {");
        ASSERT_NE(first, std::string::npos) << streamed.raw;
        const json ev = json::parse(streamed.raw.substr(first + 6, streamed.raw.find('\n', first) - first - 6));
        EXPECT_EQ(ev["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}})) << ev;
        EXPECT_EQ(streamed.raw.find("\"role\"", streamed.raw.find('\n', first)), std::string::npos) << "one role event";
    }
    {
        // The usage event comes last before [DONE], a chunk with no choices.
        const size_t done = streamed.raw.rfind("data: [DONE]"), last = streamed.raw.rfind("data: {", done);
        ASSERT_NE(last, std::string::npos) << streamed.raw;
        const json usage_chunk = json::parse(streamed.raw.substr(last + 6, streamed.raw.find('\n', last) - last - 6));
        EXPECT_EQ(usage_chunk["object"], "chat.completion.chunk");
        EXPECT_TRUE(usage_chunk["choices"].empty());
        EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 10);
    }
    // logprobs: an entry per token with its bytes and the two most probable.
    const Reply lp = post(srv.port(), "/v1/chat/completions",
                          {{"messages", msgs}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", true}, {"top_logprobs", 2}});
    ASSERT_EQ(lp.status, 200) << lp.raw;
    const json& content = lp.body["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), 5u) << lp.raw;
    std::string joined;
    for (const json& e : content) {
        std::string bytes;
        for (const json& b : e["bytes"]) bytes += char(b.get<int>());
        EXPECT_EQ(bytes, e["token"]) << lp.raw;  // whole characters here
        joined += bytes;
        ASSERT_EQ(e["top_logprobs"].size(), 2u);
        EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
        EXPECT_LE(e["logprob"].get<double>(), 0.0);
        EXPECT_GE(e["top_logprobs"][0]["logprob"].get<double>(), e["top_logprobs"][1]["logprob"].get<double>());
    }
    EXPECT_EQ(joined, lp.body["choices"][0]["message"]["content"]);
    EXPECT_TRUE(r.body["choices"][0]["logprobs"].is_null());
    const Reply top_alone = post(srv.port(), "/v1/chat/completions", {{"messages", msgs}, {"top_logprobs", 2}});
    EXPECT_EQ(top_alone.status, 400);
    EXPECT_EQ(top_alone.body["error"]["message"], "\"top_logprobs\" needs \"logprobs\": true") << top_alone.raw;
    const Reply counted = post(srv.port(), "/tokenize", {{"messages", msgs}});
    EXPECT_EQ(counted.body["count"], r.body["usage"]["prompt_tokens"]) << counted.raw;
    // echo with the user's message last: nothing to put first (vLLM's echoes the assistant's only).
    json echoed = {{"messages", msgs}, {"echo", true}, {"max_tokens", 6}, {"temperature", 0}};
    const Reply echo = post(srv.port(), "/v1/chat/completions", echoed);
    ASSERT_EQ(echo.status, 200) << echo.raw;
    echoed.erase("echo");
    EXPECT_EQ(echo.body["choices"][0]["message"], post(srv.port(), "/v1/chat/completions", echoed).body["choices"][0]["message"]);
    echoed["echo"] = "yes";
    EXPECT_EQ(post(srv.port(), "/v1/chat/completions", echoed).body["error"]["message"], "\"echo\" must be true or false");
    const Reply bad = post(srv.port(), "/v1/chat/completions",
                           {{"messages", json::array({{{"role", "assistant"}, {"content", "x"}}})}});
    EXPECT_EQ(bad.status, 400);
    EXPECT_NE(bad.raw.find("a chat conversation needs a user turn"), std::string::npos) << bad.raw;
    EXPECT_EQ(srv.stop(), 0);
}

// continue_final_message (vLLM's, with add_generation_prompt false): the last message is the start
// of the assistant's reply and the model goes on from it. The prompt is the ChatML text cut after
// that message (no <|im_end|>, no new turn), and the reply is what completions give for those
// ids, streamed or not. Requests that cannot be continued get a 400 naming the field. Without it,
// turns in another order than user first and in turn are rendered as the template writes them.
TEST_F(Serve, ContinueFinalMessageGoesOnFromTheReply) {
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json msgs = json::array({{{"role", "user"}, {"content", "In the beginning"}}, {{"role", "assistant"}, {"content", "God created"}}});
    const json req = {{"messages", msgs}, {"continue_final_message", true}, {"add_generation_prompt", false}};
    const Reply ids = post(srv.port(), "/tokenize", req);
    const Reply want = post(srv.port(), "/tokenize",
                            {{"prompt", "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\nGod created"},
                             {"add_special_tokens", false}});
    ASSERT_EQ(ids.status, 200) << ids.raw;
    EXPECT_EQ(ids.body["tokens"], want.body["tokens"]) << ids.raw << want.raw;
    json chat = req;
    chat["max_tokens"] = 8;
    chat["temperature"] = 0;
    const Reply r = post(srv.port(), "/v1/chat/completions", chat);
    ASSERT_EQ(r.status, 200) << r.raw;
    const Reply plain = post(srv.port(), "/v1/completions",
                             {{"prompt", ids.body["tokens"]}, {"max_tokens", 8}, {"temperature", 0}});
    ASSERT_EQ(plain.status, 200) << plain.raw;
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], plain.body["choices"][0]["text"]) << r.raw;
    EXPECT_EQ(r.body["usage"]["prompt_tokens"], ids.body["count"]);
    chat["stream"] = true;
    const Reply streamed = post_text(srv.port(), "/v1/chat/completions", chat.dump());
    std::string text;
    for (size_t at = streamed.raw.find("data: {"); at != std::string::npos; at = streamed.raw.find("data: {", at + 1)) {
        const json ev = json::parse(streamed.raw.substr(at + 6, streamed.raw.find('\n', at) - at - 6));
        if (!ev["choices"].empty()) text += ev["choices"][0]["delta"].value("content", "");
    }
    EXPECT_EQ(text, r.body["choices"][0]["message"]["content"]) << streamed.raw;
    // echo (vLLM's): the assistant's message so far leads the content, whole and streamed (its
    // own event, after the role's); the tokens and usage are the same.
    json echoed = chat;
    echoed["echo"] = true;
    echoed.erase("stream");
    const Reply e = post(srv.port(), "/v1/chat/completions", echoed);
    ASSERT_EQ(e.status, 200) << e.raw;
    EXPECT_EQ(e.body["choices"][0]["message"]["content"], "God created" + r.body["choices"][0]["message"]["content"].get<std::string>());
    EXPECT_EQ(e.body["usage"]["prompt_tokens"], r.body["usage"]["prompt_tokens"]);
    EXPECT_EQ(e.body["usage"]["completion_tokens"], r.body["usage"]["completion_tokens"]);
    echoed["stream"] = true;
    const StreamedChat se = streamed_chat(post(srv.port(), "/v1/chat/completions", echoed).raw);
    EXPECT_EQ(se.content, e.body["choices"][0]["message"]["content"]);
    EXPECT_EQ(se.finish, "length");
    const json user_last = json::array({{{"role", "user"}, {"content", "In the beginning"}}});
    const json empty_last = json::array({{{"role", "user"}, {"content", "x"}}, {{"role", "assistant"}, {"content", ""}}});
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"messages", user_last}, {"continue_final_message", true}},
         "\"continue_final_message\": the last message must be the assistant's reply so far"},
        {{{"messages", empty_last}, {"continue_final_message", true}},
         "\"continue_final_message\": the last message is empty, nothing to go on from"},
        {{{"messages", msgs}, {"continue_final_message", true}, {"add_generation_prompt", true}},
         "\"continue_final_message\" and \"add_generation_prompt\" cannot both be true"},
        {{{"messages", user_last}, {"add_generation_prompt", false}},
         "\"add_generation_prompt\": false is supported with \"continue_final_message\": true only"},
        {{{"messages", msgs}, {"continue_final_message", "yes"}}, "\"continue_final_message\" must be true or false"},
    };
    for (const auto& [body, message] : cases) {
        const Reply bad = post(srv.port(), "/v1/chat/completions", body);
        EXPECT_EQ(bad.status, 400) << body.dump();
        EXPECT_EQ(bad.body["error"]["message"], message) << bad.raw;
    }
    // Without continue_final_message the turns may come in any order this template takes (OpenAI's
    // API allows it): an assistant turn last gets a new reply after it, a greeting may come first.
    const std::vector<std::pair<json, std::string>> orders = {
        {msgs, "<|im_start|>user\nIn the beginning<|im_end|>\n<|im_start|>assistant\nGod created<|im_end|>\n"
               "<|im_start|>assistant\n"},
        {json::array({{{"role", "assistant"}, {"content", "Hello"}}, {{"role", "user"}, {"content", "In the"}},
                      {{"role", "user"}, {"content", "beginning"}}}),
         "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nIn the<|im_end|>\n<|im_start|>user\nbeginning<|im_end|>\n"
         "<|im_start|>assistant\n"},
    };
    for (const auto& [m, text] : orders) {
        const Reply got = post(srv.port(), "/tokenize", {{"messages", m}});
        const Reply want_ids = post(srv.port(), "/tokenize", {{"prompt", text}, {"add_special_tokens", false}});
        EXPECT_EQ(got.body["tokens"], want_ids.body["tokens"]) << got.raw;
        const Reply reply = post(srv.port(), "/v1/chat/completions", {{"messages", m}, {"max_tokens", 3}, {"temperature", 0}});
        EXPECT_EQ(reply.status, 200) << reply.raw;
    }
    EXPECT_EQ(srv.stop(), 0);
}

// Tool calling with a Qwen2.5-style template (tests/tokenizer/templates/qwen25.jinja, whose
// renderings the tokenizer tests hold to Jinja's): guided_choice makes the shipped model write a
// call, which comes back as message.tool_calls with finish_reason "tool_calls", whole and
// streamed (no call text in the content deltas; the arguments as they are written; a
// call whose text turns out not to be one then comes as content); tool_choice "none" leaves it text; a
// conversation with the call and its result runs; bad tool requests get a 400 naming the field.
TEST_F(Serve, ToolCalls) {
    json cfg = json::parse(read_file(model_.file("tokenizer_config.json")));
    const std::string plain_template = cfg["chat_template"];
    cfg["chat_template"] = read_file(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/qwen25.jinja");
    write_file(model_.file("tokenizer_config.json"), cfg.dump());
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    const json ask = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
    const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call>";
    auto request = [&](const std::string& reply) {
        return json{{"messages", ask}, {"tools", tools}, {"max_tokens", 200}, {"temperature", 0},
                    {"guided_choice", json::array({reply})}};
    };
    const Reply r = post(srv.port(), "/v1/chat/completions", request("Let me look.\n" + call));
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& choice = r.body["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
    EXPECT_EQ(choice["message"]["content"], "Let me look.");
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.raw;
    const json& tc = choice["message"]["tool_calls"][0];
    EXPECT_EQ(tc["type"], "function");
    EXPECT_EQ(tc["function"]["name"], "get_weather");
    EXPECT_EQ(tc["function"]["arguments"], "{\"city\": \"Paris\"}");
    EXPECT_FALSE(tc["id"].get<std::string>().empty());
    // The prompt lists the tools: longer than without them.
    const Reply bare = post(srv.port(), "/tokenize", {{"messages", ask}});
    const Reply listed = post(srv.port(), "/tokenize", {{"messages", ask}, {"tools", tools}});
    ASSERT_EQ(listed.status, 200) << listed.raw;
    EXPECT_EQ(listed.body["count"], r.body["usage"]["prompt_tokens"]);
    EXPECT_GT(listed.body["count"].get<int>(), bare.body["count"].get<int>() + 50);

    // Streamed: content deltas without the call's text, the call's name once it is whole, its
    // arguments as the model writes them, then the reason.
    json st = request("Let me look.\n" + call);
    st["stream"] = true;
    const Reply streamed = post(srv.port(), "/v1/chat/completions", st);
    ASSERT_EQ(streamed.status, 200);
    const StreamedChat sc = streamed_chat(streamed.raw);
    const std::string& content = sc.content;
    const json& calls = sc.calls;
    const std::string& reason = sc.finish;
    EXPECT_EQ(content, choice["message"]["content"]);  // (the line break before the call held back, then left out)
    ASSERT_EQ(calls.size(), 1u) << streamed.raw;
    EXPECT_EQ(calls[0]["index"], 0);
    EXPECT_EQ(calls[0]["function"], tc["function"]);
    // How many pieces the arguments come in depends on how far the engine got between two looks
    // of the handler (a loaded machine merges them, as vLLM's output collector does): CI saw 3.
    // That they grow as the model writes them is ChatTools.StreamedCallsGrowIntoTheWholeReply's.
    EXPECT_GE(sc.call_deltas, 1u) << streamed.raw;
    EXPECT_EQ(reason, "tool_calls");
    // A call that turns out not to be one (text after its JSON) has gone out in part (unless a
    // loaded machine merged the whole reply into one look): the reply's text then follows as
    // content, so nothing is lost, and the reason is the reply's own.
    json broken = request(call.substr(0, call.find("\n</tool_call>")) + " and so on");
    const Reply whole_broken = post(srv.port(), "/v1/chat/completions", broken);
    ASSERT_EQ(whole_broken.status, 200) << whole_broken.raw;
    EXPECT_FALSE(whole_broken.body["choices"][0]["message"].contains("tool_calls")) << whole_broken.raw;
    broken["stream"] = true;
    const StreamedChat sb = streamed_chat(post(srv.port(), "/v1/chat/completions", broken).raw);
    EXPECT_EQ(sb.content, whole_broken.body["choices"][0]["message"]["content"]);
    EXPECT_LE(sb.calls.size(), 1u);
    EXPECT_EQ(sb.finish, "stop");
    // Two calls without parallel_tool_calls: the first only, whole and streamed.
    json two = request(call + "\n" + call);
    two["parallel_tool_calls"] = false;
    const Reply whole_two = post(srv.port(), "/v1/chat/completions", two);
    ASSERT_EQ(whole_two.status, 200) << whole_two.raw;
    ASSERT_EQ(whole_two.body["choices"][0]["message"]["tool_calls"].size(), 1u) << whole_two.raw;
    two["stream"] = true;
    const StreamedChat st2 = streamed_chat(post(srv.port(), "/v1/chat/completions", two).raw);
    ASSERT_EQ(st2.calls.size(), 1u);
    EXPECT_EQ(st2.calls[0]["function"], whole_two.body["choices"][0]["message"]["tool_calls"][0]["function"]);
    EXPECT_EQ(st2.finish, "tool_calls");

    // tool_choice "none": the same reply is text.
    json none = request(call);
    none["tool_choice"] = "none";
    const Reply text = post(srv.port(), "/v1/chat/completions", none);
    ASSERT_EQ(text.status, 200) << text.raw;
    EXPECT_EQ(text.body["choices"][0]["message"]["content"], call);
    EXPECT_EQ(text.body["choices"][0]["finish_reason"], "stop");
    EXPECT_FALSE(text.body["choices"][0]["message"].contains("tool_calls"));

    // The next turn: the call (arguments as text, as OpenAI's clients send them back) and its result.
    json more = ask;
    more.push_back({{"role", "assistant"}, {"content", nullptr},
                    {"tool_calls", json::array({{{"id", tc["id"]}, {"type", "function"}, {"function", tc["function"]}}})}});
    more.push_back({{"role", "tool"}, {"tool_call_id", tc["id"]}, {"content", json::array({{{"type", "text"}, {"text", "21 C"}}})}});
    const Reply next = post(srv.port(), "/v1/chat/completions",
                            {{"messages", more}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(next.status, 200) << next.raw;
    EXPECT_GT(next.body["usage"]["prompt_tokens"].get<int>(), r.body["usage"]["prompt_tokens"].get<int>());

    auto error_of = [&](const json& body, const std::string& path, const std::string& part) {
        const Reply e = post(srv.port(), path, body);
        EXPECT_EQ(e.status, 400) << body.dump() << ": " << e.raw;
        EXPECT_NE(e.raw.find(part), std::string::npos) << body.dump() << ": " << e.raw;
    };
    // tool_choice "required" and a named function hold the reply to JSON calls (vLLM's way).
    const json enum_tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "now"}}])");
    for (const bool stream : {false, true}) {
        for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
            json req = {{"messages", ask}, {"tools", enum_tools}, {"tool_choice", choice}, {"max_tokens", 300},
                        {"temperature", 0}, {"parallel_tool_calls", false}, {"stream", stream}};
            const Reply f = post(srv.port(), "/v1/chat/completions", req);
            ASSERT_EQ(f.status, 200) << f.raw;
            json got = json::array();
            std::string fin;
            if (!stream) {
                got = f.body["choices"][0]["message"]["tool_calls"];
                fin = f.body["choices"][0]["finish_reason"];
                EXPECT_TRUE(f.body["choices"][0]["message"]["content"].is_null()) << f.raw;
            } else {
                const StreamedChat sc = streamed_chat(f.raw);
                got = sc.calls;
                fin = sc.finish;
                EXPECT_EQ(sc.content, "") << f.raw;
            }
            EXPECT_EQ(fin, "tool_calls") << choice.dump() << " stream " << stream << ": " << f.raw;
            ASSERT_EQ(got.size(), 1u) << f.raw;
            const std::string name = got[0]["function"]["name"];
            if (choice.is_object()) {
                EXPECT_EQ(name, "get_weather");
            }
            const json args = json::parse(got[0]["function"]["arguments"].get<std::string>());
            if (name == "get_weather") {
                EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Rome") << args.dump();
            } else {
                EXPECT_EQ(name, "now");
            }
        }
    }
    error_of({{"messages", ask}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
             "/v1/chat/completions", "not among");
    error_of({{"messages", ask}, {"tools", tools}, {"tool_choice", "required"}, {"guided_choice", {"a"}}},
             "/v1/chat/completions", "no other constraint");
    error_of({{"messages", ask}, {"tool_choice", "auto"}}, "/v1/chat/completions", "needs \\\"tools\\\"");
    error_of({{"prompt", "x"}, {"tools", tools}}, "/v1/completions", "is the chat API's");
    error_of({{"messages", ask}, {"tools", tools}, {"response_format", {{"type", "json_object"}}}}, "/v1/chat/completions",
             "do not go together");
    error_of({{"messages", ask}, {"tools", json::parse(R"([{"type": "function", "function": {"name": "a b"}}])")}},
             "/v1/chat/completions", "function name");
    json orphan = ask;
    orphan.push_back({{"role", "tool"}, {"content", "21 C"}});
    error_of({{"messages", orphan}, {"tools", tools}}, "/v1/chat/completions", "a tool message answers");
    json bad_args = more;
    bad_args[1]["tool_calls"][0]["function"]["arguments"] = "{city";
    error_of({{"messages", bad_args}, {"tools", tools}}, "/v1/chat/completions", "are not JSON");
    EXPECT_EQ(srv.stop(), 0);

    // A template without a tools block refuses them.
    cfg["chat_template"] = plain_template;
    write_file(model_.file("tokenizer_config.json"), cfg.dump());
    Server plain(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256", logs_.file("plain.log"));
    ASSERT_GT(plain.port(), 0) << plain.read_all();
    const Reply no = post(plain.port(), "/v1/chat/completions", {{"messages", ask}, {"tools", tools}});
    EXPECT_EQ(no.status, 400) << no.raw;
    EXPECT_NE(no.raw.find("no tools block"), std::string::npos) << no.raw;
}

// Tool calling with Llama 3.2's template (tests/tokenizer/templates/llama32.jinja): the reply is a
// call as a whole ({"name", "parameters"} JSON), so a stream holds it back until it ends; a reply
// that is text streams as content; a turn with two calls is refused (the template takes one).
TEST_F(Serve, LlamaToolCalls) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/llama32.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    const json ask = json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}});
    auto request = [&](const std::string& reply, bool stream) {
        return json{{"messages", ask}, {"tools", tools}, {"max_tokens", 200}, {"temperature", 0},
                    {"guided_choice", json::array({reply})}, {"stream", stream}};
    };
    const std::string call = "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\"}}";
    const Reply r = post(srv.port(), "/v1/chat/completions", request(call, false));
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& choice = r.body["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
    EXPECT_TRUE(choice["message"]["content"].is_null()) << r.raw;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.raw;
    const json& tc = choice["message"]["tool_calls"][0];
    EXPECT_EQ(tc["function"]["name"], "get_weather");
    EXPECT_EQ(tc["function"]["arguments"], "{\"city\": \"Paris\"}");
    // chat_template_kwargs tools_in_user_message false: the tools go to the system message instead
    // (a shorter prompt: the system prompt's wording is shorter).
    const Reply in_user = post(srv.port(), "/tokenize", {{"messages", ask}, {"tools", tools}});
    const Reply in_system = post(srv.port(), "/tokenize", {{"messages", ask}, {"tools", tools},
                                                          {"chat_template_kwargs", {{"tools_in_user_message", false}}}});
    ASSERT_EQ(in_system.status, 200) << in_system.raw;
    EXPECT_NE(in_system.body["count"], in_user.body["count"]);

    const StreamedChat sc = streamed_chat(post(srv.port(), "/v1/chat/completions", request(call, true)).raw);
    EXPECT_EQ(sc.content, "");
    ASSERT_EQ(sc.calls.size(), 1u);
    EXPECT_EQ(sc.calls[0]["function"], tc["function"]);
    EXPECT_EQ(sc.finish, "tool_calls");
    const StreamedChat text = streamed_chat(post(srv.port(), "/v1/chat/completions", request("It is sunny.", true)).raw);
    EXPECT_EQ(text.content, "It is sunny.");
    EXPECT_TRUE(text.calls.empty());
    EXPECT_EQ(text.finish, "stop");

    // The call and its result in the next turn; two calls in one turn are refused.
    json more = ask;
    const json entry = {{"id", tc["id"]}, {"type", "function"}, {"function", tc["function"]}};
    more.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({entry})}});
    more.push_back({{"role", "tool"}, {"content", "{\"temp\": 21}"}});
    const Reply next = post(srv.port(), "/v1/chat/completions",
                            {{"messages", more}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(next.status, 200) << next.raw;
    EXPECT_GT(next.body["usage"]["prompt_tokens"].get<int>(), r.body["usage"]["prompt_tokens"].get<int>());
    more[1]["tool_calls"].push_back(entry);
    const Reply two = post(srv.port(), "/v1/chat/completions", {{"messages", more}, {"tools", tools}});
    EXPECT_EQ(two.status, 400) << two.raw;
    EXPECT_NE(two.raw.find("one call per assistant turn"), std::string::npos) << two.raw;
    EXPECT_EQ(srv.stop(), 0);
}

// Mistral v0.3's [TOOL_CALLS]: a reply's calls (after text or alone, whole and streamed) with the
// 9-character ids the template takes back in the next turn; other ids are refused by name.
TEST_F(Serve, MistralToolCalls) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/mistral_v3.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 1024", logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
    const json ask = json::array({{{"role", "user"}, {"content", "Weather in Paris and Oslo?"}}});
    auto request = [&](const std::string& reply, bool stream) {
        return json{{"messages", ask}, {"tools", tools}, {"max_tokens", 300}, {"temperature", 0},
                    {"guided_choice", json::array({reply})}, {"stream", stream}};
    };
    const std::string calls = "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}, "
                              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]";
    const Reply r = post(srv.port(), "/v1/chat/completions", request(calls, false));
    ASSERT_EQ(r.status, 200) << r.raw;
    const json& choice = r.body["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.raw;
    EXPECT_EQ(choice["message"]["content"], "Sure. ") << r.raw;
    const json& tc = choice["message"]["tool_calls"];
    ASSERT_EQ(tc.size(), 2u) << r.raw;
    EXPECT_EQ(tc[0]["function"]["arguments"], "{\"city\": \"Paris\"}");
    EXPECT_EQ(tc[1]["function"]["arguments"], "{\"city\": \"Oslo\"}");
    for (const json& c : tc) {
        const std::string id = c["id"];
        EXPECT_EQ(id.size(), 9u) << id;
        EXPECT_EQ(id.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"), std::string::npos) << id;
    }
    EXPECT_NE(tc[0]["id"], tc[1]["id"]);

    const StreamedChat sc = streamed_chat(post(srv.port(), "/v1/chat/completions", request(calls, true)).raw);
    EXPECT_EQ(sc.content, "Sure. ");
    ASSERT_EQ(sc.calls.size(), 2u);
    EXPECT_EQ(sc.calls[1]["function"], tc[1]["function"]);
    EXPECT_EQ(sc.calls[1]["id"].get<std::string>().size(), 9u);
    EXPECT_EQ(sc.finish, "tool_calls");
    const StreamedChat text = streamed_chat(post(srv.port(), "/v1/chat/completions", request("It is [sunny].", true)).raw);
    EXPECT_EQ(text.content, "It is [sunny].");
    EXPECT_TRUE(text.calls.empty());

    // The calls and their results in the next turn, by id; an id of another length is refused.
    json more = ask;
    json entries = json::array();
    for (const json& c : tc) entries.push_back({{"id", c["id"]}, {"type", "function"}, {"function", c["function"]}});
    more.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", entries}});
    more.push_back({{"role", "tool"}, {"tool_call_id", tc[0]["id"]}, {"content", "{\"temp\": 21}"}});
    more.push_back({{"role", "tool"}, {"tool_call_id", tc[1]["id"]}, {"content", "{\"temp\": 3}"}});
    const Reply next = post(srv.port(), "/v1/chat/completions",
                            {{"messages", more}, {"tools", tools}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_EQ(next.status, 200) << next.raw;
    EXPECT_GT(next.body["usage"]["prompt_tokens"].get<int>(), r.body["usage"]["prompt_tokens"].get<int>());
    more[2]["tool_call_id"] = "call_1";
    const Reply bad_id = post(srv.port(), "/v1/chat/completions", {{"messages", more}, {"tools", tools}});
    EXPECT_EQ(bad_id.status, 400) << bad_id.raw;
    EXPECT_NE(bad_id.body["error"]["message"].get<std::string>().find("\"call_1\" is not 9 characters"), std::string::npos)
        << bad_id.raw;
    more[2]["tool_call_id"] = 7;
    const Reply not_string = post(srv.port(), "/v1/chat/completions", {{"messages", more}, {"tools", tools}});
    EXPECT_EQ(not_string.status, 400) << not_string.raw;
    EXPECT_NE(not_string.raw.find("tool_call_id must be a string"), std::string::npos) << not_string.raw;
    EXPECT_EQ(srv.stop(), 0);
}

// Qwen3's thinking: chat_template_kwargs enable_thinking false closes an empty think block in the
// prompt (a template with Qwen3's switch); serve --reasoning-parser qwen3 gives a reply's
// <think>...</think> part as reasoning_content, whole and streamed (its tags split over several
// tokens here, so the stream holds them back), the rest as content; a reply without it, or cut
// short inside it; replies continued in the reasoning and in the content; refusals for unknown
// kwargs and parsers.
TEST_F(Serve, ThinkingAndReasoningContent) {
    json cfg = json::parse(read_file(model_.file("tokenizer_config.json")));
    cfg["chat_template"] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
        "'\\n'}}{% endfor %}{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n' }}\n    {%- if "
        "enable_thinking is defined and enable_thinking is false %}\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    "
        "{%- endif %}\n{%- endif %}";
    write_file(model_.file("tokenizer_config.json"), cfg.dump());
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512 --reasoning-parser qwen3",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json ask = json::array({{{"role", "user"}, {"content", "Where?"}}});
    const Reply on = post(srv.port(), "/tokenize", {{"messages", ask}});
    const Reply off = post(srv.port(), "/tokenize", {{"messages", ask}, {"chat_template_kwargs", {{"enable_thinking", false}}}});
    ASSERT_EQ(off.status, 200) << off.raw;
    EXPECT_GT(off.body["count"].get<int>(), on.body["count"].get<int>());
    struct Case {
        std::string reply;
        json reasoning, content;
    };
    const std::vector<Case> cases = {{"<think>\nLet me see.\n</think>\n\nIn Eden.", "\nLet me see.\n", "\n\nIn Eden."},
                                     {"In Eden.", nullptr, "In Eden."},
                                     {" <think>cut short", "cut short", nullptr},
                                     {"<thin", nullptr, "<thin"}};
    for (const Case& c : cases) expect_reasoning_parts(srv.port(), {{"messages", ask}}, c.reply, c.reasoning, c.content);
    // A reply continued (continue_final_message) goes on in the final message's reasoning when
    // that leaves a <think> open, else in its content, where a <think> is text.
    auto continued = [&](const std::string& so_far) {
        json m = ask;
        m.push_back({{"role", "assistant"}, {"content", so_far}});
        return json{{"messages", m}, {"continue_final_message", true}, {"add_generation_prompt", false}};
    };
    expect_reasoning_parts(srv.port(), continued("<think>\nLet me"), " see.</think>In Eden.", " see.", "In Eden.");
    expect_reasoning_parts(srv.port(), continued("Well,"), " <think>no</think>", nullptr, " <think>no</think>");
    const Reply bad = post(srv.port(), "/v1/chat/completions", {{"messages", ask}, {"chat_template_kwargs", {{"thinking", true}}}});
    EXPECT_EQ(bad.status, 400);
    EXPECT_NE(bad.raw.find("\\\"thinking\\\" is not supported"), std::string::npos) << bad.raw;
    const Reply type = post(srv.port(), "/v1/chat/completions", {{"messages", ask}, {"chat_template_kwargs", {{"enable_thinking", 0}}}});
    EXPECT_EQ(type.status, 400) << type.raw;
    const Reply compl_ = post(srv.port(), "/v1/completions", {{"prompt", "x"}, {"chat_template_kwargs", json::object()}});
    EXPECT_EQ(compl_.status, 400) << compl_.raw;
    EXPECT_EQ(srv.stop(), 0);
    // Without the parser the reply is all content, and there is no reasoning_content.
    Server plain(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512", logs_.file("plain.log"));
    ASSERT_GT(plain.port(), 0) << plain.read_all();
    const Reply r = post(plain.port(), "/v1/chat/completions",
                         {{"messages", ask}, {"max_tokens", 100}, {"temperature", 0}, {"guided_choice", {cases[0].reply}}});
    ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], cases[0].reply);
    EXPECT_FALSE(r.body["choices"][0]["message"].contains("reasoning_content"));
    const CommandResult flag = run_command(kCli + " serve --model " + model_.path() + " --reasoning-parser granite");
    EXPECT_NE(flag.exit_code, 0);
    EXPECT_NE(flag.err.find("--reasoning-parser \"granite\" is not supported (qwen3, deepseek_r1)"), std::string::npos)
        << flag.err;
}

// DeepSeek R1's template opens the reasoning in the prompt, so under --reasoning-parser
// deepseek_r1 a reply reasons from its start (after a <think> of its own, if any) to </think>,
// and is all reasoning without one (vLLM's parser); whole and streamed (the tags split over
// several tokens here, so the stream holds them back) give the same parts; so do continued replies.
TEST_F(Serve, DeepSeekR1Reasoning) {
    use_chat_template(SHARDLM_SOURCE_DIR "/tests/tokenizer/templates/deepseek_r1.jinja");
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 512 --reasoning-parser deepseek_r1",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json ask = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Where?"}}});
    struct Case {
        std::string reply;
        json reasoning, content;
    };
    const std::vector<Case> cases = {{"Let me see.\n</think>\n\nIn Eden.", "Let me see.\n", "\n\nIn Eden."},
                                     {"<think>\nHm.</think>East.", "\nHm.", "East."},
                                     {"cut short <thi", "cut short <thi", nullptr},
                                     {"</think>Eden.", nullptr, "Eden."}};  // empty: null
    for (const Case& c : cases) expect_reasoning_parts(srv.port(), {{"messages", ask}}, c.reply, c.reasoning, c.content);
    // A continued reply is not all reasoning: it goes on in the final message's content, or in
    // the reasoning that message left open. The template drops a closed think block from a reply,
    // so such a reply cannot be continued (transformers raises too).
    auto continued = [&](const std::string& so_far) {
        json m = ask;
        m.push_back({{"role", "assistant"}, {"content", so_far}});
        return json{{"messages", m}, {"continue_final_message", true}, {"add_generation_prompt", false}};
    };
    expect_reasoning_parts(srv.port(), continued("Well,"), " in Eden.", nullptr, " in Eden.");
    const Reply closed = post(srv.port(), "/v1/chat/completions", continued("<think>\nHm.</think>It is"));
    EXPECT_EQ(closed.status, 400) << closed.raw;
    EXPECT_NE(closed.raw.find("(deepseek) does not write the final message's content as it is given"), std::string::npos)
        << closed.raw;
    expect_reasoning_parts(srv.port(), continued("<think>\nLet me"), " see.</think>Eden.", " see.", "Eden.");
    EXPECT_EQ(srv.stop(), 0);
}

// Structured output after reasoning (vLLM's, under a reasoning parser): with single-token <think>
// and </think> (two of the shipped tokenizer's last merges turned into added tokens here) a
// response_format reply may open with <think> and is held to JSON only after </think>; a logit
// bias opens and closes it at once. Without the parser the same bias cannot open it. A continued
// reply is held to JSON from its first token, or after the </think> of the reasoning it is in.
TEST_F(Serve, StructuredOutputAfterReasoning) {
    json t = json::parse(read_file(model_.file("tokenizer.json")));
    json& vocab = t["model"]["vocab"];
    json& merges = t["model"]["merges"];
    ASSERT_EQ(vocab["asm"], 3070);
    ASSERT_EQ(vocab["cy"], 3071);
    ASSERT_EQ(merges[merges.size() - 2], "as m");
    vocab.erase("asm");
    vocab.erase("cy");
    merges.erase(merges.size() - 1);
    merges.erase(merges.size() - 1);
    for (const auto& [id, tag] : {std::pair<int, const char*>{3070, "<think>"}, {3071, "</think>"}})
        t["added_tokens"].push_back({{"id", id}, {"content", tag}, {"single_word", false}, {"lstrip", false},
                                     {"rstrip", false}, {"normalized", false}, {"special", false}});
    write_file(model_.file("tokenizer.json"), t.dump());
    const json ask = json::array({{{"role", "user"}, {"content", "Where?"}}});
    const json req = {{"messages", ask}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", true},
                      {"response_format", {{"type", "json_object"}}}, {"logit_bias", {{"3070", 50}, {"3071", 100}}}};
    for (const bool parser : {true, false}) {
        Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256" +
                       (parser ? " --reasoning-parser qwen3" : ""),
                   logs_.file(parser ? "serve.log" : "plain.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        const Reply r = post(srv.port(), "/v1/chat/completions", req);
        ASSERT_EQ(r.status, 200) << r.raw;
        const json& choice = r.body["choices"][0];
        const json& lps = choice["logprobs"]["content"];
        ASSERT_GE(lps.size(), 3u) << r.raw;
        const std::string content = choice["message"]["content"];
        if (parser) {
            EXPECT_EQ(lps[0]["token"], "<think>") << r.raw;
            EXPECT_EQ(lps[1]["token"], "</think>") << r.raw;
            EXPECT_TRUE(choice["message"]["reasoning_content"].is_null()) << r.raw;  // nothing between the tags
        } else {
            EXPECT_NE(lps[0]["token"], "<think>") << r.raw;
        }
        EXPECT_EQ(content.substr(0, 1), "{") << r.raw;
        if (parser) {
            // A reply continued in its content is held to JSON from its first token; one continued
            // inside its reasoning may close it first, and is held to JSON after that.
            for (const bool thinking : {false, true}) {
                json cont = req;
                cont["messages"].push_back({{"role", "assistant"}, {"content", thinking ? "<think>\nLet" : "Here:"}});
                cont["continue_final_message"] = true;
                cont["add_generation_prompt"] = false;
                const Reply c = post(srv.port(), "/v1/chat/completions", cont);
                ASSERT_EQ(c.status, 200) << c.raw;
                const json& m = c.body["choices"][0];
                EXPECT_EQ(m["logprobs"]["content"][0]["token"], thinking ? "</think>" : "{") << c.raw;
                EXPECT_EQ(m["message"]["content"].get<std::string>().substr(0, 1), "{") << c.raw;
                EXPECT_TRUE(m["message"]["reasoning_content"].is_null()) << c.raw;
            }
        }
        EXPECT_EQ(srv.stop(), 0);
    }
}

// HTTPS with an API key: a self-signed certificate made here (openssl); every route but /health
// and /metrics answers 401 without the key or with a wrong one, and serves with it.
TEST_F(Serve, HttpsWithAnApiKey) {
    // A TLS write to a connection the peer has closed raises SIGPIPE (OpenSSL writes with write()).
    ::signal(SIGPIPE, SIG_IGN);
    const std::string cert = logs_.file("cert.pem"), key = logs_.file("key.pem");
    const CommandResult mk = run_command("openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -keyout " +
                                         key + " -out " + cert);
    ASSERT_EQ(mk.exit_code, 0) << mk.err;
    Server srv(kCli + " serve --model " + model_.path() + " --threads 1 --ctx 64 --api-key s3cret --ssl-certfile " +
                   cert + " --ssl-keyfile " + key,
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    EXPECT_NE(srv.read_all().find("listening on https://"), std::string::npos) << srv.read_all();
    httplib::SSLClient c("127.0.0.1", srv.port());
    c.enable_server_certificate_verification(false);  // self-signed
    c.set_read_timeout(120, 0);
    const std::string body = json{{"prompt", "And God said"}, {"max_tokens", 3}, {"temperature", 0}}.dump();
    for (const char* auth : {"", "Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret"}) {
        httplib::Headers h;
        if (*auth) h.emplace("Authorization", auth);
        const auto r = c.Post("/v1/completions", h, body, "application/json");
        ASSERT_TRUE(r) << auth << ": " << httplib::to_string(r.error());
        EXPECT_EQ(r->status, 401) << auth;
        EXPECT_EQ(json::parse(r->body)["error"]["code"], 401) << r->body;
        const auto m = c.Get("/v1/models", h);
        ASSERT_TRUE(m);
        EXPECT_EQ(m->status, 401) << auth;
    }
    for (const char* open_path : {"/health", "/metrics"}) {
        const auto r = c.Get(open_path);
        ASSERT_TRUE(r) << open_path;
        EXPECT_EQ(r->status, 200) << open_path;
    }
    for (const char* auth : {"Bearer s3cret", "bearer  s3cret "}) {
        const auto r = c.Post("/v1/completions", {{"Authorization", auth}}, body, "application/json");
        ASSERT_TRUE(r) << auth;
        ASSERT_EQ(r->status, 200) << auth << ": " << r->body;
        EXPECT_EQ(json::parse(r->body)["choices"][0]["text"],
                  generate_text(model_.path(), "--prompt 'And God said' --max-new-tokens 3"));
    }
    // A streamed request whose client leaves after its first event: the server goes on serving.
    size_t events = 0;
    const json streamed = {{"prompt", "And God said"}, {"max_tokens", 40}, {"stream", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Authorization", "Bearer s3cret"}, {"Content-Type", "application/json"}};
    req.body = streamed.dump();
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++events < 2; };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    c.send(req, res, err);
    EXPECT_GE(events, 1u);
    const auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(health->status, 200);
    // Plain HTTP to the HTTPS port gets no answer.
    httplib::Client plain("127.0.0.1", srv.port());
    plain.set_read_timeout(5, 0);
    const auto r = plain.Get("/health");
    EXPECT_TRUE(!r || r->status != 200);
    EXPECT_EQ(srv.stop(), 0);
}

// --cache-save-every: the server writes --cache-file while it serves, once requests have ended, so
// a server killed with SIGKILL (no shutdown write) still leaves the conversations it had: the next
// server's turn on one of them loads it. Its bad values are refused naming the flag.
TEST_F(Serve, CacheSaveEveryWritesWhileServing) {
    const std::string a = "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
                          "and darkness was upon the face of the deep.",
                      b = "And God called the light Day, and the darkness he called Night.";
    const std::string file = logs_.file("live.kv"), base = kCli + " serve --model " + model_.path() +
                                                            " --ctx 256 --batch 1 --threads 1 --cache-ram 16 --cache-file " + file;
    auto ask = [&](int port, const std::string& p) {
        const Reply r = post(port, "/v1/completions", {{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}});
        EXPECT_EQ(r.status, 200) << r.raw;
        return r;
    };
    // Waits up to 60 s for `what` in the server's stderr.
    auto wait_for = [](const Server& srv, const std::string& what) {
        for (int i = 0; i < 1200 && srv.read_all().find(what) == std::string::npos; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        return srv.read_all().find(what) != std::string::npos;
    };
    std::string a1;
    int a_prompt = 0;
    {
        Server srv(base + " --cache-save-every 0.1", logs_.file("live.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        const Reply r = ask(srv.port(), a);
        ASSERT_EQ(r.status, 200);
        a1 = r.body["choices"][0]["text"];
        a_prompt = r.body["usage"]["prompt_tokens"];
        EXPECT_TRUE(wait_for(srv, "--cache-file " + file + ": 1 prefix, ")) << srv.read_all();
        ASSERT_EQ(ask(srv.port(), b).status, 200);  // a goes to the tier, b is in the slot
        EXPECT_TRUE(wait_for(srv, "--cache-file " + file + ": 2 prefixes, ")) << srv.read_all();
    }  // SIGKILL: no write at shutdown
    {
        Server srv(base, logs_.file("after.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        EXPECT_NE(srv.read_all().find("--cache-file " + file + ": 2 prefixes, "), std::string::npos) << srv.read_all();
        const Reply r = ask(srv.port(), a + a1 + " And God said");
        ASSERT_EQ(r.status, 200);
        EXPECT_GE(r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), a_prompt) << r.raw;
        EXPECT_EQ(srv.stop(), 0);
    }
    {  // Two ranks write their files at the same step.
        const std::string tp = logs_.file("tp.kv");
        Server srv(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " + kCli +
                       " serve --model " + model_.path() + " --ctx 256 --batch 1 --cache-ram 16 --cache-file " + tp +
                       " --cache-save-every 0.1",
                   logs_.file("tp.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        ASSERT_EQ(ask(srv.port(), a).status, 200);
        EXPECT_TRUE(wait_for(srv, "--cache-file " + tp + ": 1 prefix, ")) << srv.read_all();
        EXPECT_TRUE(std::filesystem::exists(tp + ".rank1"));
        EXPECT_EQ(std::filesystem::file_size(tp), std::filesystem::file_size(tp + ".rank1"));
    }
    const std::string flags = kCli + " serve --model " + model_.path() + " --threads 1 --ctx 64 --port 0 --cache-ram 8 ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--cache-save-every 5", "--cache-save-every writes --cache-file while serving: it needs --cache-file"},
        {"--cache-file " + file + " --cache-save-every -1", "--cache-save-every must be in [0, 1e9] seconds"},
        {"--cache-file " + file + " --cache-save-every nan", "--cache-save-every must be in [0, 1e9] seconds"},
    };
    for (const auto& [f, want] : cases) {
        const CommandResult r = run_command(flags + f);
        EXPECT_NE(r.exit_code, 0) << f;
        EXPECT_NE(r.err.find(want), std::string::npos) << f << ": " << r.err;
    }
}

// The TLS and key flags' bad values: one line naming the flag or file, before the model loads.
TEST_F(Serve, BadTlsAndKeyFlagsAreRefused) {
    const std::string base = kCli + " serve --model " + model_.path() + " --threads 1 --ctx 64 --port 0 ";
    const std::string missing = logs_.file("nope.pem"), junk = logs_.file("junk.pem");
    write_file(junk, "not a certificate\n");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--api-key ''", "--api-key must not be empty"},
        {"--ssl-certfile " + junk, "--ssl-certfile and --ssl-keyfile go together"},
        {"--ssl-certfile " + missing + " --ssl-keyfile " + junk, "--ssl-certfile: cannot read " + missing},
        {"--ssl-certfile " + junk + " --ssl-keyfile " + junk, "cannot use the TLS certificate " + junk},
    };
    for (const auto& [flags, want] : cases) {
        const CommandResult r = run_command(base + flags);
        EXPECT_NE(r.exit_code, 0) << flags;
        EXPECT_NE(r.err.find(want), std::string::npos) << flags << ": " << r.err;
    }
}

// The prefix cache's host tier (--cache-ram): two conversations through one slot (--batch 1),
// taking turns. When one takes the slot, what the other left there is saved to host memory; its
// next turn loads it back and prefills only the rest: its cached tokens cover at least its earlier
// prompt, where a server without the tier finds the other conversation in the slot and caches
// nothing; the texts are the same. Two ranks (each saving its own KV heads) answer alike.
// /metrics counts the saves and loads. Bad --cache-ram values are refused naming the flag.
TEST_F(Serve, HostTierKeepsConversationsPastTheSlots) {
    const std::string a = "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
                          "and darkness was upon the face of the deep.",
                      b = "And God called the light Day, and the darkness he called Night. And the evening and the "
                          "morning were the first day.";
    struct Turns {
        std::vector<std::string> text;
        std::vector<int> prompt, cached;
    };
    auto turns = [&](int port) {
        Turns t;
        auto ask = [&](const std::string& p) {
            const Reply r = post(port, "/v1/completions", {{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}});
            EXPECT_EQ(r.status, 200) << r.raw;
            if (r.status != 200) return std::string();
            t.text.push_back(r.body["choices"][0]["text"]);
            t.prompt.push_back(r.body["usage"]["prompt_tokens"]);
            t.cached.push_back(r.body["usage"]["prompt_tokens_details"]["cached_tokens"]);
            return t.text.back();
        };
        const std::string a1 = ask(a), b1 = ask(b);
        ask(a + a1 + " And God said");
        ask(b + b1 + " And God saw");
        return t;
    };
    const std::string base = " serve --model " + model_.path() + " --ctx 256 --batch 1";
    Turns slots, tier, tp;
    {
        Server srv(kCli + base + " --threads 1", logs_.file("slots.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        slots = turns(srv.port());
        EXPECT_EQ(srv.stop(), 0);
    }
    {
        Server srv(kCli + base + " --threads 1 --cache-ram 16", logs_.file("tier.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        tier = turns(srv.port());
        // The startup line sizes the tier: the positions that 16 MiB holds.
        const std::string log = srv.read_all();
        const size_t at = log.find(", --cache-ram: ");
        ASSERT_NE(at, std::string::npos) << log;
        long long positions = 0, bytes = 0;
        ASSERT_EQ(std::sscanf(log.c_str() + at, ", --cache-ram: %lld positions of %lld bytes", &positions, &bytes), 2) << log;
        EXPECT_EQ(positions, (16ll << 20) / bytes);
        EXPECT_GT(positions, 100);
        httplib::Client mc("127.0.0.1", srv.port());
        const auto m = mc.Get("/metrics");
        ASSERT_TRUE(m);
        auto value = [&](const std::string& name) { return metric_value(m->body, name); };
        // a saved when b took the slot, b when a's next turn did, that turn when b's next did.
        EXPECT_EQ(value("shardlm_prefix_cache_host_transfers_total{direction=\"save\"}"), 3);
        EXPECT_EQ(value("shardlm_prefix_cache_host_transfers_total{direction=\"load\"}"), 2);
        EXPECT_GT(value("shardlm_prefix_cache_host_bytes"), 0);
        EXPECT_LE(value("shardlm_prefix_cache_host_bytes"), 16 << 20);
        EXPECT_GT(value("shardlm_prefix_cache_host_tokens_total"), 0);
        EXPECT_LE(value("shardlm_prefix_cache_host_tokens_total"), tier.cached[2] + tier.cached[3]);
        EXPECT_EQ(srv.stop(), 0);
    }
    {
        Server srv(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " +
                       kCli + base + " --cache-ram 16 --cache-file " + logs_.file("tp.kv"),
                   logs_.file("tp.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        tp = turns(srv.port());
        EXPECT_EQ(srv.stop(true), 0) << srv.read_all();
        // Each rank wrote its own heads' file at shutdown.
        EXPECT_TRUE(std::filesystem::exists(logs_.file("tp.kv"))) << srv.read_all();
        EXPECT_TRUE(std::filesystem::exists(logs_.file("tp.kv.rank1"))) << srv.read_all();
        EXPECT_EQ(std::filesystem::file_size(logs_.file("tp.kv")), std::filesystem::file_size(logs_.file("tp.kv.rank1")));
    }
    // --cache-file: the first turns on one server, the next ones on another started after it ended
    // (what the slot held at shutdown was saved too).
    Turns restarted;
    const std::string file = logs_.file("prefixes.kv");
    for (int run = 0; run < 2; ++run) {
        Server srv(kCli + base + " --threads 1 --cache-ram 16 --cache-file " + file, logs_.file("file.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        auto ask = [&](const std::string& p) {
            const Reply r = post(srv.port(), "/v1/completions", {{"prompt", p}, {"max_tokens", 6}, {"temperature", 0}});
            EXPECT_EQ(r.status, 200) << r.raw;
            if (r.status != 200) return;
            restarted.text.push_back(r.body["choices"][0]["text"]);
            restarted.prompt.push_back(r.body["usage"]["prompt_tokens"]);
            restarted.cached.push_back(r.body["usage"]["prompt_tokens_details"]["cached_tokens"]);
        };
        if (run == 0) {
            ask(a);
            ask(b);
        } else if (restarted.text.size() == 2) {
            ask(a + restarted.text[0] + " And God said");
            ask(b + restarted.text[1] + " And God saw");
        }
        EXPECT_EQ(srv.stop(), 0);
        const std::string log = srv.read_all();
        EXPECT_NE(log.find(run == 0 ? "--cache-file " + file + ": no file yet" : "--cache-file " + file + ": 2 prefixes, "),
                  std::string::npos) << log;
        EXPECT_NE(log.find(" saved"), std::string::npos) << log;
    }
    ASSERT_EQ(restarted.text.size(), 4u);
    EXPECT_EQ(restarted.text, tier.text);
    for (size_t i = 2; i < 4; ++i) EXPECT_GE(restarted.cached[i], restarted.prompt[i - 2]) << i;
    ASSERT_EQ(slots.text.size(), 4u);
    ASSERT_EQ(tier.text.size(), 4u);
    ASSERT_EQ(tp.text.size(), 4u);
    EXPECT_EQ(tier.text, slots.text);
    EXPECT_EQ(tp.text, tier.text);
    EXPECT_EQ(tp.cached, tier.cached);
    for (size_t i = 2; i < 4; ++i) {
        EXPECT_LT(slots.cached[i], 4) << i;  // the other conversation's start, at most
        EXPECT_GE(tier.cached[i], tier.prompt[i - 2]) << i;
    }
    const std::string flags = kCli + " serve --model " + model_.path() + " --threads 1 --ctx 64 --port 0 ";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--cache-ram -1", "--cache-ram must be in [0, 2^40] MiB"},
        {"--cache-ram 8 --no-prefix-cache", "--cache-ram is the prefix cache's host tier: not with --no-prefix-cache"},
        {"--cache-ram 8 --embeddings", "--cache-ram applies to text generation, not to --embeddings"},
        {"--cache-ram 1099511627776", "--cache-ram 1099511627776 MiB is more than this rank's part of the host memory"},
        {"--cache-file " + logs_.file("x.kv"), "--cache-file keeps the host tier across restarts: it needs --cache-ram above 0"},
        {"--cache-ram 8 --cache-file " + logs_.file("no/such/x.kv"), "--cache-file: cannot write " + logs_.file("no/such/x.kv")},
    };
    for (const auto& [f, want] : cases) {
        const CommandResult r = run_command(flags + f);
        EXPECT_NE(r.exit_code, 0) << f;
        EXPECT_NE(r.err.find(want), std::string::npos) << f << ": " << r.err;
    }
}

// A step that fails (the test hook makes the engine throw) ends the server with the error on
// stderr and a non-zero status; the client waiting on it gets a 503 rather than a hung connection.
TEST_F(Serve, AFailingStepEndsTheServerWithItsError) {
    Server srv("env SHARDLM_FAIL_RANK=0 SHARDLM_FAIL_PHASE=forward " + kCli + " serve --model " + model_.path() +
                   " --threads 1 --ctx 64",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const Reply r = post(srv.port(), "/v1/completions", {{"prompt", "And God said"}, {"max_tokens", 4}});
    EXPECT_EQ(r.status, 503) << r.raw;
    EXPECT_EQ(srv.stop(), 1);
    EXPECT_NE(srv.read_all().find("shardlm: error:"), std::string::npos) << srv.read_all();
}

// serve --embeddings: /v1/embeddings gives shardlm embed's vectors (mean pooling, normalized and
// the default prompt before each text, as the folder's sentence-transformers files say), for
// requests that come together (their inputs share the slots), with dimensions, base64 and
// normalize false; bad requests and the text routes are refused, and a text server refuses it.
TEST_F(Serve, EmbeddingsAreEmbedsVectors) {
    std::filesystem::create_directories(model_.file("1_Pooling"));
    write_file(model_.file("modules.json"),
               R"([{"type":"sentence_transformers.models.Transformer","path":""},
                   {"type":"sentence_transformers.models.Pooling","path":"1_Pooling"},
                   {"type":"sentence_transformers.models.Normalize","path":"2_Normalize"}])");
    write_file(model_.file("1_Pooling/config.json"), R"({"pooling_mode_mean_tokens":true})");
    write_file(model_.file("config_sentence_transformers.json"),
               R"({"prompts":{"query":"Query: ","document":"Doc: "},"default_prompt_name":"query"})");
    auto embed_cli = [&](const std::string& flags) {
        const CommandResult r = run_command(kCli + " embed --model " + model_.path() + " --json --threads 1 " + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        std::vector<std::vector<float>> v;
        const json out = json::parse(r.out);
        for (const json& d : out["data"]) v.push_back(d["embedding"].get<std::vector<float>>());
        return v;
    };
    const std::vector<std::string> texts = {"In the beginning God created", "And the LORD said", "Behold"};
    const auto want = embed_cli("--prompt '" + texts[0] + "' --prompt '" + texts[1] + "' --prompt '" + texts[2] + "'");
    ASSERT_EQ(want.size(), 3u);
    auto close = [](const json& got, const std::vector<float>& w) {
        return max_abs_diff(got.get<std::vector<float>>(), w) < 1e-4;
    };
    {
        Server text(kCli + " serve --model " + model_.path() + " --batch 1 --ctx 64 --threads 1", logs_.file("text.log"));
        ASSERT_GT(text.port(), 0) << text.read_all();
        const Reply r = post(text.port(), "/v1/embeddings", {{"input", "Behold"}});
        EXPECT_EQ(r.status, 400);
        EXPECT_NE(r.raw.find("--embeddings"), std::string::npos) << r.raw;
    }
    Server srv(kCli + " serve --model " + model_.path() + " --embeddings --batch 2 --ctx 64 --prefill-chunk 4 --threads 1",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    EXPECT_NE(srv.read_all().find("embeddings, mean pooling"), std::string::npos) << srv.read_all();
    const int port = srv.port();
    // Three requests at once: a list of two texts, one text, and the third text's ids.
    const std::vector<int32_t> ids = json::parse(run_command(kCli + " tokenize --model " + model_.path() +
                                                             " --json --text 'Query: Behold'").out)["ids"];
    std::vector<Reply> replies(3);
    const std::vector<json> bodies = {{{"input", {texts[0], texts[1]}}, {"model", model_.path().substr(model_.path().find_last_of('/') + 1)}},
                                      {{"input", texts[2]}},
                                      {{"input", ids}}};
    std::vector<std::thread> clients;
    for (size_t i = 0; i < 3; ++i) clients.emplace_back([&, i] { replies[i] = post(port, "/v1/embeddings", bodies[i]); });
    for (auto& t : clients) t.join();
    for (const Reply& r : replies) ASSERT_EQ(r.status, 200) << r.raw;
    EXPECT_EQ(replies[0].body["object"], "list");
    ASSERT_EQ(replies[0].body["data"].size(), 2u);
    EXPECT_EQ(replies[0].body["data"][1]["index"], 1);
    EXPECT_EQ(replies[0].body["data"][1]["object"], "embedding");
    EXPECT_TRUE(close(replies[0].body["data"][0]["embedding"], want[0]));
    EXPECT_TRUE(close(replies[0].body["data"][1]["embedding"], want[1]));
    EXPECT_TRUE(close(replies[1].body["data"][0]["embedding"], want[2]));
    EXPECT_TRUE(close(replies[2].body["data"][0]["embedding"], want[2]));
    EXPECT_EQ(replies[2].body["usage"]["prompt_tokens"], ids.size());
    EXPECT_EQ(replies[2].body["usage"]["total_tokens"], ids.size());

    // dimensions: the first 8, normalized again; normalize false: the pooled state as it is.
    const Reply cut = post(port, "/v1/embeddings", {{"input", texts[0]}, {"dimensions", 8}});
    ASSERT_EQ(cut.status, 200) << cut.raw;
    EXPECT_TRUE(close(cut.body["data"][0]["embedding"], embed_cli("--prompt '" + texts[0] + "' --dimensions 8")[0]));
    const Reply raw = post(port, "/v1/embeddings", {{"input", texts[0]}, {"normalize", false}});
    ASSERT_EQ(raw.status, 200) << raw.raw;
    EXPECT_TRUE(close(raw.body["data"][0]["embedding"], embed_cli("--prompt '" + texts[0] + "' --no-normalize")[0]));
    // base64: the float32 bytes, little-endian.
    const Reply b64 = post(port, "/v1/embeddings", {{"input", texts[0]}, {"encoding_format", "base64"}});
    ASSERT_EQ(b64.status, 200) << b64.raw;
    const std::string enc = b64.body["data"][0]["embedding"];
    const std::string k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string bytes;
    for (size_t i = 0; i + 3 < enc.size(); i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (size_t j = 0; j < 4; ++j) {
            v <<= 6;
            if (enc[i + j] == '=') ++pad;
            else v |= uint32_t(k.find(enc[i + j]));
        }
        for (int j = 0; j < 3 - pad; ++j) bytes += char(v >> (16 - 8 * j) & 0xff);
    }
    ASSERT_EQ(bytes.size(), want[0].size() * 4);
    std::vector<float> decoded(want[0].size());
    std::memcpy(decoded.data(), bytes.data(), bytes.size());
    EXPECT_LT(max_abs_diff(decoded, want[0]), 1e-4);

    // /score and /rerank: cosines of the query's embedding (its "query" prompt) and the documents'
    // ("document" prompt), the most relevant first; top_n, return_documents.
    const auto docs = embed_cli("--prompt-name document --prompt '" + texts[0] + "' --prompt '" + texts[1] + "' --prompt '" +
                                texts[2] + "'");
    const auto query = embed_cli("--prompt-name query --prompt 'Behold'")[0];
    std::vector<double> cos;
    for (const auto& dv : docs) {
        double dot = 0;
        for (size_t h = 0; h < dv.size(); ++h) dot += double(dv[h]) * query[h];
        cos.push_back(dot);
    }
    const Reply score = post(port, "/score", {{"text_1", "Behold"}, {"text_2", texts}});
    ASSERT_EQ(score.status, 200) << score.raw;
    ASSERT_EQ(score.body["data"].size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(score.body["data"][i]["index"], i);
        EXPECT_NEAR(score.body["data"][i]["score"].get<double>(), cos[i], 1e-4) << i;
    }
    const Reply paired = post(port, "/v1/score", {{"text_1", {"Behold", "Behold"}}, {"text_2", {texts[1], texts[2]}}});
    ASSERT_EQ(paired.status, 200) << paired.raw;
    EXPECT_NEAR(paired.body["data"][1]["score"].get<double>(), cos[2], 1e-4);
    std::vector<size_t> best = {0, 1, 2};
    std::sort(best.begin(), best.end(), [&](size_t a, size_t b) { return cos[a] > cos[b]; });
    const Reply rr = post(port, "/v1/rerank", {{"query", "Behold"}, {"documents", texts}, {"top_n", 2}});
    ASSERT_EQ(rr.status, 200) << rr.raw;
    ASSERT_EQ(rr.body["results"].size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
        EXPECT_EQ(rr.body["results"][k]["index"], best[k]);
        EXPECT_EQ(rr.body["results"][k]["document"]["text"], texts[best[k]]);
        EXPECT_NEAR(rr.body["results"][k]["relevance_score"].get<double>(), cos[best[k]], 1e-4);
    }
    const Reply bare = post(port, "/rerank", {{"query", "Behold"}, {"documents", texts}, {"return_documents", false}});
    ASSERT_EQ(bare.status, 200) << bare.raw;
    EXPECT_EQ(bare.body["results"].size(), 3u);
    EXPECT_FALSE(bare.body["results"][0].contains("document"));

    auto refused = [&](const std::string& path, const json& body, int status, const std::string& needle) {
        const Reply r = post(port, path, body);
        EXPECT_EQ(r.status, status) << r.raw;
        EXPECT_NE(r.raw.find(needle), std::string::npos) << r.raw;
    };
    refused("/v1/embeddings", {{"input", "x"}, {"encoding_format", "int8"}}, 400, "encoding_format");
    refused("/v1/embeddings", {{"input", "x"}, {"dimensions", 0}}, 400, "\\\"dimensions\\\" must be an integer in [1, ");
    refused("/v1/embeddings", {{"input", json::array({json::array(), json::array({1})})}}, 400, "input 0 has no tokens");
    refused("/v1/embeddings", {{"input", std::vector<int>(65, 5)}}, 400, "65 tokens, more than the server's context of 64");
    refused("/v1/embeddings", {{"input", {1, 2}}, {"model", "other"}}, 404, "other");
    refused("/v1/embeddings", {{"input", 5}}, 400, "\\\"input\\\" must be");
    refused("/score", {{"text_1", {"a", "b"}}, {"text_2", {"a", "b", "c"}}}, 400, "as long as each other (2 and 3)");
    refused("/rerank", {{"query", "a"}, {"documents", "b"}}, 400, "\\\"documents\\\" must be a non-empty list of strings");
    refused("/rerank", {{"documents", {"b"}}}, 400, "\\\"query\\\" (a string) is required");
    refused("/rerank", {{"query", "a"}, {"documents", {"b"}}, {"top_n", 0}}, 400, "top_n");
    refused("/v1/completions", {{"prompt", "x"}}, 400, "runs with --embeddings");
    refused("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}}, 400, "runs with --embeddings");
    EXPECT_EQ(srv.stop(), 0) << srv.read_all();
}

#ifdef SHARDLM_MPIEXEC
// Two ranks (tensor parallel): the same completions as one rank, and SIGTERM to mpirun ends both
// (rank 0 stops the server; mpirun itself reports a job it signalled with a non-zero status).
TEST_F(Serve, TwoRanksServeWhatOneServes) {
    Server srv(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " + kCli +
                                              " serve --model " + model_.path() + " --batch 2 --ctx 128 --json-whitespace 0",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    std::vector<Reply> replies(3);
    std::vector<std::thread> clients;
    for (size_t i = 0; i < replies.size(); ++i)
        clients.emplace_back([&, i] {
            replies[i] = post(srv.port(), "/v1/completions",
                              {{"prompt", "And God said"}, {"max_tokens", 8 + int(i)}, {"temperature", 0}});
        });
    for (auto& t : clients) t.join();
    int reused = 0;  // the third request, at least, takes a freed slot that holds the prompt
    for (size_t i = 0; i < replies.size(); ++i) {
        ASSERT_EQ(replies[i].status, 200) << replies[i].raw;
        EXPECT_EQ(replies[i].body["choices"][0]["text"],
                  generate_text(model_.path(), "--prompt 'And God said' --max-new-tokens " + std::to_string(8 + i)));
        reused += replies[i].body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>() > 0;
    }
    EXPECT_GE(reused, 1);
    // Two sampled choices of one request with a logit bias, over two ranks: generate's two
    // copies of the prompt.
    const Reply two = post(srv.port(), "/v1/completions",
                           {{"prompt", {5, 6, 7}}, {"max_tokens", 6}, {"temperature", 0.9}, {"top_k", 40}, {"seed", 4}, {"n", 2},
                            {"logit_bias", {{"9", 3.0}, {"11", -100}}}});
    ASSERT_EQ(two.status, 200) << two.raw;
    const CommandResult g = run_command(kCli + " generate --model " + model_.path() +
                                        " --json --prompt-ids '5,6,7;5,6,7' --max-new-tokens 6 --temperature 0.9 --top-k 40 "
                                        "--top-p 1 --seed 4 --logit-bias 9=3 --logit-bias 11=-100");
    ASSERT_EQ(g.exit_code, 0) << g.err;
    const json gen = json::parse(g.out);
    for (size_t j = 0; j < 2; ++j) EXPECT_EQ(two.body["choices"][j]["text"], gen["results"][j]["text"]) << j;
    // JSON mode, allowed ids and bad words: every rank masks its rows alike (each loads the
    // tokenizer): one rank's texts.
    const json mreq = {{"prompt", "And God said"}, {"max_tokens", 12}, {"temperature", 0.9}, {"seed", 7}, {"n", 3},
                       {"allowed_token_ids", json::array({5, 6, 7, 9, 41, 300, 1200})}, {"bad_words", {"the", "and"}}};
    const Reply tp_masks = post(srv.port(), "/v1/completions", mreq);
    ASSERT_EQ(tp_masks.status, 200) << tp_masks.raw;
    // JSON mode: every rank masks its rows alike (each loads the tokenizer): one rank's texts.
    const json jreq = {{"prompt", "And God said"}, {"max_tokens", 24}, {"temperature", 0.9}, {"seed", 5}, {"n", 3},
                       {"response_format", {{"type", "json_object"}}}};
    const Reply tp_json = post(srv.port(), "/v1/completions", jreq);
    ASSERT_EQ(tp_json.status, 200) << tp_json.raw;
    // ... and a json_schema request: each rank compiles the schema it is sent.
    const std::string sreq = R"({"prompt": "And God said", "max_tokens": 40, "temperature": 0.9, "seed": 6, "n": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": {"type": "object",
        "properties": {"n": {"type": "integer"}, "who": {"enum": ["God", "Moses"]}}, "required": ["n", "who"]}}}})";
    const Reply tp_schema = post_text(srv.port(), "/v1/completions", sreq);
    ASSERT_EQ(tp_schema.status, 200) << tp_schema.raw;
    {
        Server one(kCli + " serve --model " + model_.path() + " --batch 2 --ctx 128 --threads 1 --json-whitespace 0",
                   logs_.file("one.log"));
        ASSERT_GT(one.port(), 0) << one.read_all();
        const Reply one_json = post(one.port(), "/v1/completions", jreq);
        ASSERT_EQ(one_json.status, 200) << one_json.raw;
        EXPECT_EQ(tp_json.body["choices"], one_json.body["choices"]);
        const Reply one_masks = post(one.port(), "/v1/completions", mreq);
        ASSERT_EQ(one_masks.status, 200) << one_masks.raw;
        EXPECT_EQ(tp_masks.body["choices"], one_masks.body["choices"]);
        const Reply one_schema = post_text(one.port(), "/v1/completions", sreq);
        ASSERT_EQ(one_schema.status, 200) << one_schema.raw;
        EXPECT_EQ(tp_schema.body["choices"], one_schema.body["choices"]);
        EXPECT_EQ(tp_schema.body["choices"][0]["text"].get<std::string>().substr(0, 1), "{");
        // --json-whitespace 0: compact JSON, no whitespace outside strings.
        for (const Reply* r : {&tp_json, &tp_schema})
            for (const json& c : r->body["choices"]) {
                const std::string text = c["text"];
                bool in_string = false, escaped = false;
                for (const char ch : text) {
                    if (in_string) {
                        in_string = escaped || ch != '"';
                        escaped = !escaped && ch == '\\';
                    } else {
                        EXPECT_TRUE(ch != ' ' && ch != '\n' && ch != '\t' && ch != '\r') << text;
                        in_string = ch == '"';
                    }
                }
            }
        EXPECT_EQ(tp_json.body["choices"][0]["text"].get<std::string>().substr(0, 1), "{");
        EXPECT_EQ(one.stop(), 0);
    }
    // SIGTERM to rank 0: every rank stops, and so does mpirun, with status 0.
    EXPECT_EQ(srv.stop(true), 0) << srv.read_all();
    EXPECT_NE(srv.read_all().find("shardlm serve: stopped"), std::string::npos) << srv.read_all();
}
// Two ranks serve the embeddings one rank gives.
TEST_F(Serve, TwoRanksServeTheEmbeddingsOfOne) {
    Server srv(std::string(SHARDLM_MPIEXEC) + " --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 " + kCli +
                                              " serve --model " + model_.path() + " --embeddings --batch 2 --ctx 64",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const json body = {{"input", {"In the beginning God created", "And the LORD said", "Behold"}}};
    const Reply tp = post(srv.port(), "/v1/embeddings", body);
    ASSERT_EQ(tp.status, 200) << tp.raw;
    const CommandResult one = run_command(kCli + " embed --model " + model_.path() +
                                          " --json --threads 1 --prompt 'In the beginning God created' --prompt 'And the "
                                          "LORD said' --prompt Behold");
    ASSERT_EQ(one.exit_code, 0) << one.err;
    const json want = json::parse(one.out)["data"];
    for (size_t i = 0; i < 3; ++i)
        EXPECT_LT(max_abs_diff(tp.body["data"][i]["embedding"].get<std::vector<float>>(),
                               want[i]["embedding"].get<std::vector<float>>()),
                  1e-4)
            << i;
    EXPECT_EQ(srv.stop(true), 0) << srv.read_all();
}
#endif

// serve --rerank: /classify gives shardlm classify's probabilities, /score and /rerank its --query
// relevances (a cross-encoder over the pair template), for a classifier checkpoint and for the
// causal LM whose two token rows it holds (--classifier-tokens); the other kinds' routes are refused.
TEST_F(Serve, RerankServesTheClassifiersScores) {
    TempDir cls;
    const std::vector<int32_t> two = json::parse(run_command(kCli + " tokenize --model " + model_.path() +
                                                             " --json --text ' the and'").out)["ids"];
    ASSERT_EQ(two.size(), 2u);
    write_classifier(model_.path(), cls.path(), {"no", "yes"}, checkpoint_rows(model_.path(), "model.embed_tokens.weight", two));
    const std::vector<std::string> docs = {"In the beginning God created", "And the LORD said", "Behold"};
    const std::string query = "Who created the heaven?";
    auto cli = [&](const std::string& flags) {
        const CommandResult r = run_command(kCli + " classify --model " + cls.path() + " --json --threads 1 " + flags);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return json::parse(r.out.empty() ? "{}" : r.out);
    };
    std::string each;
    for (const std::string& d : docs) each += " --prompt '" + d + "'";
    const json scored = cli("--query '" + query + "'" + each), classed = cli(each);
    ASSERT_EQ(scored["data"].size(), 3u);
    {
        Server text(kCli + " serve --model " + model_.path() + " --batch 1 --ctx 64 --threads 1", logs_.file("text.log"));
        ASSERT_GT(text.port(), 0) << text.read_all();
        const Reply r = post(text.port(), "/classify", {{"input", "Behold"}});
        EXPECT_EQ(r.status, 400);
        EXPECT_NE(r.raw.find("start shardlm serve with --rerank"), std::string::npos) << r.raw;
    }
    for (const bool tokens : {false, true}) {
        // The causal LM's token logits score as the classifier's rows do (up to rounding).
        const double tol = tokens ? 1e-3 : 1e-5;
        Server srv(kCli + " serve --rerank --batch 2 --ctx 64 --prefill-chunk 4 --threads 1 --model " +
                       (tokens ? model_.path() + " --classifier-tokens 'Ġthe,Ġand'" : cls.path()),
                   logs_.file(tokens ? "tokens.log" : "rerank.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        EXPECT_NE(srv.read_all().find("classifier of labels"), std::string::npos) << srv.read_all();
        const int port = srv.port();
        const Reply c = post(port, "/classify", {{"input", docs}});
        ASSERT_EQ(c.status, 200) << c.raw;
        ASSERT_EQ(c.body["data"].size(), 3u);
        for (size_t i = 0; i < 3; ++i) {
            EXPECT_EQ(c.body["data"][i]["num_classes"], 2);
            EXPECT_LT(max_abs_diff(c.body["data"][i]["probs"].get<std::vector<float>>(), classed["data"][i]["probs"].get<std::vector<float>>()),
                      tol) << i;
            if (!tokens) {
                EXPECT_EQ(c.body["data"][i]["label"], classed["data"][i]["label"]);
            }
        }
        const Reply sc = post(port, "/v1/score", {{"text_1", query}, {"text_2", docs}});
        ASSERT_EQ(sc.status, 200) << sc.raw;
        for (size_t i = 0; i < 3; ++i)
            EXPECT_NEAR(sc.body["data"][i]["score"].get<double>(), scored["data"][i]["score"].get<double>(), tol) << i;
        const Reply rr = post(port, "/rerank", {{"query", query}, {"documents", docs}, {"top_n", 2}});
        ASSERT_EQ(rr.status, 200) << rr.raw;
        ASSERT_EQ(rr.body["results"].size(), 2u);
        std::vector<size_t> order = {0, 1, 2};
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            return scored["data"][a]["score"].get<double>() > scored["data"][b]["score"].get<double>();
        });
        for (size_t k = 0; k < 2; ++k) {
            EXPECT_EQ(rr.body["results"][k]["index"], order[k]) << k;
            EXPECT_EQ(rr.body["results"][k]["document"]["text"], docs[order[k]]);
            EXPECT_NEAR(rr.body["results"][k]["relevance_score"].get<double>(), scored["data"][order[k]]["score"].get<double>(), tol);
        }
        if (!tokens) {
            // truncate_prompt_tokens: an input's last k tokens; a pair's query whole and the
            // document's first tokens (ByteLevel: the pair is query then document).
            auto ids_of = [&](const std::string& t) {
                return json::parse(run_command(kCli + " tokenize --model " + model_.path() + " --json --text '" + t + "'").out)["ids"]
                    .get<std::vector<int32_t>>();
            };
            auto by_ids = [&](const std::vector<int32_t>& ids) {
                std::string list;
                for (const int32_t id : ids) list += (list.empty() ? "" : ",") + std::to_string(id);
                return cli("--prompt-ids " + list)["data"][0];
            };
            const std::vector<int32_t> d0 = ids_of(docs[0]), q = ids_of(query);
            ASSERT_GT(d0.size(), 4u);
            const Reply cut = post(port, "/classify", {{"input", docs[0]}, {"truncate_prompt_tokens", 4}});
            ASSERT_EQ(cut.status, 200) << cut.raw;
            EXPECT_EQ(cut.body["usage"]["prompt_tokens"], 4);
            EXPECT_LT(max_abs_diff(cut.body["data"][0]["probs"].get<std::vector<float>>(),
                                   by_ids(std::vector<int32_t>(d0.end() - 4, d0.end()))["probs"].get<std::vector<float>>()), 1e-5);
            const int64_t k = int64_t(q.size()) + 2;
            const Reply pair = post(port, "/score", {{"text_1", query}, {"text_2", docs[0]}, {"truncate_prompt_tokens", k}});
            ASSERT_EQ(pair.status, 200) << pair.raw;
            std::vector<int32_t> want = q;
            want.insert(want.end(), d0.begin(), d0.begin() + 2);
            EXPECT_NEAR(pair.body["data"][0]["score"].get<double>(), by_ids(want)["probs"][1].get<double>(), 1e-5);
            for (const json& bad : {json(0), json(-2), json(65), json("4")}) {
                const Reply r = post(port, "/classify", {{"input", "Behold"}, {"truncate_prompt_tokens", bad}});
                EXPECT_EQ(r.status, 400) << bad;
                EXPECT_NE(r.raw.find("truncate_prompt_tokens"), std::string::npos) << r.raw;
            }
            const Reply no_room = post(port, "/score", {{"text_1", query}, {"text_2", "x"}, {"truncate_prompt_tokens", 2}});
            EXPECT_EQ(no_room.status, 400);
            EXPECT_NE(no_room.raw.find("leaving the second none"), std::string::npos) << no_room.raw;
        }
        const Reply e = post(port, "/v1/embeddings", {{"input", "Behold"}});
        EXPECT_EQ(e.status, 400);
        EXPECT_NE(e.raw.find("this server runs with --rerank: start shardlm serve with --embeddings"), std::string::npos) << e.raw;
        const Reply t = post(port, "/v1/completions", {{"prompt", "Behold"}});
        EXPECT_EQ(t.status, 400);
        EXPECT_NE(t.raw.find("serves /classify, /score and /rerank"), std::string::npos) << t.raw;
        // /metrics: three requests of 3 inputs each answered; no sequence finished.
        httplib::Client mc("127.0.0.1", port);
        const auto m = mc.Get("/metrics");
        ASSERT_TRUE(m);
        EXPECT_NE(m->body.find(tokens ? "\nshardlm_pooling_requests_total 3\n" : "\nshardlm_pooling_requests_total 5\n"),
                  std::string::npos) << m->body;
        EXPECT_NE(m->body.find(tokens ? "\nshardlm_pooling_inputs_total 9\n" : "\nshardlm_pooling_inputs_total 11\n"),
                  std::string::npos) << m->body;
        EXPECT_NE(m->body.find("\nshardlm_sequences_finished_total{finish_reason=\"stop\"} 0\n"), std::string::npos) << m->body;
    }
    {
        // --rerank-template: /rerank's pairs filled into it, as classify --query fills them.
        const std::string t = "Q: {query} D: {document}";
        Server srv(kCli + " serve --rerank --batch 2 --ctx 64 --threads 1 --model " + cls.path() + " --rerank-template '" + t + "'",
                   logs_.file("template.log"));
        ASSERT_GT(srv.port(), 0) << srv.read_all();
        const json want = cli("--query '" + query + "' --rerank-template '" + t + "'" + each);
        const Reply rr = post(srv.port(), "/rerank", {{"query", query}, {"documents", docs}, {"return_documents", false}});
        ASSERT_EQ(rr.status, 200) << rr.raw;
        ASSERT_EQ(rr.body["results"].size(), 3u);
        for (const json& r : rr.body["results"])
            EXPECT_NEAR(r["relevance_score"].get<double>(), want["data"][r["index"].get<size_t>()]["score"].get<double>(), 1e-5);
        EXPECT_GT(std::abs(rr.body["results"][0]["relevance_score"].get<double>() -
                           scored["data"][rr.body["results"][0]["index"].get<size_t>()]["score"].get<double>()),
                  1e-6);  // the template mattered
        const Reply cut = post(srv.port(), "/rerank", {{"query", query}, {"documents", docs}, {"truncate_prompt_tokens", 8}});
        EXPECT_EQ(cut.status, 400);
        EXPECT_NE(cut.raw.find("truncation does not apply"), std::string::npos) << cut.raw;
    }
    const CommandResult bad = run_command(kCli + " serve --model " + model_.path() + " --rerank --port 0");
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("has no classification head"), std::string::npos) << bad.err;
    const CommandResult both = run_command(kCli + " serve --model " + cls.path() + " --rerank --embeddings");
    EXPECT_NE(both.err.find("--embeddings and --rerank exclude each other"), std::string::npos) << both.err;
}

// The pooling routes interleave requests: a short request sent while a long one runs is answered
// after about two of the long one's inputs (the inputs take the slots in turn), not after all 300:
// its wait is well under half the long request's time (taken in one run, as a ratio), and both get
// their vectors.
TEST_F(Serve, PoolingRequestsTakeTurns) {
    Server srv(kCli + " serve --model " + model_.path() + " --embeddings --batch 1 --ctx 128 --prefill-chunk 2 --threads 1",
               logs_.file("serve.log"));
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const std::string text = "And God said, Let there be light: and there was light. And God saw the light, that it was good.";
    Reply long_reply;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread client([&] { long_reply = post(port, "/v1/embeddings", {{"input", std::vector<std::string>(300, text)}}); });
    // Once the long request's steps run, send the short one.
    httplib::Client mc("127.0.0.1", port);
    double prefilled = 0;
    for (int i = 0; i < 500 && prefilled == 0; ++i) {
        const auto m = mc.Get("/metrics");
        const std::string key = "\nshardlm_engine_prefill_tokens_total ";
        const size_t at = m ? m->body.find(key) : std::string::npos;
        if (at != std::string::npos) prefilled = std::stod(m->body.substr(at + key.size()));
        if (prefilled == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_GT(prefilled, 0);
    const auto t1 = std::chrono::steady_clock::now();
    const Reply short_reply = post(port, "/v1/embeddings", {{"input", "Behold"}});
    const auto t2 = std::chrono::steady_clock::now();
    client.join();
    const double short_s = std::chrono::duration<double>(t2 - t1).count(),
                 long_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(short_s, long_s / 2) << "the short request waited for the long one";
    ASSERT_EQ(short_reply.status, 200) << short_reply.raw;
    ASSERT_EQ(long_reply.status, 200) << long_reply.raw;
    ASSERT_EQ(long_reply.body["data"].size(), 300u);
    EXPECT_EQ(long_reply.body["data"][299]["embedding"], long_reply.body["data"][0]["embedding"]);
    const Reply again = post(port, "/v1/embeddings", {{"input", "Behold"}});
    ASSERT_EQ(again.status, 200);
    EXPECT_LT(max_abs_diff(again.body["data"][0]["embedding"].get<std::vector<float>>(),
                           short_reply.body["data"][0]["embedding"].get<std::vector<float>>()), 1e-6);
}

// serve --lora-modules (vLLM's multi-LoRA serving): a request whose "model" names an adapter runs
// under it, and computes what a server with that adapter merged (--lora) computes for the base
// name: the same text and logprobs within float rounding, whole and streamed, with the adapter's
// name as the response's model. Requests of the base model beside them are unchanged. /v1/models
// lists the adapters with the base model as parent; the prefix cache keeps adapters apart; an
// unknown name gets a 404 naming what runs; bad flags stop the server naming them.
TEST_F(Serve, LoraModulesAreChosenByModel) {
    const shardlm::ModelConfig c = shardlm::load_config(model_.path());
    TempDir a, b;
    const std::string config = R"({"peft_type": "LORA", "r": 2, "lora_alpha": 16, "bias": "none"})";
    std::vector<LoraModule> ma, mb;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const char* lin : {"self_attn.q_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"}) {
            const std::string m = "model.layers." + std::to_string(l) + "." + lin;
            ma.push_back(random_lora_module(c, m, 2, uint64_t(10 + l)));
            mb.push_back(random_lora_module(c, m, 2, uint64_t(50 + l)));
        }
    write_lora_adapter(a.path(), config, ma);
    write_lora_adapter(b.path(), config, mb);
    // FP32 weights: the merged server rounds W + BA once, the other adds BA to W in f32 (in the
    // model's BF16 the two differ by a BF16 rounding of the merged weights).
    const std::string base =
        kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256 --batch 3 --served-model-name kjv --weights fp32";
    // (proverbs in vLLM's JSON form, with a parent of its own for /v1/models)
    Server multi(base + " --max-loras 2 --lora-modules psalms=" + a.path() + " '{\"name\": \"proverbs\", \"path\": \"" + b.path() +
                     "\", \"base_model_name\": \"kjv-base\"}'",
                 logs_.file("multi.log"));
    Server merged(base + " --lora " + a.path(), logs_.file("merged.log"));
    ASSERT_GT(multi.port(), 0) << multi.read_all();
    ASSERT_GT(merged.port(), 0) << merged.read_all();
    const std::string text = "In the beginning God created the heaven and the earth. And the earth was";
    auto complete = [&](int port, const json& model) {
        json body = {{"prompt", text}, {"max_tokens", 8}, {"temperature", 0}, {"logprobs", 1}};
        if (!model.is_null()) body["model"] = model;
        const Reply r = post(port, "/v1/completions", body);
        EXPECT_EQ(r.status, 200) << r.raw;
        return r.body;
    };
    const json want = complete(merged.port(), "kjv"), got = complete(multi.port(), "psalms");
    EXPECT_EQ(got["model"], "psalms");
    EXPECT_EQ(got["choices"][0]["text"], want["choices"][0]["text"]);
    const json& gl = got["choices"][0]["logprobs"]["token_logprobs"];
    const json& wl = want["choices"][0]["logprobs"]["token_logprobs"];
    ASSERT_EQ(gl.size(), wl.size());
    for (size_t i = 0; i < gl.size(); ++i) EXPECT_NEAR(gl[i].get<double>(), wl[i].get<double>(), 1e-3) << i;
    // The base model and the other adapter score the same text otherwise.
    const json plain = complete(multi.port(), nullptr), other = complete(multi.port(), "proverbs");
    EXPECT_EQ(plain["model"], "kjv");
    EXPECT_EQ(other["model"], "proverbs");
    auto first_lp = [](const json& r) { return r["choices"][0]["logprobs"]["token_logprobs"][0].get<double>(); };
    EXPECT_GT(std::fabs(first_lp(plain) - first_lp(got)) + std::fabs(first_lp(other) - first_lp(got)), 1e-3);
    // Chat, streamed: the merged server's reply, every event naming the adapter.
    const json ask = {{"messages", {{{"role", "user"}, {"content", "Who made the earth?"}}}}, {"max_tokens", 6}, {"temperature", 0}};
    json ask_a = ask;
    ask_a["model"] = "psalms";
    ask_a["stream"] = true;
    const Reply s = post(multi.port(), "/v1/chat/completions", ask_a);
    ASSERT_EQ(s.status, 200) << s.raw;
    EXPECT_EQ(streamed_chat(s.raw).content, post(merged.port(), "/v1/chat/completions", ask).body["choices"][0]["message"]["content"]);
    EXPECT_NE(s.raw.find("\"model\":\"psalms\""), std::string::npos);
    EXPECT_EQ(s.raw.find("\"model\":\"kjv\""), std::string::npos);
    // The prefix cache: a new prompt under psalms again is cached, under the base model or proverbs
    // not (three slots: each request takes the one its name ran in, else the least recently freed).
    auto cached = [&](const json& model) {
        json body = {{"prompt", "And God said, Let there be light: and there was light."}, {"max_tokens", 1}};
        if (!model.is_null()) body["model"] = model;
        const Reply r = post(multi.port(), "/v1/completions", body);
        EXPECT_EQ(r.status, 200) << r.raw;
        return r.body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
    };
    EXPECT_EQ(cached("psalms"), 0);
    EXPECT_GT(cached("psalms"), 0);
    EXPECT_EQ(cached(nullptr), 0);
    EXPECT_EQ(cached("proverbs"), 0);
    EXPECT_GT(cached(nullptr), 0);
    // /v1/models.
    httplib::Client cl("127.0.0.1", multi.port());
    const auto models = cl.Get("/v1/models");
    ASSERT_TRUE(models);
    const json list = json::parse(models->body)["data"];
    ASSERT_EQ(list.size(), 3u) << models->body;
    EXPECT_EQ(list[0]["id"], "kjv");
    EXPECT_TRUE(list[0]["parent"].is_null());
    EXPECT_EQ(list[1]["id"], "psalms");
    EXPECT_EQ(list[1]["parent"], "kjv");
    EXPECT_EQ(list[1]["root"], a.path());
    EXPECT_EQ(list[2]["id"], "proverbs");
    EXPECT_EQ(list[2]["parent"], "kjv-base");
    EXPECT_EQ(list[2]["root"], b.path());
    // /metrics: vLLM's lora_requests_info, nothing running now.
    const auto metrics = cl.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_NE(metrics->body.find("shardlm_lora_requests_info{running_lora_adapters=\"\",waiting_lora_adapters=\"\",max_lora=\"2\"} 1"),
              std::string::npos) << metrics->body;
    // An unknown name; an adapter's name on a route it does not serve.
    const Reply unknown = post(multi.port(), "/v1/completions", {{"prompt", "x"}, {"model", "job"}});
    EXPECT_EQ(unknown.status, 404) << unknown.raw;
    EXPECT_EQ(unknown.body["error"]["message"], "The model `job` does not exist (this server runs `kjv`, `psalms`, `proverbs`)");
    const Reply tok = post(multi.port(), "/tokenize", {{"prompt", "x"}, {"model", "psalms"}});
    EXPECT_EQ(tok.status, 200) << tok.raw;  // the tokenizer is the base model's for every name
    EXPECT_EQ(multi.stop(), 0);
    EXPECT_EQ(merged.stop(), 0);
    auto refused = [&](const std::string& flags, const std::string& needle) {
        const CommandResult r = run_command(kCli + " serve --model " + model_.path() + " --threads 1 --port 0 " + flags);
        EXPECT_NE(r.exit_code, 0) << flags;
        EXPECT_NE(r.err.find(needle), std::string::npos) << flags << ": " << r.err;
    };
    refused("--lora-modules psalms", "--lora-modules \"psalms\": expected NAME=DIR or {\"name\": NAME, \"path\": DIR}");
    refused("--lora-modules '{\"name\": \"x\"}'", "--lora-modules '{\"name\": \"x\"}': \"path\" is missing");
    refused("--lora-modules '{\"name\": \"x\", \"path\": \"" + a.path() + "\", \"scale\": 2}'", "unknown key \"scale\"");
    refused("--lora-modules '{\"name\": '", "not valid JSON");
    refused("--max-loras 2", "--max-loras applies to LoRA adapters: give --lora-modules or --allow-runtime-lora-updating");
    refused("--allow-runtime-lora-updating --max-lora-rank -1", "--max-lora-rank must be 0 (any) or more");
    refused("--max-lora-rank 1 --lora-modules x=" + a.path(), "LoRA adapter " + a.path() + ": rank 2 is greater than --max-lora-rank 1");
    refused("--lora-modules x=" + a.path() + " x=" + b.path(), "--lora-modules: the name \"x\" is given twice");
    refused("--served-model-name kjv --lora-modules kjv=" + a.path(), "the name \"kjv\" is the served model's");
    refused("--lora-modules x=" + logs_.path(), "no adapter_config.json");
}

// --allow-runtime-lora-updating (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): /v1/load_lora_adapter
// adds an adapter while serving and /v1/unload_lora_adapter removes it. A loaded adapter serves
// as one given by --lora-modules does; an unloaded name is a 404 at once, while a sequence already
// running under it finishes as it would have; loaded again, it runs the same and shares no
// prefix with its earlier self. Misuse gets vLLM's answers; without the flag the routes are not there.
TEST_F(Serve, LoraAdaptersLoadAndUnloadWhileServing) {
    const shardlm::ModelConfig c = shardlm::load_config(model_.path());
    TempDir a;
    std::vector<LoraModule> ms;
    for (int64_t l = 0; l < c.n_layers; ++l)
        for (const char* lin : {"self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"})
            ms.push_back(random_lora_module(c, "model.layers." + std::to_string(l) + "." + lin, 2, uint64_t(20 + l)));
    write_lora_adapter(a.path(), R"({"peft_type": "LORA", "r": 2, "lora_alpha": 16, "bias": "none"})", ms);
    const std::string base = kCli + " serve --model " + model_.path() + " --threads 1 --ctx 256 --batch 2 --served-model-name kjv";
    Server fixed(base + " --lora-modules psalms=" + a.path(), logs_.file("fixed.log"));
    Server srv(base + " --allow-runtime-lora-updating --max-lora-rank 2", logs_.file("runtime.log"));
    ASSERT_GT(fixed.port(), 0) << fixed.read_all();
    ASSERT_GT(srv.port(), 0) << srv.read_all();
    const int port = srv.port();
    const json ask = {{"model", "psalms"}, {"prompt", "And God said, Let there be"}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 0}};
    auto load = [&](const json& body) { return post(port, "/v1/load_lora_adapter", body); };
    auto unload = [&](const std::string& n) { return post(port, "/v1/unload_lora_adapter", {{"lora_name", n}}); };
    EXPECT_EQ(post(port, "/v1/completions", ask).status, 404);
    const Reply ok = load({{"lora_name", "psalms"}, {"lora_path", a.path()}});
    EXPECT_EQ(ok.status, 200) << ok.raw;
    EXPECT_EQ(ok.raw, "Success: LoRA adapter 'psalms' added successfully.");
    const Reply want = post(fixed.port(), "/v1/completions", ask), got = post(port, "/v1/completions", ask);
    ASSERT_EQ(got.status, 200) << got.raw;
    EXPECT_EQ(got.body["model"], "psalms");
    EXPECT_EQ(got.body["choices"][0]["text"], want.body["choices"][0]["text"]);
    EXPECT_EQ(got.body["choices"][0]["logprobs"], want.body["choices"][0]["logprobs"]);
    httplib::Client cl("127.0.0.1", port);
    auto listed = [&] {
        const auto m = cl.Get("/v1/models");
        std::vector<std::string> ids;
        const json list = json::parse(m->body);  // (a range-for over a temporary's member would dangle)
        for (const json& d : list["data"]) ids.push_back(d["id"]);
        return ids;
    };
    EXPECT_EQ(listed(), (std::vector<std::string>{"kjv", "psalms"}));
    // Misuse.
    const Reply twice = load({{"lora_name", "psalms"}, {"lora_path", a.path()}});
    EXPECT_EQ(twice.status, 400);
    EXPECT_EQ(twice.body["error"]["message"], "The lora adapter 'psalms' has already been loaded.");
    EXPECT_EQ(load({{"lora_name", "kjv"}, {"lora_path", a.path()}}).status, 400);  // the base model's name
    const Reply missing = load({{"lora_name", "job"}, {"lora_path", logs_.path()}});
    EXPECT_EQ(missing.status, 400);
    EXPECT_NE(missing.body["error"]["message"].get<std::string>().find("no adapter_config.json"), std::string::npos) << missing.raw;
    EXPECT_EQ(load({{"lora_name", "job"}}).body["error"]["message"], "\"lora_path\" must be a non-empty string");
    TempDir wide;  // rank 4, above --max-lora-rank 2
    write_lora_adapter(wide.path(), R"({"peft_type": "LORA", "r": 4, "lora_alpha": 16, "bias": "none"})",
                       {random_lora_module(c, "model.layers.0.self_attn.q_proj", 4, 7)});
    const Reply too_wide = load({{"lora_name", "job"}, {"lora_path", wide.path()}});
    EXPECT_EQ(too_wide.status, 400);
    EXPECT_EQ(too_wide.body["error"]["message"], "LoRA adapter " + wide.path() + ": rank 4 is greater than --max-lora-rank 2") << too_wide.raw;
    EXPECT_EQ(unload("job").status, 404);
    EXPECT_EQ(listed(), (std::vector<std::string>{"kjv", "psalms"}));
    // Unloaded while a streamed sequence runs under it: the name goes at once, the sequence ends as
    // it would have. (Long enough to still run when /metrics is read: 40 tokens sometimes ended
    // first under ctest -j2.)
    json streamed = ask;
    streamed["stream"] = true;
    streamed["max_tokens"] = 200;
    streamed["ignore_eos"] = true;
    streamed.erase("logprobs");
    json whole = streamed;
    whole.erase("stream");
    const std::string full = post(port, "/v1/completions", whole).body["choices"][0]["text"];
    std::string raw, metrics_during;
    Reply during;
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.headers = {{"Content-Type", "application/json"}};
    req.body = streamed.dump();
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        if (raw.empty()) {  // at the first event: the sequence runs
            during = unload("psalms");
            httplib::Client mc("127.0.0.1", port);
            const auto m = mc.Get("/metrics");
            if (m) metrics_during = m->body;
        }
        raw.append(data, n);
        return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    ASSERT_TRUE(cl.send(req, res, err)) << httplib::to_string(err);
    EXPECT_EQ(during.status, 200) << during.raw;
    EXPECT_EQ(during.raw, "Success: LoRA adapter 'psalms' removed successfully.");
    // (/metrics, read once the unload was answered: the step of the first event is counted, and
    // the sequence runs on under the unloaded adapter)
    EXPECT_NE(metrics_during.find("shardlm_lora_requests_info{running_lora_adapters=\"psalms\",waiting_lora_adapters=\"\",max_lora=\"0\"} 1"),
              std::string::npos) << metrics_during;
    std::string text;
    std::istringstream events(raw);
    for (std::string line; std::getline(events, line);)
        if (line.rfind("data: {", 0) == 0) text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(text, full);
    const Reply after = post(port, "/v1/completions", ask);
    EXPECT_EQ(after.status, 404);
    EXPECT_EQ(after.body["error"]["message"], "The model `psalms` does not exist (this server runs `kjv`)");
    EXPECT_EQ(listed(), (std::vector<std::string>{"kjv"}));
    EXPECT_EQ(unload("psalms").status, 404);
    // Loaded again: the same replies, and nothing cached from its earlier self.
    ASSERT_EQ(load({{"lora_name", "psalms"}, {"lora_path", a.path()}}).status, 200);
    const Reply again = post(port, "/v1/completions", ask);
    ASSERT_EQ(again.status, 200) << again.raw;
    EXPECT_EQ(again.body["choices"][0]["text"], want.body["choices"][0]["text"]);
    EXPECT_EQ(again.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    EXPECT_GT(post(port, "/v1/completions", ask).body["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 0);
    EXPECT_EQ(srv.stop(), 0);
    // Without the flag the routes are not served.
    EXPECT_EQ(post(fixed.port(), "/v1/load_lora_adapter", {{"lora_name", "x"}, {"lora_path", a.path()}}).status, 404);
    EXPECT_EQ(fixed.stop(), 0);
}
