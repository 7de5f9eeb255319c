#!/usr/bin/python3
"""Continues prompts with a shipped checkpoint (config.json + model.safetensors + tokenizer.json),
in fp32 torch on the stored weights, and decodes with bpe.py.

  sample.py [--model DIR] [--prompt TEXT ...] [--max-new-tokens N] [--temperature T] [--seed S]
Temperature 0 is greedy (lowest id on ties); otherwise plain softmax sampling at temperature T.
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from llama import Llama, read_safetensors, shape_from_config  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load(model_dir):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    model = Llama(shape_from_config(cfg))
    model.load_hf_state({n: t.float() for n, t in read_safetensors(os.path.join(model_dir, "model.safetensors")).items()})
    model.eval()
    return model, cfg, bpe.Tokenizer.load(os.path.join(model_dir, "tokenizer.json"))


@torch.no_grad()
def generate(model, ids, n, temperature, eos, gen):
    ids = list(ids)
    out = []
    for _ in range(n):
        logits = model(torch.tensor([ids[-model.shape.max_position_embeddings:]]))[0, -1]
        if temperature == 0:
            nxt = int(torch.argmax(logits))  # first maximum: the lowest id on ties
        else:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
        ids.append(nxt)
        out.append(nxt)
        if nxt == eos:
            break
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(ROOT, "launch/models/kjv-small"))
    p.add_argument("--prompt", nargs="*", default=["And God said", "In the beginning"])
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, nargs="*", default=[0.0, 0.8])
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(2)
    model, cfg, tok = load(a.model)
    for prompt in a.prompt:
        ids = tok.encode(prompt)
        for t in a.temperature:
            gen = torch.Generator().manual_seed(a.seed)
            out = generate(model, ids, a.max_new_tokens, t, cfg["eos_token_id"], gen)
            print(f"--- T={t} prompt {prompt!r} ids {ids}")
            print(prompt + tok.decode(out))


if __name__ == "__main__":
    main()
