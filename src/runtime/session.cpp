#include "runtime/session.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>

#include "core/error.h"
#include "core/host_memory.h"
#include "runtime/cpu_engine.h"
#ifdef SHARDLM_HAVE_CUDA
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device.h"
#include "runtime/cuda_engine.h"
#endif
#ifdef SHARDLM_HAVE_MPI
#include "comm/mpi_comm.h"
#endif
#ifdef SHARDLM_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif

namespace shardlm {

Device parse_device(const std::string& s) {
    if (s == "auto") return Device::Auto;
    if (s == "cpu") return Device::Cpu;
    if (s == "cuda" || s == "gpu") return Device::Cuda;
    fail("--device: unknown device \"", s, "\" (auto, cpu, cuda)");
}

namespace {

// Ranks of this node: one GPU each under TP, and sharers of its host memory.
int ranks_on_node(Communicator& comm) {
#ifdef SHARDLM_HAVE_MPI
    if (auto* mpi = dynamic_cast<MpiComm*>(&comm)) return mpi->local_size();
#endif
    (void)comm;
    return 1;
}

Device resolve_device(Device want, Communicator& comm) {
#ifdef SHARDLM_HAVE_CUDA
    if (want == Device::Cpu) return Device::Cpu;
    const int gpus = cuda_usable_device_count();
    const int local = ranks_on_node(comm);
    if (want == Device::Auto) return gpus >= local && gpus > 0 ? Device::Cuda : Device::Cpu;
    if (gpus == 0)
        fail("--device cuda: no usable CUDA device on rank ", comm.rank(),
             " (no GPU, or a driver older than this build's CUDA runtime); use --device cpu");
    if (local > gpus)
        fail("--device cuda: ", local, " ranks on rank ", comm.rank(), "'s node but only ", gpus,
             " CUDA devices; start at most one rank per GPU");
    return Device::Cuda;
#else
    if (want == Device::Cuda) fail("--device cuda: this build has no CUDA backend (rebuild where nvcc is installed)");
    (void)comm;
    return Device::Cpu;
#endif
}

// The flags behind opt.ctx: "--ctx N", or those it was derived from (ctx_origin; a derived ctx may
// be a saturated sum, never to be shown as a "--ctx N" the user did not give).
std::string ctx_flags(const SessionOptions& opt) {
    return opt.ctx_origin.empty() ? "--ctx " + std::to_string(opt.ctx) : opt.ctx_origin;
}

// The flags behind a step of `step` tokens: --prefill-chunk (or chunk_origin), or the cache's
// ctx x batch when engine_options capped the chunk there.
std::string step_flags(const SessionOptions& opt, int64_t step) {
    if (step < opt.prefill_chunk) return ctx_flags(opt) + " x batch " + std::to_string(opt.max_batch);
    return opt.chunk_origin.empty() ? "--prefill-chunk " + std::to_string(opt.prefill_chunk) : opt.chunk_origin;
}

}  // namespace

EngineOptions engine_options(const SessionOptions& opt) {
    EngineOptions eo;
    eo.max_batch = opt.max_batch;
    eo.ctx = opt.ctx;
    // A step never holds more tokens than the cache slots can take (ctx x max_batch): a larger
    // --prefill-chunk would only size the workspace for tokens that cannot come (and could ask for
    // more memory than exists).
    int64_t step = opt.prefill_chunk;
    if (opt.ctx > 0 && opt.max_batch > 0 && opt.ctx <= std::numeric_limits<int64_t>::max() / opt.max_batch)
        step = std::min(step, opt.ctx * opt.max_batch);
    eo.max_step_tokens = std::max(step, opt.max_batch);
    eo.kv = kv_dtype(opt.kv);
    eo.max_penalties = opt.max_penalties;
    eo.max_adapters = opt.max_loras;
    return eo;
}

void check_context(const ModelConfig& c, const SessionOptions& opt) {
    const bool derived = !opt.ctx_origin.empty();
    const std::string what = ctx_flags(opt);
    if (opt.ctx < 1) fail(derived ? what : "--ctx", " must be at least 1");
    if (c.max_position > 0 && opt.ctx > c.max_position)
        fail(what, " exceeds the model's max_position_embeddings ", c.max_position);
    // Every KV head: no rank holds more than TP=1 does. KV auto is fp32, the widest the GPU picks too.
    if (!kv_cache_fits(kv_cache_shape(c, c.n_kv_heads, engine_options(opt))))
        fail(what, " x batch ", opt.max_batch, ": the KV cache would need more than 2^63 bytes");
}

std::unique_ptr<Session> open_session(const SessionOptions& opt, Communicator& comm) {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = std::make_unique<Session>();
    s->cfg = load_config(opt.model_dir);
    const ModelConfig& c = s->cfg;
    check_context(c, opt);
    const Device device = resolve_device(opt.device, comm);
    if (opt.batch_invariant && device == Device::Cuda)
        fail("--batch-invariant: the CUDA engine's kernels are not batch-invariant (its GEMMs and GEMVs differ); "
             "run it with --device cpu");
    s->ckpt = std::make_unique<Checkpoint>(opt.model_dir);
    LoadOptions lo = opt.load;
    lo.ranks_on_node = ranks_on_node(comm);  // they convert their slices from the same host memory
    lo.copy_mapped = lo.copy_mapped && device == Device::Cpu;  // the GPU uploads from the map: a copy buys nothing
    s->weights = load_weights(*s->ckpt, c, lo, plan_shard(c, comm.rank(), comm.size()));
    for (const auto& [name, ad] : opt.adapters)
        s->adapters.push_back(load_lora_weights(name, ad, *s->ckpt, c, s->weights, lora_factor_dtype(s->weights), opt.max_lora_rank));
    EngineOptions eo = engine_options(opt);
    eo.max_logit_rows = std::min(opt.max_logit_rows, eo.max_step_tokens);  // a step's rows at most
    eo.attention = opt.attention;
    eo.batch_invariant = opt.batch_invariant;
    eo.cuda_graphs = opt.cuda_graphs;
    eo.fused_rope = opt.fused_rope;
    eo.fused_norm = opt.fused_norm;
    eo.gemm_staging = opt.gemm_staging;
    eo.ranks_on_node = ranks_on_node(comm);
    if (device == Device::Cpu) {
        try {
            auto cpu = std::make_unique<CpuEngine>(s->cfg, s->weights, comm, eo);
            cpu->set_adapters(&s->adapters);
            s->engine = std::move(cpu);
        } catch (const KVCacheAllocError& e) {
            // Within 2^63 bytes (check_context) but more than the machine gives: name the flags
            // behind the size, not a bare "out of memory" (or a SIGKILL from the OOM killer).
            // Under TP the bytes are this rank's share (run_together names the rank).
            const std::string needs = cat(ctx_flags(opt), " x batch ", opt.max_batch, ": the KV cache",
                                          comm.size() > 1 ? " (this rank's share)" : "", " needs ", format_gib(e.bytes),
                                          " GiB (", e.bytes, " bytes)");
            if (e.available == SIZE_MAX) fail(needs, ", allocation failed");
            // Several ranks on this node: each has its part of the node's figure.
            fail(needs, can_back_only({e.available, e.source}, e.ranks_on_node));
        } catch (const WorkspaceAllocError& e) {
            const std::string what = e.bytes == SIZE_MAX ? std::string("more than 2^64 bytes")
                                                         : format_gib(e.bytes) + " GiB (" + std::to_string(e.bytes) + " bytes)";
            fail(step_flags(opt, e.step_tokens), ": a step of ", e.step_tokens, " tokens needs a workspace buffer of ",
                 what, ", allocation failed");
        }
    } else {
#ifdef SHARDLM_HAVE_CUDA
        // KV auto on the GPU: FP32 for FP32 checkpoints (exact comparisons), FP16 otherwise.
        if (opt.kv == KVFormat::Auto) eo.kv = s->weights.embed.dtype == DType::F32 ? DType::F32 : DType::F16;
        Communicator* data = &comm;
        cudaStream_t stream = nullptr;
        std::function<void()> wait;
        if (comm.size() > 1) {
#ifdef SHARDLM_HAVE_NCCL
            auto* mpi = dynamic_cast<MpiComm*>(&comm);
            SHARDLM_CHECK(mpi, "tensor parallelism on GPUs needs the MPI communicator");
            auto nccl = std::make_unique<NcclComm>(*mpi);  // selects this node-local rank's GPU
            NcclComm* raw = nccl.get();
            stream = raw->stream();
            wait = [raw] { raw->synchronize(); };
            data = raw;
            s->data_comm = std::move(nccl);
#elif defined(SHARDLM_CUDA_EMU)
            // The CPU CUDA emulator (tests/cuda_emu): "device" memory is host memory, so the host
            // communicator is the data plane and the CUDA engine's tensor parallelism runs under
            // mpirun on CPU ranks. A test build only: the real one has NCCL or refuses.
            CUDA_CHECK(cudaSetDevice(0));
#else
            fail("--device cuda with ", comm.size(), " ranks needs NCCL, which this build lacks");
#endif
        } else {
            CUDA_CHECK(cudaSetDevice(0));
        }
        try {
            s->engine = std::make_unique<CudaEngine>(s->cfg, s->weights, *data, stream, wait, eo);
            s->engine->set_adapters(&s->adapters);
        } catch (const DeviceFitError& e) {
            // The engine knows the bytes, the session the flags behind them (a derived --ctx, a
            // --prefill-chunk capped at ctx x batch).
            fail("the model does not fit on ", e.device, " (rank ", e.rank, "): it needs ", format_gib(e.need), " GiB (weights ",
                 format_gib(e.weights), ", KV cache ", format_gib(e.kv), " for ", ctx_flags(opt), " x batch ", opt.max_batch,
                 ", workspace ", format_gib(e.workspace), " for steps of ", eo.max_step_tokens, " tokens from ",
                 step_flags(opt, eo.max_step_tokens), ") and ", format_gib(e.free),
                 " GiB are free; lower those flags, use --weights int8 / --kv int8, or add ranks");
        }
        // The GPU holds the weights now: drop the host copies (quantized or converted buffers),
        // keeping the plan and format the reports print.
        ModelWeights kept;
        kept.plan = s->weights.plan;
        kept.format = s->weights.format;
        kept.group_size = s->weights.group_size;
        kept.bytes = s->weights.bytes;
        kept.headless = s->weights.headless;
        kept.score = std::move(s->weights.score);  // the classifier head runs on the host (runtime/classify.h)
        s->weights = std::move(kept);
#else
        fail("--device cuda: this build has no CUDA backend");
#endif
    }
    s->load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return s;
}

}  // namespace shardlm
