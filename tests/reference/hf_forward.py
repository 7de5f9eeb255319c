#!/usr/bin/python3
"""Independent NumPy reference of the Hugging Face Llama-family forward pass.

Covers LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
Qwen3ForCausalLM as implemented by transformers' modeling_{llama,mistral,
qwen2,qwen3}.py. All math is float32 (weights are converted on load). Used by
the tests to check the C++ engine; it needs only python3 + numpy.

Usage:
  hf_forward.py --model DIR --prompt-ids "1,2,3;4,5" --max-new-tokens N [--ctx-check]
  hf_forward.py --model DIR --prompt-ids "1,2,3;4,5" --embed last|mean|cls
  hf_forward.py --model DIR --prompt-ids "1,2,3;4,5" --classify
Prints {"results": [{"tokens": [...], "last_logits": [...]}, ...]} on stdout,
one entry per ';'-separated prompt. Greedy decoding, full recompute per step.
--ctx-check additionally requires prompt+new tokens <= max_position_embeddings
and re-runs the final sequence once, checking causality: the logits at the
prompt's last position must be unchanged and every generated token must be the
argmax at its position; adds "ctx_check_max_abs_diff" to each result.
--embed prints {"results": [{"embedding": [...]}, ...]} instead: the final hidden
states pooled as sentence-transformers pools them (last token, mean, first
token), not normalized. --classify prints {"results": [{"logits": [...]}]}: a
...ForSequenceClassification model's score head on the last token's state.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

F32 = np.float32
ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def die(msg):
    print(f"hf_forward.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


# ---------------------------------------------------------------- safetensors
def read_safetensors_header(path):
    """Returns (header dict, byte offset of the data section)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n).decode("utf-8"))
    header.pop("__metadata__", None)
    return header, 8 + n


