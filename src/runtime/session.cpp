#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace shardlm {

std::unique_ptr<Session> open_session(const SessionOptions& opt, Communicator& comm) {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = std::make_unique<Session>();
    s->cfg = load_config(opt.model_dir);
    const ModelConfig& c = s->cfg;
    if (opt.ctx < 1) fail("--ctx must be at least 1");
    if (c.max_position > 0 && opt.ctx > c.max_position)
        fail("--ctx ", opt.ctx, " exceeds the model's max_position_embeddings ", c.max_position);
    if (c.sliding_window > 0 && opt.ctx > c.sliding_window)
        fail("--ctx ", opt.ctx, " exceeds the model's sliding_window ", c.sliding_window,
             "; sliding-window attention is not implemented, use --ctx <= ", c.sliding_window);
    s->ckpt = std::make_unique<Checkpoint>(opt.model_dir);
    s->weights = load_weights(*s->ckpt, c, opt.load, plan_shard(c, comm.rank(), comm.size()));
    EngineOptions eo;
    eo.max_batch = opt.max_batch;
    eo.ctx = opt.ctx;
    eo.max_step_tokens = std::max(opt.prefill_chunk, opt.max_batch);
    eo.kv = kv_dtype(opt.kv);
    eo.max_logit_rows = opt.max_logit_rows;
    s->engine = std::make_unique<Engine>(s->cfg, s->weights, comm, eo);
    s->load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

}  // namespace shardlm
