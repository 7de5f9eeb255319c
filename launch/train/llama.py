"""A Llama decoder in plain torch, computing what transformers' LlamaForCausalLM computes.

Pre-norm blocks: x += o_proj(attn(rope(q), rope(k), v)) on RMSNorm(x), then
x += down_proj(silu(gate_proj(h)) * up_proj(h)) on RMSNorm(x); final RMSNorm; logits
against the (tied) embedding matrix. RoPE is the "rotate half" form with
inv_freq[i] = theta^(-2i/head_dim) and cos/sin duplicated over both halves. GQA: each
group of n_heads / n_kv_heads query heads shares one key/value head. No biases.

Also: BF16 safetensors export/import with Hugging Face tensor names, and config.json.
"""
import json
import math
import struct
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaShape:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # HF: normalise in fp32, cast back to the input dtype, then scale.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_tables(head_dim, n_pos, theta, device=None):
    """cos, sin: [n_pos, head_dim], each frequency repeated over the two halves."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = torch.arange(n_pos, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq)            # [n_pos, head_dim/2]
    emb = torch.cat([freqs, freqs], dim=-1)       # [n_pos, head_dim]
    return emb.cos().to(device), emb.sin().to(device)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.nh, self.nkv, self.hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
        d = s.hidden_size
        self.q_proj = nn.Linear(d, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, d, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)    # [B, nh, T, hd]
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)   # [B, nkv, T, hd]
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        if rep > 1:  # query head h reads key/value head h // rep (expand: no copy in backward)
            k = k[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
            v = v[:, :, None].expand(B, self.nkv, rep, T, self.hd).reshape(B, self.nh, T, self.hd)
        # scores = q k^T / sqrt(hd) + causal mask (0 or -inf), fused in one baddbmm
        att = torch.baddbmm(mask.to(q.dtype), q.reshape(B * self.nh, T, self.hd),
                            k.reshape(B * self.nh, T, self.hd).transpose(1, 2),
                            alpha=1.0 / math.sqrt(self.hd)).view(B, self.nh, T, T)
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.mlp = MLP(s)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.shape = s
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        cos, sin = rope_tables(s.head_dim, s.max_position_embeddings, s.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self):
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # residual-branch outputs scaled down with depth (GPT-2 style)
                scale = 1.0 / math.sqrt(2 * self.shape.num_hidden_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
                nn.init.normal_(p, mean=0.0, std=std * scale)

    def forward(self, ids):
        """ids: [B, T] int64 -> logits [B, T, vocab] (positions 0..T-1)."""
        B, T = ids.shape
        x = self.embed_tokens(ids)
        cos = self.rope_cos[:T].to(x.dtype)
        sin = self.rope_sin[:T].to(x.dtype)
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1)  # additive causal mask
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        x = self.norm(x)
        return x @ self.embed_tokens.weight.t()  # tied lm_head

    def n_params(self):
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ HF names
    def hf_state(self):
        """HF tensor name -> tensor (no lm_head.weight: it is tied to the embedding)."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight}
        for i, l in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = l.input_layernorm.weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(l.self_attn, n).weight
            out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(l.mlp, n).weight
        out["model.norm.weight"] = self.norm.weight
        return out

    def load_hf_state(self, tensors):
        mine = self.hf_state()
        missing = set(mine) - set(tensors)
        if missing:
            raise KeyError(f"missing tensors: {sorted(missing)[:5]}")
        with torch.no_grad():
            for name, p in mine.items():
                t = tensors[name]
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"{name}: shape {tuple(t.shape)} != {tuple(p.shape)}")
                p.copy_(t.to(p.dtype))


def hf_config(s: LlamaShape, bos_id, eos_id):
    c = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    c.update(asdict(s))
    return dict(sorted(c.items()))


def shape_from_config(c):
    return LlamaShape(**{k: c[k] for k in LlamaShape.__dataclass_fields__})


# ------------------------------------------------------------------ safetensors
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}
_ST_FROM = {v: k for k, v in _ST_DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> torch tensor. Layout: u64 LE header length, JSON header, raw data.

    The header is padded with spaces to a multiple of 8 bytes so every tensor starts aligned.
    """
    names = sorted(tensors)
    header, blobs, off = {}, [], 0
    for n in names:
        t = tensors[n].detach().contiguous().cpu()
        # BF16 has no numpy dtype: move the raw 2-byte words through int16
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[n] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dt = _ST_FROM[info["dtype"]]
        buf = bytearray(data[base + a:base + b])
        if dt == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dt)
        out[name] = t.reshape(info["shape"])
    return out
