#!/usr/bin/python3
"""Compares a checkpoint's logits and greedy tokens across three implementations:
this folder's torch Llama (fp32 on the stored BF16 weights), `shardlm generate` (fp32 weights and
KV cache) and tests/reference/hf_forward.py (NumPy).

  check_logits.py --shardlm build/shardlm [--model DIR] [--new-tokens N]
Prompts: a few texts encoded with bpe.py plus a long held-out passage (close to the 256-token
training context). Prints the max |difference| of the last-position logits per prompt and whether
the greedy continuations agree; exits non-zero when a logit differs by more than --tol.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sample import load, generate  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(ROOT, "launch/models/kjv-small"))
    p.add_argument("--shardlm", default=os.path.join(ROOT, "build/shardlm"))
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--tol", type=float, default=1e-3)
    a = p.parse_args()
    torch.set_num_threads(2)
    model, cfg, tok = load(a.model)
    with open(os.path.join(a.model, "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    texts = ["And God said", "In the beginning", "The LORD is my shepherd; I shall not want.\n",
             held[:900]]
    prompts = [tok.encode(t) for t in texts]
    ids_arg = ";".join(",".join(map(str, p)) for p in prompts)

    with torch.no_grad():
        mine = [model(torch.tensor([p]))[0, -1] for p in prompts]
    mine_tokens = [generate(model, p, a.new_tokens, 0.0, -1, None) for p in prompts]

    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "logits.json")
        r = subprocess.run([a.shardlm, "generate", "--model", a.model, "--prompt-ids", ids_arg,
                            "--max-new-tokens", str(a.new_tokens), "--temperature", "0", "--json",
                            "--dump-logits", dump, "--kv", "fp32", "--weights", "fp32"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"shardlm failed: {r.stderr.strip()}")
        out = json.loads(r.stdout)
        with open(dump) as f:
            theirs = json.load(f)
    ref = json.loads(subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests/reference/hf_forward.py"), "--model", a.model,
         "--prompt-ids", ids_arg, "--max-new-tokens", str(a.new_tokens)],
        capture_output=True, text=True, check=True).stdout)["results"]

    worst = 0.0
    for i, t in enumerate(texts):
        s = torch.tensor(theirs[i])
        h = torch.tensor(ref[i]["last_logits"])
        d_s = (mine[i] - s).abs().max().item()
        d_h = (mine[i] - h).abs().max().item()
        worst = max(worst, d_s, d_h)
        st = out["results"][i]["tokens"]
        # an eos ends shardlm's list and ours at the same place; the reference also stops there
        same_s = st == mine_tokens[i][:len(st)]
        same_h = ref[i]["tokens"] == mine_tokens[i][:len(ref[i]["tokens"])]
        print(f"prompt {i} ({len(prompts[i])} tokens, {t[:24]!r}): max|torch-shardlm| {d_s:.2e}, "
              f"max|torch-hf_forward| {d_h:.2e}, |logit| up to {mine[i].abs().max().item():.1f}; "
              f"greedy {len(st)} tokens same as torch: shardlm {same_s}, hf_forward {same_h}")
        if i < 3:
            print(f"   shardlm text: {t + tok.decode(st)!r}")
    print(f"worst logit difference {worst:.2e} (tolerance {a.tol})")
    sys.exit(0 if worst <= a.tol else 1)


if __name__ == "__main__":
    main()