class Checkpoint:
    """Lazy name -> float32 ndarray access over one or several safetensors files."""

    def __init__(self, model_dir):
        index = os.path.join(model_dir, "model.safetensors.index.json")
        single = os.path.join(model_dir, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        elif os.path.exists(single):
            files = ["model.safetensors"]
        else:
            die(f"no model.safetensors or model.safetensors.index.json in {model_dir}")
        self.entries = {}  # name -> (memmap of the file, data start, info)
        for fn in files:
            path = os.path.join(model_dir, fn)
            if not os.path.exists(path):
                die(f"missing shard {path}")
            header, start = read_safetensors_header(path)
            mm = np.memmap(path, dtype=np.uint8, mode="r")
            for name, info in header.items():
                self.entries[name] = (mm, start, info)
        # A checkpoint saved from the base model class (Qwen3-Embedding's Qwen3Model) names its
        # tensors without the "model." prefix; transformers maps them onto the same modules.
        names = [n for n in self.entries if n != "__metadata__"]
        if "embed_tokens.weight" in self.entries and not any(n.startswith("model.") for n in names):
            self.entries = {("model." + n if n != "__metadata__" else n): e for n, e in self.entries.items()}

    def has(self, name):
        return name in self.entries

    def get(self, name, shape=None):
        if name not in self.entries:
            die(f"missing tensor {name}")
        mm, start, info = self.entries[name]
        b, e = info["data_offsets"]
        raw = mm[start + b:start + e]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2").astype(F32)
        elif dt == "BF16":  # bf16 is the top 16 bits of an IEEE float32
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(F32)
        elif dt == "F64":
            arr = np.frombuffer(raw, dtype="<f8").astype(F32)
        else:
            die(f"tensor {name}: unsupported dtype {dt}")
        if shape is not None and list(info["shape"]) != list(shape):
            die(f"tensor {name}: shape {info['shape']}, config implies {list(shape)}")
        return np.array(arr, dtype=F32).reshape(info["shape"])  # owned, float32


# ---------------------------------------------------------------- model
class Model:
    def __init__(self, model_dir):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.cfg = cfg
        arch = (cfg.get("architectures") or [None])[0]
        # The family's causal-LM class stands for the family; the suffix says what sits on top
        # (transformers' ...Model has no head, ...ForSequenceClassification a score Linear).
        self.head = "causal"
        for suffix, head in (("ForSequenceClassification", "classifier"), ("Model", "base")):
            if arch and arch.endswith(suffix) and arch[:-len(suffix)] + "ForCausalLM" in ARCHS:
                arch, self.head = arch[:-len(suffix)] + "ForCausalLM", head
        if arch not in ARCHS:
            die(f"unknown architecture {arch!r} (supported: {', '.join(ARCHS)})")
        self.arch = arch
        if cfg.get("hidden_act", "silu") != "silu":
            die(f"unsupported hidden_act {cfg.get('hidden_act')!r}")
        self.hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.n_layers = cfg["num_hidden_layers"]
        self.eps = F32(cfg.get("rms_norm_eps", 1e-6))
        eos = cfg.get("eos_token_id")
        self.eos = set() if eos is None else set(eos if isinstance(eos, list) else [eos])
        self.inv_freq = self._rope_inv_freq()
        self.attention_factor = self._attention_factor()
        self.windows = self._sliding_windows()

        ck = Checkpoint(model_dir)
        # Qwen2 always has q/k/v biases; Llama/Mistral/Qwen3 only with attention_bias.
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
        self.embed = ck.get("model.embed_tokens.weight")
        hid, inter = self.hidden, cfg["intermediate_size"]
        qd, kvd = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        shapes = {"input_layernorm": [hid], "post_attention_layernorm": [hid],
                  "self_attn.q_proj": [qd, hid], "self_attn.k_proj": [kvd, hid],
                  "self_attn.v_proj": [kvd, hid], "self_attn.o_proj": [hid, qd],
                  "mlp.gate_proj": [inter, hid], "mlp.up_proj": [inter, hid],
                  "mlp.down_proj": [hid, inter]}
        self.layers = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            L = {k: ck.get(p + k + ".weight", shp) for k, shp in shapes.items()}
            for k, n in (("q", qd), ("k", kvd), ("v", kvd)):
                L[f"{k}_bias"] = ck.get(p + f"self_attn.{k}_proj.bias", [n]) if qkv_bias else None
            if arch == "Qwen3ForCausalLM":
                L["q_norm"] = ck.get(p + "self_attn.q_norm.weight", [self.head_dim])
                L["k_norm"] = ck.get(p + "self_attn.k_norm.weight", [self.head_dim])
            self.layers.append(L)
        self.norm = ck.get("model.norm.weight")
        # Tied embeddings: HF's tie_weights() makes lm_head share embed_tokens.
        if self.head == "classifier":
            # LlamaForSequenceClassification: score = Linear(hidden, num_labels, bias=False)
            self.lm_head = None
            n_labels = len(cfg["id2label"]) if "id2label" in cfg else cfg.get("num_labels", 2)
            self.score = ck.get("score.weight", [n_labels, self.hidden])
        elif self.head == "base":
            self.lm_head = None
        elif cfg.get("tie_word_embeddings", False):
            self.lm_head = self.embed
        else:
            self.lm_head = ck.get("lm_head.weight")

    def _rope_inv_freq(self):
        """inv_freq[j] = 1 / theta^(2j/d), in float32 like HF (+ llama3/linear/yarn scaling)."""
        cfg = self.cfg
        rp = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        theta = rp.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rtype = rp.get("rope_type", rp.get("type", "default"))
        d = self.head_dim
        exps = np.arange(0, d, 2, dtype=np.int64).astype(F32) / F32(d)
        inv = (F32(1.0) / (F32(theta) ** exps)).astype(F32)
        if rtype == "default":
            return inv
        if rtype == "linear":
            return (inv / F32(rp["factor"])).astype(F32)
        if rtype == "yarn":
            # HF _compute_yarn_parameters with the factor as given (vLLM's YaRN): dimensions
            # below `low` keep their frequency, those above `high` are divided by factor, a
            # linear ramp in between; low/high are the dimensions turning beta_fast/beta_slow
            # times over the original context.
            factor = F32(rp["factor"])
            orig = rp.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
            beta_fast, beta_slow = rp.get("beta_fast") or 32, rp.get("beta_slow") or 1

            def dim_of(rotations):
                return (d * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(theta))

            low, high = dim_of(beta_fast), dim_of(beta_slow)
            if rp.get("truncate", True):
                low, high = math.floor(low), math.ceil(high)
            low, high = max(low, 0), min(high, d - 1)
            if low == high:
                high += 0.001
            ramp = np.clip((np.arange(d // 2, dtype=F32) - F32(low)) / F32(high - low), 0, 1).astype(F32)
            keep = (F32(1) - ramp).astype(F32)  # HF's inv_freq_extrapolation_factor
            pos = (F32(theta) ** exps).astype(F32)
            return ((F32(1) / (factor * pos)) * (F32(1) - keep) + (F32(1) / pos) * keep).astype(F32)
        if rtype != "llama3":
            die(f"unsupported rope type {rtype!r}")
        # HF _compute_llama3_parameters: long wavelengths are divided by factor,
        # short ones kept, and the band in between blended linearly in 1/wavelen.
        factor = rp["factor"]
        low, high = rp["low_freq_factor"], rp["high_freq_factor"]
        old_ctx = rp["original_max_position_embeddings"]
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wavelen = ((F32(1) / inv) * F32(2 * math.pi)).astype(F32)  # torch: recip * scalar
        scaled = np.where(wavelen > low_wl, inv / F32(factor), inv).astype(F32)
        smooth = ((F32(old_ctx) / wavelen - F32(low)) / F32(high - low)).astype(F32)
        blended = ((F32(1) - smooth) * scaled / F32(factor) + smooth * scaled).astype(F32)
        medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
        return np.where(medium, blended, scaled).astype(F32)

    def _attention_factor(self):
        """YaRN's factor on cos and sin: given, or 0.1 ln(factor) + 1 (DeepSeek: a ratio of two)."""
        rp = self.cfg.get("rope_parameters") or self.cfg.get("rope_scaling") or {}
        if rp.get("rope_type", rp.get("type")) != "yarn":
            return 1.0
        if rp.get("attention_factor") is not None:
            return rp["attention_factor"]

        def mscale(m):
            return 1.0 if rp["factor"] <= 1 else 0.1 * m * math.log(rp["factor"]) + 1.0

        if rp.get("mscale") and rp.get("mscale_all_dim"):
            return mscale(rp["mscale"]) / mscale(rp["mscale_all_dim"])
        return mscale(1.0)

    def _sliding_windows(self):
        """Per-layer sliding window size (None = full causal attention)."""
        cfg, n = self.cfg, self.n_layers
        w = cfg.get("sliding_window")
        if cfg.get("layer_types"):
            return [w if t == "sliding_attention" else None for t in cfg["layer_types"]]
        if self.arch == "MistralForCausalLM":
            return [w] * n
        if cfg.get("use_sliding_window", False) and w:  # Qwen2/Qwen3 style
            mwl = cfg.get("max_window_layers", n)
            return [w if i >= mwl else None for i in range(n)]
        return [None] * n

    def rms_norm(self, x, w):
        # x * rsqrt(mean(x^2) + eps) * weight, all float32
        var = np.mean(x * x, axis=-1, keepdims=True, dtype=F32)
        return (w * (x / np.sqrt(var + self.eps))).astype(F32)

    def rope(self, x, cos, sin):
        # x: [heads, n, d]. rotate_half pairs element i with i + d/2:
        # out = x*cos + cat(-x2, x1)*sin
        h = x.shape[-1] // 2
        rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
        return (x * cos + rot * sin).astype(F32)

    def forward(self, ids, hidden=False):
        """Returns float32 logits [n, vocab] for token ids [n] (positions 0..n-1), or with hidden the final norm's output [n, hidden]."""
        n, H, KV, D = len(ids), self.n_heads, self.n_kv, self.head_dim
        x = self.embed[np.asarray(ids)].astype(F32)  # [n, hidden]
        # cos/sin tables: freqs = pos (outer) inv_freq, duplicated for both halves.
        freqs = np.outer(np.arange(n, dtype=F32), self.inv_freq).astype(F32)
        emb = np.concatenate([freqs, freqs], axis=-1)
        # HF's attention_scaling (YaRN's attention factor) multiplies both tables.
        af = F32(self.attention_factor)
        cos, sin = (np.cos(emb) * af).astype(F32), (np.sin(emb) * af).astype(F32)  # [n, D]
        qi, kj = np.arange(n)[:, None], np.arange(n)[None, :]
        scale = F32(D ** -0.5)
        for L, win in zip(self.layers, self.windows):
            # ---- self attention (pre-norm)
            hsn = self.rms_norm(x, L["input_layernorm"])
            q = hsn @ L["self_attn.q_proj"].T
            k = hsn @ L["self_attn.k_proj"].T
            v = hsn @ L["self_attn.v_proj"].T
            if L["q_bias"] is not None:
                q, k, v = q + L["q_bias"], k + L["k_bias"], v + L["v_bias"]
            q = q.reshape(n, H, D).transpose(1, 0, 2)   # [H, n, D]
            k = k.reshape(n, KV, D).transpose(1, 0, 2)  # [KV, n, D]
            v = v.reshape(n, KV, D).transpose(1, 0, 2)
            if "q_norm" in L:  # Qwen3: per-head RMSNorm over head_dim, before RoPE
                q, k = self.rms_norm(q, L["q_norm"]), self.rms_norm(k, L["k_norm"])
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            # GQA: query head h reads kv head h // (H / KV)
            rep = H // KV
            k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
            scores = (q @ k.transpose(0, 2, 1)) * scale  # [H, n, n]
            allowed = kj <= qi  # causal
            if win:
                allowed = allowed & (kj > qi - win)
            scores = np.where(allowed, scores, F32(-np.inf))
            scores = scores - scores.max(axis=-1, keepdims=True)
            p = np.exp(scores)
            p = (p / p.sum(axis=-1, keepdims=True)).astype(F32)
            attn = (p @ v).transpose(1, 0, 2).reshape(n, H * D)
            x = (x + attn @ L["self_attn.o_proj"].T).astype(F32)
            # ---- MLP (pre-norm): down(silu(gate(x)) * up(x))
            hsn = self.rms_norm(x, L["post_attention_layernorm"])
            g = hsn @ L["mlp.gate_proj"].T
            with np.errstate(over="ignore"):
                g = g / (F32(1) + np.exp(-g))  # silu
            x = (x + (g * (hsn @ L["mlp.up_proj"].T)) @ L["mlp.down_proj"].T).astype(F32)
        x = self.rms_norm(x, self.norm)
        if hidden:
            return x  # the last hidden state, what AutoModel hands sentence-transformers
        return (x @ self.lm_head.T).astype(F32)

    def generate(self, prompt, max_new):
        """Greedy decoding with full recompute. Returns (tokens, last_logits, seq)."""
        seq = list(prompt)
        logits = last_logits = self.forward(seq)[-1]
        tokens = []
        for step in range(max_new):
            tok = int(np.argmax(logits))  # first maximum -> lowest id on ties
            tokens.append(tok)
            seq.append(tok)
            if tok in self.eos or step == max_new - 1:
                break
            logits = self.forward(seq)[-1]
        return tokens, last_logits, seq


def parse_prompts(s):
    prompts = []
    for part in s.split(";"):
        part = part.strip()
        if not part:
            die("empty prompt in --prompt-ids")
        try:
            prompts.append([int(t) for t in part.split(",")])
        except ValueError:
            die(f"bad token id list {part!r}")
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF checkpoint directory")
    ap.add_argument("--prompt-ids", required=True, help='prompts, e.g. "1,2,3;4,5"')
    ap.add_argument("--max-new-tokens", type=int)
    ap.add_argument("--embed", choices=("last", "mean", "cls"),
                    help="print pooled final hidden states instead of generating")
    ap.add_argument("--classify", action="store_true",
                    help="print a sequence-classification model's logits at the last token")
    ap.add_argument("--ctx-check", action="store_true",
                    help="check context length and causal consistency of the result")
    args = ap.parse_args()
    if (args.max_new_tokens is not None) + (args.embed is not None) + args.classify != 1:
        die("give one of --max-new-tokens, --embed and --classify")

    model = Model(args.model)
    vocab = model.embed.shape[0]
    results = []
    for prompt in parse_prompts(args.prompt_ids):
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            die(f"token ids out of range [0, {vocab}): {bad}")
        if args.ctx_check:
            limit = model.cfg.get("max_position_embeddings")
            if limit and len(prompt) + args.max_new_tokens > limit:
                die(f"prompt ({len(prompt)}) + max_new_tokens ({args.max_new_tokens}) "
                    f"exceeds max_position_embeddings ({limit})")
        if args.classify:
            if model.head != "classifier":
                die("--classify needs a ...ForSequenceClassification model")
            h = model.forward(prompt, hidden=True).astype(np.float64)
            # transformers pools the rightmost token that is not pad_token_id (argmax of
            # index * mask: the first token when all are pads); without one, the last token.
            pad = model.cfg.get("pad_token_id")
            last = len(prompt) - 1
            if pad is not None:
                last = int(np.argmax(np.arange(len(prompt)) * (np.asarray(prompt) != pad)))
            logits = model.score.astype(np.float64) @ h[last]
            results.append({"logits": [float(v) for v in logits]})
            continue
        if args.embed:
            h = model.forward(prompt, hidden=True).astype(np.float64)
            pooled = h[-1] if args.embed == "last" else h[0] if args.embed == "cls" else h.mean(axis=0)
            results.append({"embedding": [float(v) for v in pooled]})
            continue
        tokens, last_logits, seq = model.generate(prompt, args.max_new_tokens)
        res = {"tokens": tokens, "last_logits": [float(v) for v in last_logits]}
        if args.ctx_check:
            # Later tokens must not change earlier positions (causal mask), and
            # each generated token must be the argmax of the position before it.
            full = model.forward(seq)
            n0 = len(prompt)
            diff = float(np.max(np.abs(full[n0 - 1] - last_logits)))
            # (a generated token may lose a near-tie to rounding, hence the slack)
            gaps = [float(full[n0 - 1 + i].max() - full[n0 - 1 + i][t])
                    for i, t in enumerate(tokens)]
            if diff > 1e-3 or max(gaps, default=0.0) > 1e-3:
                die(f"ctx-check failed: max |dlogits| = {diff}, argmax gaps {gaps}")
            res["ctx_check_max_abs_diff"] = diff
        results.append(res)
    json.dump({"results": results}, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
