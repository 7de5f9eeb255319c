#!/usr/bin/python3
"""Trains launch/models/kjv-small: a byte-level BPE tokenizer and a small Llama on the KJV Bible.

CPU only, run by hand (see README.md here). Stages, all in one run:
  1. corpus     `bible` (Debian bible-kjv) -> verse text; every 30th chapter held out -> heldout.txt
  2. tokenizer  byte-level BPE on the training books -> tokenizer.json, tokenizer_config.json
  3. model      Llama (GQA, RoPE, SwiGLU, tied embeddings) trained with AdamW and a cosine
                learning rate, for --minutes of wall time (the schedule follows elapsed time,
                so a busy machine gets fewer steps, not a longer run) or for --steps steps
  4. export     config.json + model.safetensors (BF16), then losses of the exported (BF16-rounded)
                weights on the held-out text and on a fixed sample of training windows
Writes the model folder (--out) and, in --work, the fp32 checkpoint and train_log.json.
"""
import argparse
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import corpus  # noqa: E402
from llama import Llama, LlamaShape, hf_config, write_safetensors, read_safetensors  # noqa: E402

EOT = "<|endoftext|>"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def tokenizer_config(max_len, eot_id):
    tok = {"content": EOT, "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {str(eot_id): tok},
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": None,
        "pad_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


@torch.no_grad()
def mean_loss(model, windows, batch):
    """windows: [N, ctx+1] int64. Mean next-token cross-entropy (nats) over all N*ctx targets."""
    model.eval()
    total, n = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i:i + batch]
        logits = model(w[:, :-1])
        total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                 reduction="sum").item()
        n += w[:, 1:].numel()
    model.train()
    return total / n


def windows_of(ids, ctx):
    """Non-overlapping windows of ctx+1 tokens (the last token of one is the first of the next)."""
    t = torch.tensor(ids, dtype=torch.int64)
    n = (len(ids) - 1) // ctx
    return torch.stack([t[i * ctx:i * ctx + ctx + 1] for i in range(n)])


