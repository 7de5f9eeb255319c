#!/usr/bin/env python3
"""Plain-PyTorch baseline for `shardlm bench`: a Qwen3 decoder (default: the Qwen3-1.7B shape) in FP16
with random weights and a static, preallocated KV cache, timed like `shardlm bench`.

    bench/torch_baseline.py [--batch 1,4] [--prompt-len 512] [--gen 128] [-r 3] [--graphs on,off]
                            [--shape qwen3-1.7b|tiny] [--model DIR] [--device cuda|cpu]
                            [--dump-logits FILE]

For every batch and graph mode it prints two JSON lines, named and shaped like `shardlm bench --json`
rows ("test": "pp512" then "tg128", "avg_ms" = the prefill, or all decode steps of one repeat), plus
"engine": "torch", "graphs", "prefill_ms" and "decode_ms_per_token". Timing follows shardlm bench: one
untimed prefill, then per repeat one timed prefill of the whole batch and `--gen` timed greedy decode
steps (torch.cuda.Event). With graphs on, one decode step (embedding, 28 layers, lm_head, argmax and
the position increment) is captured once as a torch.cuda.CUDAGraph and replayed, as a static-cache
Hugging Face generate with a compiled/captured step would; off runs the same ops eagerly.

The model is written out here (no transformers): pre-norm RMSNorm, fused q/k/v and gate/up
projections, per-head q/k RMSNorm, rotate-half RoPE, causal scaled_dot_product_attention over the
prompt, a grouped-query matmul attention over the static cache in decode, SwiGLU, tied lm_head.
Only the last position's logits are computed in prefill (as generate does).

Without torch or without a GPU it prints one JSON line {"engine": "torch", "skipped": reason} and
exits 0. `--device cpu --shape tiny` runs the same code on the CPU (eager only: a plumbing check).
`--model DIR` loads a checkpoint's weights instead (config.json + safetensors, e.g. one written by
`shardlm make-model`), and `--dump-logits FILE` writes each sequence's last-position logits of the
first prefill as a JSON array of arrays, like `shardlm generate --dump-logits`: a check that this
model computes what shardlm computes.
"""
import argparse
import glob
import json
import math
import os
import struct
import sys

SHAPES = {
    # hidden, layers, q heads, kv heads, head_dim, intermediate, vocab, rope theta, rms eps
    "qwen3-1.7b": dict(hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128, inter=6144,
                       vocab=151936, theta=1e6, eps=1e-6),
    "tiny": dict(hidden=128, layers=4, heads=4, kv_heads=2, head_dim=32, inter=256, vocab=512,
                 theta=1e4, eps=1e-6),
}


def skip(reason):
    print(f"torch_baseline: skipped: {reason}", file=sys.stderr)
    print(json.dumps({"engine": "torch", "skipped": reason}))
    sys.exit(0)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", default="1,4", help="comma-separated batch sizes")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("-r", type=int, default=3, help="repeats")
    ap.add_argument("--graphs", default="on,off", help="on, off or on,off")
    ap.add_argument("--shape", default="qwen3-1.7b", choices=sorted(SHAPES))
    ap.add_argument("--model", help="load weights from this checkpoint folder instead of random ones")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--dump-logits", help="write the first prefill's last-position logits here")
    a = ap.parse_args()
    a.batch = [int(b) for b in a.batch.split(",") if b]
    a.graphs = [g == "on" for g in a.graphs.split(",") if g]
    if not a.batch or min(a.batch) < 1 or a.prompt_len < 1 or a.gen < 1 or a.r < 1:
        ap.error("--batch, --prompt-len, --gen and -r must be >= 1")
    return a


