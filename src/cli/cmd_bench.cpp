// shardlm bench: llama-bench-style prefill (ppL) and decode (tgN) timings with achieved
// bandwidth against the measured copy bandwidth, as a markdown table or JSON lines.
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdlib>
#include <limits>

#include <sys/stat.h>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/bench_serving.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "comm/communicator.h"
#include "comm/together.h"
#include "core/error.h"
#include "core/membw.h"
#include "core/mmap_file.h"
#include "kernels/cpu/matmul.h"
#include "model/synthetic.h"
#include "runtime/session.h"

#include "git_commit.h"  // SHARDLM_GIT_COMMIT, generated at build time
#ifdef SHARDLM_HAVE_CUDA
#include "kernels/cuda/device.h"
#include "kernels/cuda/device_memory.h"
#include "runtime/cuda_engine.h"
#endif

namespace shardlm {

namespace {

struct Stats {
    double mean = 0, stddev = 0;
};

Stats stats(const std::vector<double>& v) {
    Stats s;
    for (double x : v) s.mean += x;
    s.mean /= double(v.size());
    for (double x : v) s.stddev += (x - s.mean) * (x - s.mean);
    s.stddev = v.size() > 1 ? std::sqrt(s.stddev / double(v.size() - 1)) : 0.0;
    return s;
}

// The current GPU's theoretical memory bandwidth, and the device memory in use (0 without CUDA).
double device_peak_gbps() {
#ifdef SHARDLM_HAVE_CUDA
    return cuda_peak_gbps();
#else
    return 0.0;
#endif
}

// Whether CUDA kernels launch with programmatic dependent launch (kernels/cuda/launch.h).
bool device_pdl() {
#ifdef SHARDLM_HAVE_CUDA
    return pdl_enabled();
#else
    return false;
#endif
}

// Whether INT8 prefill products dequantize the next matrix ahead (SHARDLM_GEMM_STAGE).
bool device_gemm_staging() {
#ifdef SHARDLM_HAVE_CUDA
    return int8_gemm_staging();
#else
    return false;
#endif
}

// The attention kernels of a row: "flash-fp32" when CUDA prefill tiles stay off the tensor cores
// (SHARDLM_PREFILL_TC=0, kernels/cuda/attention.h), else the --attention value; "+rope" when the
// CUDA decode kernel runs the RoPE prologue itself (the default; SHARDLM_FUSED_ROPE=0 turns it off).
std::string row_attention(const std::string& attention, bool cuda) {
#ifdef SHARDLM_HAVE_CUDA
    if (cuda && attention == "flash")
        return std::string(prefill_tensor_cores() ? "flash" : "flash-fp32") + (decode_rope_fused() ? "+rope" : "");
#else
    (void)cuda;
#endif
    return attention;
}

size_t device_used_bytes() {
#ifdef SHARDLM_HAVE_CUDA
    size_t free_b = 0, total_b = 0;
    device_memory_info(&free_b, &total_b);
    return total_b - free_b;
#else
    return 0;
#endif
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int cmd_bench(const Args& args, Communicator& comm) {
    po::options_description d("bench options");
    std::string model, synthetic, adapter_dir;
    PrecisionFlags prec;
    BackendFlags backend;
    std::string batch_list = "1", ablate_list;
    std::vector<int64_t> batches;
    std::vector<std::string> ablations;
    int64_t prompt_len = 512, gen = 128, reps = 3, requests = 0, shared = 0, conversations = 0;
    int threads = 0;
    d.add_options()
        ("help", "show this help")
        ("model", po::value(&model), "checkpoint folder")
        ("synthetic", po::value(&synthetic), "built-in shape with random BF16 weights (qwen3-1.7b, smollm2-1.7b, "
                                             "llama3.2-1b, tiny), written once under $SHARDLM_CACHE or /tmp/shardlm-cache")
        ("batch", po::value(&batch_list)->default_value("1"), "sequences per step; a list (1,4) runs each on one loaded model")
        ("prompt-len", po::value(&prompt_len)->default_value(512), "prefill tokens per sequence (ppL)")
        ("gen", po::value(&gen)->default_value(128), "decode steps (tgN)")
        (",r", po::value(&reps)->default_value(3), "repeats")
        ("requests", po::value(&requests)->default_value(0),
         "serving throughput instead of ppL/tgN: N requests, prompts of 1 to --prompt-len tokens and 1 to --gen "
         "new tokens each (fixed seed), greedy, through each --batch's slots by continuous batching and, in the "
         "same run, as static batches one after the other")
        ("shared-prefix", po::value(&shared)->default_value(0),
         "with --requests: every prompt starts with the same N tokens (a system prompt) before its own, and a "
         "third row runs them continuously batched with the prefix cache (generate --prefix-cache)")
        ("conversations", po::value(&conversations)->default_value(0),
         "multi-turn chat instead of ppL/tgN: N conversations of --prompt-len tokens, each replying --gen tokens "
         "through each --batch's slots, then each one's second turn (its prompt, its reply and --gen tokens of "
         "its own, replying --gen again), timed without the prefix cache, with it in the slots alone, and with "
         "its host tier (serve --cache-ram, room for every conversation)")
        ("threads", po::value(&threads)->default_value(0), "CPU threads (0: one per core)")
        ("adapter", po::value(&adapter_dir),
         "DIR: every sequence runs under this LoRA adapter kept beside the weights, as serve --lora-modules keeps "
         "it (ppL/tgN rows; against --lora DIR, which merges it, and the base model: what choosing adapters per "
         "request costs)")
        ("no-kv-cache", "baseline: every decode step recomputes the whole sequence from position 0")
        ("ablate", po::value(&ablate_list),
         "CUDA engine, a measurement: after each batch's rows, decode again leaving out each listed kernel class "
         "(qkv, attention, o, mlp, lm_head; '+' joins classes, ',' separates runs: attention,mlp) and print its "
         "tgN row with \"ablate\" set; the time saved is the classes' marginal cost in the step")
        ("json", "one JSON object per line instead of a markdown table");
    add_precision_options(d, prec);
    add_backend_options(d, backend);
    po::variables_map vm;
    const bool root = comm.rank() == 0;
    bool help = false;
    run_together(comm, [&] {
        help = !parse_args(args, d, vm, "usage: shardlm bench --model DIR [--batch B] [--prompt-len L] [--gen N] [-r R]", root);
        if (help) return;
        for (size_t at = 0; at <= batch_list.size();) {  // "1,4"
            const size_t end = std::min(batch_list.find(',', at), batch_list.size());
            const std::string item = batch_list.substr(at, end - at);
            if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos)
                fail("--batch: expected sizes like 1 or 1,4, not \"", batch_list, "\"");
            batches.push_back(std::stoll(item));
            at = end + 1;
        }
        if (prompt_len < 1 || gen < 1 || reps < 1) fail("--prompt-len, --gen and -r must be >= 1");
        if (requests < 0) fail("--requests must be >= 0");
        if (requests > 0 && vm.count("no-kv-cache")) fail("--requests runs generate over the KV cache: not with --no-kv-cache");
        if (shared < 0 || shared > (int64_t(1) << 30)) fail("--shared-prefix must be in [0, 2^30]");
        if (shared > 0 && requests == 0) fail("--shared-prefix needs --requests");
        if (conversations < 0 || conversations > (int64_t(1) << 20)) fail("--conversations must be in [0, 2^20]");
        if (conversations > 0 && (requests > 0 || vm.count("no-kv-cache") || !ablate_list.empty()))
            fail("--conversations excludes --requests, --no-kv-cache and --ablate");
        if (conversations > 0 && gen > (int64_t(1) << 40)) fail("--gen must be at most 2^40 with --conversations");
        if (!ablate_list.empty() && (requests > 0 || vm.count("no-kv-cache")))
            fail("--ablate times decode steps over the KV cache: not with --requests or --no-kv-cache");
        for (size_t at = 0; at <= ablate_list.size() && !ablate_list.empty();) {  // "attention,qkv+o"
            const size_t end = std::min(ablate_list.find(',', at), ablate_list.size());
            ablations.push_back(ablate_list.substr(at, end - at));
#ifdef SHARDLM_HAVE_CUDA
            parse_ablation(ablations.back(), "--ablate");
#else
            fail("--ablate measures the CUDA engine, which this build does not have");
#endif
            at = end + 1;
        }
        if (vm.count("adapter") && (requests > 0 || conversations > 0))
            fail("--adapter times ppL/tgN rows: not with --requests or --conversations");
        SessionOptions check_flags;  // the precision and backend flags, on every rank, before any load
        apply_precision(prec, check_flags);
        apply_backend(backend, check_flags);
        for (int64_t b : batches)
            if (b < 1) fail("--batch must be >= 1");
        if (model.empty() == synthetic.empty()) fail("give one of --model DIR or --synthetic NAME");
        if (!synthetic.empty()) {
            const ModelConfig cfg = synthetic_config(synthetic);  // validates the name
            const char* cache = std::getenv("SHARDLM_CACHE");
            const std::string base = cache && *cache ? cache : "/tmp/shardlm-cache";
            ::mkdir(base.c_str(), 0755);
            model = base + "/" + synthetic + "-bf16";
            // Rank 0 writes it (the ranks share the file system of one node); the others wait below.
            if (root && !file_exists(model + "/config.json")) {
                write_synthetic_checkpoint(model + ".tmp", cfg, {DType::BF16, 4, 1});
                if (std::rename((model + ".tmp").c_str(), model.c_str()) != 0) fail(model, ": cannot create");
            }
        }
        set_threads(threads);
    });
    if (help) return 0;
    comm.barrier();  // a synthetic checkpoint is complete before anyone maps it

    SessionOptions so;
    so.model_dir = model;
    apply_precision(prec, so);
    apply_backend(backend, so);
    if (!adapter_dir.empty()) so.adapters = {{"bench", {adapter_dir, 1.0f}}};
    // Every chunk of a ppL/tgN row under --adapter (SeqChunk::adapter), or none.
    const int64_t adapter = adapter_dir.empty() ? -1 : 0;
    auto under = [adapter](std::vector<SeqChunk>& ch) -> const std::vector<SeqChunk>& {
        for (SeqChunk& x : ch) x.adapter = adapter;
        return ch;
    };
    // A request's prompt is the shared prefix and then up to --prompt-len tokens of its own.
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    const int64_t plen = prompt_len > kMax - shared ? kMax : prompt_len + shared;
    const std::string plen_flags =
        "--prompt-len " + std::to_string(prompt_len) + (shared > 0 ? " + --shared-prefix " + std::to_string(shared) : "");
    // --conversations: a second turn holds the first prompt, its reply and --gen tokens, then replies.
    const int64_t gens = conversations > 0 ? 3 * gen : gen;
    const std::string gen_flags = (conversations > 0 ? " + 3 x --gen " : " + --gen ") + std::to_string(gen);
    run_together(comm, [&] {  // bench has no --ctx: name the flags that set it
        const ModelConfig cfg = load_config(model);
        if (cfg.max_position > 0 && (plen > cfg.max_position || gens > cfg.max_position - plen))
            fail(plen_flags, gen_flags, " exceed the model's max_position_embeddings ", cfg.max_position);
    });
    // Saturating: a huge --prompt-len or --gen must not wrap (check_context then refuses the sum
    // under the flags' names, as bench has no --ctx).
    so.ctx = gens > kMax - plen ? kMax : plen + gens;
    so.ctx_origin = plen_flags + gen_flags;
    const int64_t max_batch = *std::max_element(batches.begin(), batches.end());
    so.max_batch = max_batch;
    const bool no_cache = vm.count("no-kv-cache") > 0;
    // pp is one step, as llama-bench measures it; without the cache a decode step is a whole prefill.
    // (engine_options caps the step at ctx x batch.)
    const int64_t step = no_cache ? so.ctx : plen;
    so.prefill_chunk = step > kMax / max_batch ? kMax : step * max_batch;
    so.chunk_origin = (no_cache ? so.ctx_origin : plen_flags) + " x batch " + std::to_string(max_batch);
    std::unique_ptr<Session> s;
    run_together(comm, [&] { s = open_session(so, comm); });
    Engine& e = *s->engine;
    const ModelConfig& c = s->cfg;
    // --ablate: the kernel classes a step leaves out, on the CUDA engine (an empty mask: none).
    std::function<void(uint32_t)> ablate;
#ifdef SHARDLM_HAVE_CUDA
    if (auto* ce = dynamic_cast<CudaEngine*>(&e)) ablate = [ce](uint32_t mask) { ce->set_ablation(mask); };
#endif
    run_together(comm, [&] {
        if (!ablations.empty() && !ablate) fail("--ablate measures the CUDA engine: run it with --device cuda");
    });
    const bool cuda = e.device().rfind("cuda", 0) == 0;
    // The bandwidth roofline: the GPU's theoretical HBM bandwidth, or on the CPU a measured copy
    // bandwidth (per rank: ranks on one machine share it).
    const double peak = cuda ? device_peak_gbps() : measure_copy_gbps();
    const std::string wname = weight_format_name(s->weights.format) +
                              (s->adapters.empty() ? "" : "+lora r" + std::to_string(s->adapters[0].max_rank)),
                      kvname = kv_name(e.options().kv);
    const bool json = vm.count("json") > 0;
    if (root && !json) {
        if (conversations > 0) std::printf("| model | test | batch | weights | kv | ms | tokens/s | second turns |\n");
        else std::printf("| model | test | batch | weights | kv | ms | tokens/s | GB/s (peak %.1f) |\n", peak);
        std::printf("|---|---|---:|---|---|---:|---:|---:|\n");
    }
    double last_checksum = 0;
    // The fields every JSON row carries.
    auto common = [&](nlohmann::ordered_json& j) {
        j["tp"] = comm.size();
        j["device"] = e.device();
        j["attention"] = row_attention(backend.attention, cuda);
        j["cuda_graphs"] = cuda && !backend.no_cuda_graph;
        j["pdl"] = cuda && device_pdl();
        j["gemv_grid"] = e.gemv_kernels(j["batch"].get<int64_t>());  // the one-token steps' GEMVs
        j["gemm_stage"] = cuda && device_gemm_staging();
        j["weights"] = wname;
        j["kv"] = kvname;
        j["peak_gbps"] = peak;
        j["memory"] = {{"weights_bytes", e.weight_bytes()}, {"kv_cache_bytes", e.kv_bytes()},
                       {"workspace_bytes", e.workspace_bytes()}, {"peak_bytes", cuda ? device_used_bytes() : peak_rss_bytes()}};
        j["build_commit"] = SHARDLM_GIT_COMMIT;
    };
    if (conversations > 0) {
        // Every conversation's first prompt is --prompt-len tokens, its replies --gen tokens.
        ServingRequests first;
        for (int64_t i = 0; i < conversations; ++i) {
            std::vector<int32_t> p(static_cast<size_t>(prompt_len));
            for (int64_t k = 0; k < prompt_len; ++k) p[size_t(k)] = int32_t((i * 1000003 + k * 7919 + 11) % c.vocab);
            first.prompts.push_back(std::move(p));
            first.max_new.push_back(gen);
            first.prompt_tokens += prompt_len;
        }
        const int64_t chunk = e.options().max_step_tokens;
        // Room for every conversation's longest save: a second turn's prompt and its reply but the last token.
        const size_t host = size_t(conversations) * size_t(prompt_len + 3 * gen) * e.kv_position_bytes();
        for (const int64_t batch : batches) {
            struct Mode { const char* name; bool reuse; size_t host; };
            const Mode modes[] = {{"none", false, 0}, {"slots", true, 0}, {"host", true, host}};
            for (const Mode& m : modes) {
                std::vector<double> ms;
                ConversationRun run;
                for (int64_t r = 0; r < reps; ++r) {
                    run = run_conversations(e, first, gen, batch, chunk, m.reuse, m.host);
                    ms.push_back(run.ms);
                }
                if (!root) continue;
                const Stats st = stats(ms);
                const std::string test = "conv" + std::to_string(conversations) + "-" + m.name;
                const double tps = double(run.generated) * 1000.0 / st.mean;
                if (json) {
                    nlohmann::ordered_json j;
                    j["test"] = test;
                    j["batch"] = batch;
                    j["conversations"] = conversations;
                    j["prompt_len"] = prompt_len;
                    j["gen"] = gen;
                    j["host_cache_bytes"] = m.host;
                    j["prefilled_tokens"] = run.prefilled;
                    j["host_loads"] = run.loads;
                    j["generated_tokens"] = run.generated;
                    j["steps"] = run.steps;
                    j["avg_ms"] = st.mean;
                    j["stddev_ms"] = st.stddev;
                    j["tokens_per_s"] = tps;
                    j["ttft_ms_p50"] = run.ttft_p50_ms;  // of the last repeat
                    common(j);
                    std::cout << j.dump() << "\n";
                } else {
                    std::printf("| %s | %s | %lld | %s | %s | %.1f +- %.1f | %.2f | %lld prefilled, %lld loads, TTFT p50 %.0f ms |\n",
                                arch_name(c.arch), test.c_str(), (long long)batch, wname.c_str(), kvname.c_str(), st.mean,
                                st.stddev, tps, (long long)run.prefilled, (long long)run.loads, run.ttft_p50_ms);
                }
                std::fflush(stdout);
            }
        }
        if (root && !json) std::printf("\nbuild %s, %s\n", SHARDLM_GIT_COMMIT, e.device().c_str());
        return 0;
    }
    if (requests > 0) {
        const ServingRequests req = serving_requests(requests, prompt_len, gen, c.vocab, 1, shared);
        const int64_t chunk = e.options().max_step_tokens;  // what a static batch's prefill gets too
        for (const int64_t batch : batches) {
            // Warm-up, not timed: the CUDA engine captures a decode graph per batch size the second
            // time it meets one, and continuous batching meets every size up to the slots.
            ServingRequests warm;
            for (int64_t i = 0; i < std::min<int64_t>(requests, 2 * batch); ++i) {
                warm.prompts.push_back(req.prompts[size_t(i)]);
                warm.max_new.push_back(std::min<int64_t>(req.max_new[size_t(i)], 8));
            }
            run_serving(e, warm, batch, chunk, false);
            std::vector<double> cont_ms, static_ms, prefix_ms;
            ServingRun cont, stat, prefix;
            for (int64_t r = 0; r < reps; ++r) {
                cont = run_serving(e, req, batch, chunk, false);
                stat = run_serving(e, req, batch, chunk, true);
                cont_ms.push_back(cont.ms);
                static_ms.push_back(stat.ms);
                if (shared == 0) continue;
                prefix = run_serving(e, req, batch, chunk, false, true);
                prefix_ms.push_back(prefix.ms);
            }
            if (!root) continue;
            struct Row { std::string test; Stats st; ServingRun run; };
            const std::string name = "serve" + std::to_string(requests);
            std::vector<Row> rows = {{name, stats(cont_ms), cont}, {name + "-static", stats(static_ms), stat}};
            if (shared > 0) rows.push_back({name + "-prefix", stats(prefix_ms), prefix});
            for (const Row& r : rows) {
                const double tps = double(r.run.generated) * 1000.0 / r.st.mean;
                // Each engine step reads this rank's weights once (KV reads not counted).
                const double gbps = double(e.weight_bytes()) * double(r.run.steps) / (r.st.mean / 1000.0) / 1e9;
                if (json) {
                    nlohmann::ordered_json j;
                    j["test"] = r.test;
                    j["batch"] = batch;
                    j["requests"] = requests;
                    j["prompt_tokens"] = req.prompt_tokens;
                    j["shared_prefix"] = shared;
                    j["prefilled_tokens"] = r.run.prefilled;
                    j["generated_tokens"] = r.run.generated;
                    j["steps"] = r.run.steps;
                    j["avg_ms"] = r.st.mean;
                    j["stddev_ms"] = r.st.stddev;
                    j["tokens_per_s"] = tps;
                    j["requests_per_s"] = double(requests) * 1000.0 / r.st.mean;
                    j["ttft_ms_p50"] = r.run.ttft_p50_ms;  // of the last repeat
                    j["ttft_ms_p90"] = r.run.ttft_p90_ms;
                    j["tpot_ms_mean"] = r.run.tpot_mean_ms;
                    j["gbps"] = gbps;
                    common(j);
                    std::cout << j.dump() << "\n";
                } else {
                    std::printf("| %s | %s | %lld | %s | %s | %.1f +- %.1f | %.2f | %.2f |\n", arch_name(c.arch), r.test.c_str(),
                                (long long)batch, wname.c_str(), kvname.c_str(), r.st.mean, r.st.stddev, tps, gbps);
                }
            }
            if (!json)
                std::printf("|  | (%lld requests, %lld prompt tokens, %lld generated; %lld vs %lld steps%s) | | | | | | |\n",
                            (long long)requests, (long long)req.prompt_tokens, (long long)cont.generated,
                            (long long)cont.steps, (long long)stat.steps,
                            shared > 0 ? (", prefix cache: " + std::to_string(prefix.steps) + " steps, " +
                                          std::to_string(prefix.prefilled) + " tokens prefilled")
                                             .c_str()
                                       : "");
            std::fflush(stdout);
        }
        if (root && !json) std::printf("\nbuild %s, %s\n", SHARDLM_GIT_COMMIT, e.device().c_str());
        return 0;
    }
    for (const int64_t batch : batches) {
        std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(batch));
        for (int64_t b = 0; b < batch; ++b)
            for (int64_t i = 0; i < prompt_len; ++i) prompts[size_t(b)].push_back(int32_t((b * 1000003 + i * 7919 + 11) % c.vocab));
        std::vector<float> logits(static_cast<size_t>(batch * c.vocab));
        auto prefill = [&]() {
            std::vector<SeqChunk> ch;
            for (int64_t b = 0; b < batch; ++b) ch.push_back({b, prompts[size_t(b)].data(), prompt_len, 0, true});
            e.forward(under(ch), logits.data());
        };
        std::vector<int32_t> next(static_cast<size_t>(batch)), best_id(static_cast<size_t>(batch));
        std::vector<float> best_val(static_cast<size_t>(batch));
        double checksum = 0;
        std::vector<double> pp_ms, tg_ms;
        prefill();  // warm-up, not timed: page faults, thread start-up, caches
        if (!no_cache) {
            // Two decode steps too: the CUDA engine runs a batch size's first decode step eagerly
            // and captures its graph on the second.
            for (int64_t step = 0; step < 2 && step < gen; ++step) {
                std::vector<SeqChunk> ch;
                for (int64_t b = 0; b < batch; ++b) {
                    next[size_t(b)] = int32_t(b % c.vocab);
                    ch.push_back({b, &next[size_t(b)], 1, prompt_len + step, true});
                }
                e.forward_top(under(ch), 1, best_val.data(), best_id.data());
            }
        }
        // The timed decode: gen steps from the end of the prompt (ms).
        auto decode = [&]() {
            const auto t0 = std::chrono::steady_clock::now();
            for (int64_t step = 0; step < gen; ++step) {
                std::vector<SeqChunk> ch;
                for (int64_t b = 0; b < batch; ++b) {
                    next[size_t(b)] = int32_t((step * 31 + b) % c.vocab);  // fixed inputs: timing, not quality
                    if (!no_cache) {
                        ch.push_back({b, &next[size_t(b)], 1, prompt_len + step, true});
                        continue;
                    }
                    auto& seq = prompts[size_t(b)];
                    seq.push_back(next[size_t(b)]);
                    ch.push_back({b, seq.data(), int64_t(seq.size()), 0, true});
                }
                // As generate decodes greedily: only each row's best candidate comes back.
                e.forward_top(under(ch), 1, best_val.data(), best_id.data());
            }
            for (auto& p : prompts) p.resize(size_t(prompt_len));
            return ms_since(t0);
        };
        for (int64_t r = 0; r < reps; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            prefill();
            pp_ms.push_back(ms_since(t0));
            tg_ms.push_back(decode());
            checksum = 0;  // the last prefill's logits, and the last decode step's best ones
            for (float v : logits) checksum += double(v);
            for (float v : best_val) checksum += double(v);
        }
        // --ablate: the same decode without each listed class of kernels (after an untimed run, in
        // which the new graphs are captured), then the whole step again.
        std::vector<std::pair<std::string, Stats>> ablated;
        for (const std::string& a : ablations) {
#ifdef SHARDLM_HAVE_CUDA
            ablate(parse_ablation(a, "--ablate"));
#endif
            decode();
            std::vector<double> ms;
            for (int64_t r = 0; r < reps; ++r) ms.push_back(decode());
            ablated.emplace_back(a, stats(ms));
        }
        if (!ablations.empty()) ablate(0);
        // Bytes one decode step reads: every weight once, plus the KV cache up to the current position.
        const ShardPlan& plan = s->weights.plan;
        const DType kvt = e.options().kv;
        const double kv_row = double(2 * c.n_layers * plan.n_kv_heads) *
                              (double(c.head_dim * int64_t(dtype_size(kvt))) + (kvt == DType::I8 ? 4.0 : 0.0));
        const double avg_pos = double(prompt_len) + double(gen - 1) / 2.0 + 1.0;
        // (Without the cache a step reads the weights once too, but does prompt-length times the work.)
        const double step_bytes = double(e.weight_bytes()) + (no_cache ? 0.0 : kv_row * avg_pos * double(batch));

        // Bytes each rank sends into collectives per decode step: an all-reduce of the hidden states
        // after the embedding, o_proj and down_proj (f32), and the all-gather of the logit slices.
        const double comm_step = comm.size() == 1 ? 0.0
            : double(batch) * 4.0 * (double(c.hidden) * double(1 + 2 * c.n_layers) + double(plan.vocab_per_rank));
        struct Row { std::string test; Stats st; double tokens, gbps; std::string ablate; };
        // All-reduce latency at the size the engine uses in decode (batch x hidden floats).
        double allreduce_us = 0;
        if (comm.size() > 1) {
            std::vector<float> buf(size_t(batch * c.hidden), 1.0f);
            const int iters = 200;
            comm.barrier();
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < iters; ++i) comm.all_reduce_sum(buf.data(), buf.size());
            allreduce_us = ms_since(t0) * 1000.0 / iters;
        }
        if (!root) continue;
        const Stats pp = stats(pp_ms), tg = stats(tg_ms);
        std::vector<Row> rows = {
            {"pp" + std::to_string(prompt_len), pp, double(prompt_len * batch) * 1000.0 / pp.mean, 0.0, ""},
            {"tg" + std::to_string(gen), tg, double(gen * batch) * 1000.0 / tg.mean, step_bytes / (tg.mean / double(gen) / 1000.0) / 1e9, ""},
        };
        for (const auto& [name, st] : ablated)  // (no GB/s: the step reads less than the weights)
            rows.push_back({"tg" + std::to_string(gen), st, double(gen * batch) * 1000.0 / st.mean, 0.0, name});
        if (json) {
            for (const Row& r : rows) {
                nlohmann::ordered_json j;
                j["test"] = r.test;
                j["kv_cache"] = !no_cache;
                j["batch"] = batch;
                j["comm_bytes_per_step"] = comm_step;
                j["allreduce_us"] = allreduce_us;
                j["allreduces_per_step"] = comm.size() == 1 ? 0 : 1 + 2 * c.n_layers;
                j["avg_ms"] = r.st.mean;
                j["stddev_ms"] = r.st.stddev;
                j["tokens_per_s"] = r.tokens;
                j["gbps"] = r.gbps;
                j["logits_checksum"] = r.ablate.empty() ? nlohmann::ordered_json(checksum) : nlohmann::ordered_json(nullptr);
                if (!r.ablate.empty()) j["ablate"] = r.ablate;
                common(j);
                std::cout << j.dump() << "\n";
            }
        } else {
            for (const Row& r : rows)
                std::printf("| %s | %s | %lld | %s | %s | %.1f +- %.1f | %.2f | %s |\n", arch_name(c.arch),
                            (r.ablate.empty() ? r.test : r.test + " without " + r.ablate).c_str(),
                            (long long)batch, wname.c_str(), kvname.c_str(), r.st.mean, r.st.stddev, r.tokens,
                            r.gbps > 0 ? std::to_string(r.gbps).substr(0, 5).c_str() : "-");
        }
        std::fflush(stdout);
        if (!json) last_checksum = checksum;
    }
    if (root && !json)
        std::printf("\nbuild %s, %s, logits checksum %.6e\n", SHARDLM_GIT_COMMIT, e.device().c_str(), last_checksum);
    return 0;
}

}  // namespace shardlm