def lr_at(frac, step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    frac = min(max(frac, 0.0), 1.0)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * frac))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, "launch/models/kjv-small"))
    p.add_argument("--work", default=os.path.join(ROOT, "build-kjv"), help="scratch folder (git-ignored)")
    p.add_argument("--vocab", type=int, default=3072)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=640)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ctx", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--minutes", type=float, default=30.0, help="training wall-time budget")
    p.add_argument("--steps", type=int, default=0, help="train this many steps instead of --minutes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    t_start = time.time()

    # 1. corpus
    chapters = corpus.read_bible()
    books, held = corpus.split(chapters)
    held_text = corpus.heldout_text(held)
    with open(os.path.join(a.out, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(held_text)
    with open(os.path.join(a.work, "train.txt"), "w", encoding="utf-8") as f:
        f.write(("\n" + EOT + "\n").join(t for _, t in books))
    log(f"corpus: {len(books)} books, {len(chapters) - len(held)} training chapters "
        f"({sum(len(t) for _, t in books)} chars), {len(held)} held-out chapters ({len(held_text)} chars)")

    # 2. tokenizer
    t0 = time.time()
    vocab, merges = bpe.train_bpe([t for _, t in books], a.vocab, [EOT])
    tok = bpe.Tokenizer(vocab, merges, [EOT])
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(1024, vocab[EOT]), f, indent=2)
        f.write("\n")
    eot = vocab[EOT]
    train_ids = []
    for _, t in books:  # each book is a document, followed by <|endoftext|>
        train_ids.extend(tok.encode(t, allow_special=False))
        train_ids.append(eot)
    held_ids = tok.encode(held_text, allow_special=False)
    log(f"tokenizer: {len(vocab)} tokens, {len(merges)} merges in {time.time() - t0:.1f}s; "
        f"train {len(train_ids)} tokens ({sum(len(t) for _, t in books) / len(train_ids):.2f} chars/token), "
        f"held-out {len(held_ids)} tokens")

    # 3. model
    shape = LlamaShape(vocab_size=len(vocab), hidden_size=a.hidden, intermediate_size=a.intermediate,
                       num_hidden_layers=a.layers, num_attention_heads=a.heads,
                       num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads,
                       max_position_embeddings=1024, rms_norm_eps=1e-5, rope_theta=10000.0)
    model = Llama(shape)
    n_params = model.n_params()
    log(f"model: {shape}, {n_params} parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)

    data = torch.tensor(train_ids, dtype=torch.int64)
    held_windows = windows_of(held_ids, a.ctx)
    probe = held_windows[torch.randperm(held_windows.shape[0], generator=torch.Generator().manual_seed(0))[:8]]
    n_starts = len(train_ids) - a.ctx - 1
    history, ema = [], None
    step, tokens = 0, 0
    t_train = time.time()
    next_probe = t_train
    budget = a.minutes * 60.0
    while True:
        elapsed = time.time() - t_train
        if (a.steps and step >= a.steps) or (not a.steps and elapsed >= budget):
            break
        frac = step / a.steps if a.steps else elapsed / budget
        lr = lr_at(frac, step, a)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = [rng.randrange(n_starts) for _ in range(a.batch)]
        batch = torch.stack([data[s:s + a.ctx + 1] for s in starts])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        step += 1
        tokens += batch[:, 1:].numel()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        rec = {"step": step, "time_s": round(time.time() - t_train, 1), "lr": lr, "loss": loss.item(),
               "loss_ema": ema, "grad_norm": gnorm}
        if time.time() >= next_probe:
            rec["heldout_probe"] = mean_loss(model, probe, 8)
            next_probe = time.time() + 120
            log(f"step {step} tokens {tokens} lr {lr:.2e} loss {loss.item():.3f} (ema {ema:.3f}) "
                f"held-out probe {rec['heldout_probe']:.3f} gnorm {gnorm:.2f} "
                f"{tokens / max(time.time() - t_train, 1e-9):.0f} tok/s")
        history.append(rec)
    train_s = time.time() - t_train
    log(f"trained {step} steps, {tokens} tokens ({tokens / len(train_ids):.2f} epochs) in {train_s:.0f}s; "
        f"last-batch loss {history[-1]['loss']:.3f}, ema {ema:.3f}")
    torch.save({"shape": shape.__dict__, "state": model.state_dict(), "args": vars(a)},
               os.path.join(a.work, "model_fp32.pt"))

    # 4. export (BF16) and evaluate the exported weights
    cfg = hf_config(shape, bos_id=eot, eos_id=eot)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(a.out, "model.safetensors"),
                      {n: t.to(torch.bfloat16) for n, t in model.hf_state().items()},
                      metadata={"format": "pt"})
    shipped = Llama(shape)
    shipped.load_hf_state({n: t.float() for n, t in read_safetensors(os.path.join(a.out, "model.safetensors")).items()})
    t0 = time.time()
    held_loss = mean_loss(shipped, held_windows, 16)
    train_windows = windows_of(train_ids, a.ctx)
    sample = train_windows[torch.randperm(train_windows.shape[0], generator=torch.Generator().manual_seed(1))[:held_windows.shape[0]]]
    train_loss = mean_loss(shipped, sample, 16)
    fp32_held = mean_loss(model, held_windows, 16)
    log(f"eval ({time.time() - t0:.0f}s), BF16 weights: held-out loss {held_loss:.4f} (ppl {math.exp(held_loss):.2f}), "
        f"train-sample loss {train_loss:.4f} (ppl {math.exp(train_loss):.2f}); fp32 weights held-out {fp32_held:.4f}")

    summary = {
        "params": n_params, "shape": shape.__dict__, "args": vars(a),
        "train_tokens": len(train_ids), "heldout_tokens": len(held_ids),
        "heldout_chapters": [f"{b} {n}" for b, n, _ in held],
        "steps": step, "tokens_seen": tokens, "epochs": tokens / len(train_ids), "train_seconds": train_s,
        "total_seconds": time.time() - t_start,
        "final_train_batch_loss": history[-1]["loss"], "final_train_loss_ema": ema,
        "train_sample_loss_bf16": train_loss, "heldout_loss_bf16": held_loss,
        "heldout_ppl_bf16": math.exp(held_loss), "heldout_loss_fp32": fp32_held,
        "eval_windows": int(held_windows.shape[0]), "ctx": a.ctx,
        "history": history,
    }
    with open(os.path.join(a.work, "train_log.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(f"done in {time.time() - t_start:.0f}s total; wrote {a.out} and {a.work}/train_log.json")


if __name__ == "__main__":
    main()