def read_safetensors(path, torch):
    """name -> tensor (CPU) without the safetensors package: 8-byte header size, JSON header, data."""
    dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(f.read())
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        t = torch.frombuffer(data[b:e], dtype=dt[info["dtype"]]) if e > b else torch.empty(0, dtype=dt[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out


class Qwen3:
    """Weights, a static KV cache and the prefill/decode forward passes."""

    def __init__(self, torch, cfg, dtype, device, max_batch, max_ctx, tensors=None):
        self.t, self.cfg, self.dtype, self.dev = torch, cfg, dtype, device
        c = cfg
        H, D, Hq, Hkv, I = c["hidden"], c["head_dim"], c["heads"], c["kv_heads"], c["inter"]
        self.q_size, self.kv_size = Hq * D, Hkv * D
        g = torch.Generator(device=device)
        g.manual_seed(1)

        def rand(*shape, std=0.02):
            return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * std).to(dtype)

        def ones(n):
            return torch.ones(n, device=device, dtype=dtype)

        def get(name):
            return tensors[name].to(device=device, dtype=dtype)

        self.layers = []
        for i in range(c["layers"]):
            if tensors is None:
                L = dict(ln1=ones(H), ln2=ones(H), q_norm=ones(D), k_norm=ones(D),
                         wqkv=rand(Hq * D + 2 * Hkv * D, H), wo=rand(H, Hq * D),
                         wgu=rand(2 * I, H), wd=rand(H, I))
            else:
                p = f"model.layers.{i}."
                L = dict(ln1=get(p + "input_layernorm.weight"), ln2=get(p + "post_attention_layernorm.weight"),
                         q_norm=get(p + "self_attn.q_norm.weight"), k_norm=get(p + "self_attn.k_norm.weight"),
                         wqkv=torch.cat([get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight"),
                                         get(p + "self_attn.v_proj.weight")]),
                         wo=get(p + "self_attn.o_proj.weight"),
                         wgu=torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]),
                         wd=get(p + "mlp.down_proj.weight"))
            self.layers.append(L)
        if tensors is None:
            self.embed, self.norm = rand(c["vocab"], H), ones(H)
            self.lm_head = self.embed  # tied
        else:
            self.embed, self.norm = get("model.embed_tokens.weight"), get("model.norm.weight")
            self.lm_head = get("lm_head.weight") if "lm_head.weight" in tensors else self.embed
        self.weights_bytes = sum(v.numel() * v.element_size() for L in self.layers for v in L.values())
        self.weights_bytes += (self.embed.numel() + self.norm.numel()) * self.embed.element_size()
        if self.lm_head is not self.embed:
            self.weights_bytes += self.lm_head.numel() * self.lm_head.element_size()
        # RoPE tables (rotate-half layout, as Hugging Face): [max_ctx, head_dim]
        inv = 1.0 / (c["theta"] ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
        ang = torch.outer(torch.arange(max_ctx, device=device, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = ang.cos().to(dtype), ang.sin().to(dtype)
        # Static KV cache: per layer [max_batch, kv_heads, max_ctx, head_dim]
        self.k_cache = [torch.zeros(max_batch, Hkv, max_ctx, D, device=device, dtype=dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(max_batch, Hkv, max_ctx, D, device=device, dtype=dtype) for _ in self.layers]
        self.kv_bytes = 2 * sum(k.numel() * k.element_size() for k in self.k_cache)
        self.max_ctx = max_ctx
        self.ctx_ids = torch.arange(max_ctx, device=device)

    def rmsnorm(self, x, w):
        xf = x.float()
        return w * (xf * self.t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.cfg["eps"])).to(x.dtype)

    def rotate(self, x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + self.t.cat([-x[..., h:], x[..., :h]], dim=-1) * sin

    def qkv(self, L, h, cos, sin):
        """h [B, T, hidden] -> q [B, Hq, T, D], k, v [B, Hkv, T, D] after q/k norm and RoPE."""
        c, F = self.cfg, self.t.nn.functional
        B, T, _ = h.shape
        D = c["head_dim"]
        qkv = F.linear(self.rmsnorm(h, L["ln1"]), L["wqkv"])
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = self.rmsnorm(q.view(B, T, c["heads"], D), L["q_norm"]).transpose(1, 2)
        k = self.rmsnorm(k.view(B, T, c["kv_heads"], D), L["k_norm"]).transpose(1, 2)
        v = v.view(B, T, c["kv_heads"], D).transpose(1, 2)
        return self.rotate(q, cos, sin), self.rotate(k, cos, sin), v

    def mlp_out(self, L, h, attn):
        F = self.t.nn.functional
        h = h + F.linear(attn, L["wo"])
        gu = F.linear(self.rmsnorm(h, L["ln2"]), L["wgu"])
        g, u = gu.chunk(2, dim=-1)
        return h + F.linear(F.silu(g) * u, L["wd"])

    def logits(self, h_last):
        return self.t.nn.functional.linear(self.rmsnorm(h_last, self.norm), self.lm_head)

    def prefill(self, ids):
        """ids [B, T] at positions 0..T-1 -> last-position logits [B, vocab]; fills the cache."""
        torch, c = self.t, self.cfg
        B, T = ids.shape
        rep = c["heads"] // c["kv_heads"]
        h = self.embed[ids]
        cos, sin = self.cos[:T], self.sin[:T]
        for L, kc, vc in zip(self.layers, self.k_cache, self.v_cache):
            q, k, v = self.qkv(L, h, cos, sin)
            kc[:B, :, :T] = k
            vc[:B, :, :T] = v
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # old torch (CPU dry runs): the same math spelled out
                s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(c["head_dim"])
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
                a = (s.softmax(-1) @ v.float()).to(q.dtype)
            h = self.mlp_out(L, h, a.transpose(1, 2).reshape(B, T, self.q_size))
        return self.logits(h[:, -1])

    def decode(self, tok, pos):
        """One greedy step: tok [B, 1] at position pos ([1] tensor) -> next tokens written into tok,
        pos incremented. Only tensor ops with fixed shapes: the step can be captured as a graph."""
        torch, c = self.t, self.cfg
        B = tok.shape[0]
        Hkv, D = c["kv_heads"], c["head_dim"]
        G = c["heads"] // Hkv
        h = self.embed[tok]                          # [B, 1, hidden]
        cos, sin = self.cos.index_select(0, pos), self.sin.index_select(0, pos)
        masked = (self.ctx_ids > pos).view(1, 1, 1, -1)  # cache slots after pos
        scale = 1.0 / math.sqrt(D)
        for L, kc, vc in zip(self.layers, self.k_cache, self.v_cache):
            q, k, v = self.qkv(L, h, cos, sin)
            kc_b, vc_b = kc[:B], vc[:B]
            kc_b.index_copy_(2, pos, k)
            vc_b.index_copy_(2, pos, v)
            # grouped-query attention over the whole static cache, masked past pos: [B, Hkv, G, ctx]
            qg = q.view(B, Hkv, G, D)
            s = (qg @ kc_b.transpose(-1, -2)).float() * scale
            p = s.masked_fill(masked, float("-inf")).softmax(-1).to(q.dtype)
            a = (p @ vc_b).reshape(B, 1, c["heads"] * D)
            h = self.mlp_out(L, h, a)
        nxt = self.logits(h[:, -1]).argmax(-1)
        tok.copy_(nxt.view(B, 1))
        pos.add_(1)


def copy_gbps(torch, dev):
    """Device copy bandwidth counting bytes read and written (1 GiB buffers, best of 10)."""
    if dev != "cuda":
        return 0.0
    n = 1 << 29  # fp16 elements: 1 GiB
    a = torch.empty(n, dtype=torch.float16, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1))
    del a, b
    return 2 * n * 2 / (best / 1e3) / 1e9


class Timer:
    def __init__(self, torch, dev):
        self.t, self.dev = torch, dev

    def __enter__(self):
        if self.dev == "cuda":
            self.e0, self.e1 = self.t.cuda.Event(enable_timing=True), self.t.cuda.Event(enable_timing=True)
            self.e0.record()
        else:
            import time
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.dev == "cuda":
            self.e1.record()
            self.e1.synchronize()
            self.ms = self.e0.elapsed_time(self.e1)
        else:
            import time
            self.ms = (time.perf_counter() - self.t0) * 1e3


def stats(v):
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return m, sd


def main():
    a = parse_args()
    try:
        import torch
    except ImportError:
        skip("no torch in this python (%s)" % sys.executable)
    if a.device == "cuda" and not torch.cuda.is_available():
        skip("torch %s sees no CUDA GPU" % torch.__version__)
    dev = a.device
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True
    tensors, cfg = None, dict(SHAPES[a.shape])
    if a.model:
        j = json.load(open(os.path.join(a.model, "config.json")))
        cfg = dict(hidden=j["hidden_size"], layers=j["num_hidden_layers"], heads=j["num_attention_heads"],
                   kv_heads=j["num_key_value_heads"],
                   head_dim=j.get("head_dim") or j["hidden_size"] // j["num_attention_heads"],
                   inter=j["intermediate_size"], vocab=j["vocab_size"], theta=j.get("rope_theta", 1e4),
                   eps=j.get("rms_norm_eps", 1e-6))
        tensors = {}
        for f in sorted(glob.glob(os.path.join(a.model, "*.safetensors"))):
            tensors.update(read_safetensors(f, torch))
    # Half precision on the GPU; FP32 on the CPU (old CPU torch lacks many half kernels).
    dtype = torch.float16 if dev == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    peak = copy_gbps(torch, dev)
    max_b, ctx = max(a.batch), a.prompt_len + a.gen
    model = Qwen3(torch, cfg, dtype, dev, max_b, ctx, tensors)
    tensors = None
    c = model.cfg
    # Bytes one decode step reads, as shardlm bench counts them: weights once + KV up to the mean position.
    kv_row = 2 * c["layers"] * c["kv_heads"] * c["head_dim"] * model.k_cache[0].element_size()
    avg_pos = a.prompt_len + (a.gen - 1) / 2.0 + 1.0
    dumped = False
    with torch.inference_mode():
        for B in a.batch:
            ids = torch.tensor([[(b * 1000003 + i * 7919 + 11) % c["vocab"] for i in range(a.prompt_len)]
                                for b in range(B)], device=dev)
            tok = torch.zeros(B, 1, dtype=torch.long, device=dev)
            pos = torch.zeros(1, dtype=torch.long, device=dev)
            for graphs in a.graphs:
                if graphs and dev != "cuda":
                    print("torch_baseline: graphs need CUDA: skipping graphs=on", file=sys.stderr)
                    continue
                if dev == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                logits = model.prefill(ids)  # warm-up, untimed
                if a.dump_logits and not dumped:
                    with open(a.dump_logits, "w") as f:
                        json.dump(logits.float().cpu().tolist(), f)
                    dumped = True
                step = lambda: model.decode(tok, pos)
                if graphs:
                    tok.copy_(logits.argmax(-1).view(B, 1))
                    pos.fill_(a.prompt_len)
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for _ in range(2):
                            step()
                    torch.cuda.current_stream().wait_stream(s)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                    step = graph.replay
                pp, tg = [], []
                checksum = 0.0
                for _ in range(a.r):
                    with Timer(torch, dev) as t:
                        logits = model.prefill(ids)
                        tok.copy_(logits.argmax(-1).view(B, 1))
                        pos.fill_(a.prompt_len)
                    pp.append(t.ms)
                    with Timer(torch, dev) as t:
                        for _ in range(a.gen):
                            step()
                    tg.append(t.ms)
                    checksum = float(logits.float().sum())
                mem_peak = torch.cuda.max_memory_allocated() if dev == "cuda" else 0
                memory = {"weights_bytes": model.weights_bytes, "kv_cache_bytes": model.kv_bytes,
                          "workspace_bytes": max(0, mem_peak - model.weights_bytes - model.kv_bytes),
                          "peak_bytes": mem_peak}
                (pm, ps), (tm, ts) = stats(pp), stats(tg)
                step_bytes = model.weights_bytes + kv_row * avg_pos * B
                common = {"engine": "torch", "batch": B, "tp": 1, "device": f"{dev}({name})", "weights": "fp16" if dtype == torch.float16 else "fp32",
                          "kv": "fp16" if dtype == torch.float16 else "fp32", "graphs": graphs, "prompt_len": a.prompt_len,
                          "gen": a.gen, "prefill_ms": pm, "decode_ms_per_token": tm / a.gen}
                rows = [
                    {"test": f"pp{a.prompt_len}", **common, "avg_ms": pm, "stddev_ms": ps,
                     "tokens_per_s": a.prompt_len * B * 1e3 / pm, "gbps": 0.0},
                    {"test": f"tg{a.gen}", **common, "avg_ms": tm, "stddev_ms": ts,
                     "tokens_per_s": a.gen * B * 1e3 / tm, "gbps": step_bytes / (tm / a.gen / 1e3) / 1e9},
                ]
                for r in rows:
                    r.update(peak_gbps=peak, memory=memory, logits_checksum=checksum,
                             torch_version=torch.__version__)
                    print(json.dumps(r), flush=True)
                del step
                if graphs:
                    del graph
    return 0


if __name__ == "__main__":
    sys.exit(main())
