#include "cli/bench_serving.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/batcher.h"
#include "runtime/generate.h"

namespace shardlm {

ServingRequests serving_requests(int64_t n, int64_t max_prompt, int64_t max_gen, int64_t vocab, uint64_t seed,
                                 int64_t shared) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&](int64_t bound) {  // uniform in [0, bound), splitmix64
        x += 0x9E3779B97F4A7C15ull;
        uint64_t z = x;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return int64_t((z ^ (z >> 31)) % uint64_t(bound));
    };
    ServingRequests r;
    for (int64_t i = 0; i < n; ++i) {
        std::vector<int32_t> p(static_cast<size_t>(1 + next(max_prompt)));
        for (int32_t& id : p) id = int32_t(next(vocab));
        r.prompt_tokens += int64_t(p.size());
        r.prompts.push_back(std::move(p));
        r.max_new.push_back(1 + next(max_gen));
    }
    // The shared start, drawn after the rest: the requests' own tokens are those without it.
    std::vector<int32_t> start(static_cast<size_t>(shared));
    for (int32_t& id : start) id = int32_t(next(vocab));
    for (std::vector<int32_t>& p : r.prompts) p.insert(p.begin(), start.begin(), start.end());
    r.prompt_tokens += shared * n;
    return r;
}

ServingRun run_serving(Engine& e, const ServingRequests& r, int64_t slots, int64_t chunk, bool static_batches,
                       bool reuse_prefix) {
    GenerateOptions go;
    go.reuse_prefix = reuse_prefix;
    go.sampler.temperature = 0;
    go.prefill_chunk = chunk;
    go.max_running = slots;
    ServingRun out;
    const auto t0 = std::chrono::steady_clock::now();
    const size_t n = r.prompts.size(), group = static_batches ? size_t(slots) : n;
    auto ms = [&] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    std::vector<double> first(n, -1), last(n, 0);
    std::vector<int64_t> count(n, 0);
    for (size_t at = 0; at < n; at += group) {
        const size_t end = std::min(n, at + group);
        const std::vector<std::vector<int32_t>> prompts(r.prompts.begin() + ptrdiff_t(at), r.prompts.begin() + ptrdiff_t(end));
        go.max_new_each.assign(r.max_new.begin() + ptrdiff_t(at), r.max_new.begin() + ptrdiff_t(end));
        const TokenCallback on_token = [&](size_t i, int32_t) {
            const double t = ms();
            if (first[at + i] < 0) first[at + i] = t;
            last[at + i] = t;
            count[at + i] += 1;
        };
        const GenerateResult g = generate(e, prompts, go, on_token);
        for (const SequenceResult& q : g.seqs) out.generated += int64_t(q.tokens.size());
        out.steps += g.timings.prefill_steps + g.timings.decode_steps;
        out.prefilled += g.timings.prefill_tokens;
    }
    out.ms = ms();
    std::vector<double> ttft = first, tpot;
    std::sort(ttft.begin(), ttft.end());
    auto pct = [&](double p) { return ttft.empty() ? 0.0 : ttft[std::min(ttft.size() - 1, size_t(std::ceil(p * double(ttft.size()))) - 1)]; };
    out.ttft_p50_ms = pct(0.5);
    out.ttft_p90_ms = pct(0.9);
    for (size_t i = 0; i < n; ++i)
        if (count[i] > 1) tpot.push_back((last[i] - first[i]) / double(count[i] - 1));
    for (const double t : tpot) out.tpot_mean_ms += t / double(tpot.size());
    return out;
}

ConversationRun run_conversations(Engine& e, const ServingRequests& r, int64_t more, int64_t slots, int64_t chunk,
                                  bool reuse_prefix, size_t host_bytes) {
    BatcherOptions bo;
    bo.prefill_chunk = chunk;
    bo.max_running = slots;
    bo.reuse_prefix = reuse_prefix;
    bo.host_cache_bytes = host_bytes;
    Batcher b(e, bo);
    auto request = [](std::vector<int32_t> prompt, int64_t max_new, uint64_t stream) {
        BatchRequest q;
        q.prompt = std::move(prompt);
        q.max_new_tokens = max_new;
        q.sampler.temperature = 0;
        q.ignore_eos = true;
        q.stream = stream;
        return q;
    };
    const size_t n = r.prompts.size();
    for (size_t i = 0; i < n; ++i) b.add(request(r.prompts[i], r.max_new[i], i));
    while (b.busy()) b.step();
    const GenerateTimings before = b.timings();
    const int64_t vocab = e.config().vocab;
    for (size_t i = 0; i < n; ++i) {
        std::vector<int32_t> p = r.prompts[i];
        const std::vector<int32_t>& reply = b.result(i).tokens;
        p.insert(p.end(), reply.begin(), reply.end());
        for (int64_t k = 0; k < more; ++k) p.push_back(int32_t((int64_t(i) * 7919 + k * 104729 + 17) % vocab));
        b.add(request(std::move(p), r.max_new[i], n + i));
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<double> first(n, -1);
    const TokenCallback on_token = [&](size_t id, int32_t) {
        if (id >= n && first[id - n] < 0)
            first[id - n] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    while (b.busy()) b.step(on_token);
    ConversationRun out;
    out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const GenerateTimings& t = b.timings();
    out.prefilled = t.prefill_tokens - before.prefill_tokens;
    out.steps = t.prefill_steps + t.decode_steps - before.prefill_steps - before.decode_steps;
    out.loads = t.host_loads - before.host_loads;
    for (size_t i = 0; i < n; ++i) out.generated += int64_t(b.result(n + i).tokens.size());
    std::sort(first.begin(), first.end());
    out.ttft_p50_ms = n ? first[(n - 1) / 2] : 0.0;
    return out;
}

}  // namespace shardlm
