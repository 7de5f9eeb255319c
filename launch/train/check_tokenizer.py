#!/usr/bin/python3
"""Checks that bpe.py encodes and decodes like independent implementations of tokenizer.json.

  check_tokenizer.py [--model DIR] [--shardlm build/shardlm] [--lines N]

Inputs: the first N lines of DIR/heldout.txt, the whole held-out text as one string, and a few
awkward strings (Unicode, runs of spaces and newlines, digits, the special token). Compared with:
  - @lenml/tokenizers (JS port of HF tokenizers), when node and the npm folder the tokenizer
    tests install (build*/tests/tokenizer/npm/node_modules) are present;
  - `shardlm tokenize --model DIR --json` (stdin lines), when --shardlm is given.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
AWKWARD = [
    "In the beginning God created the heaven and the earth.",
    "  two leading spaces, trailing   ",
    "tabs\tand\n\nnewlines\n \n",
    "numbers 1189 and 31,102; it's he'll they're I'm we've you'd",
    "Ünïcödé 東京 😀 naïve café",
    "And God said<|endoftext|>In the beginning",
    "<|endoftext|>",
    "",
    "!!! ??? ... --- ((()))",
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=os.path.join(ROOT, "launch/models/kjv-small"))
    p.add_argument("--shardlm", default="")
    p.add_argument("--lines", type=int, default=300)
    a = p.parse_args()

    tok = bpe.Tokenizer.load(os.path.join(a.model, "tokenizer.json"))
    with open(os.path.join(a.model, "heldout.txt"), encoding="utf-8") as f:
        held = f.read()
    lines = [l for l in held.split("\n") if l][:a.lines]
    cases = AWKWARD + lines + [held]
    mine = [tok.encode(t) for t in cases]
    bad = [i for i, t in enumerate(cases) if tok.decode(mine[i]) != t]
    print(f"bpe.py: {len(cases)} strings, round trip {'ok' if not bad else f'FAILS on {len(bad)}'}")
    status = 0 if not bad else 1

    npm = sorted(glob.glob(os.path.join(ROOT, "build*/tests/tokenizer/npm/node_modules/@lenml/tokenizers")))
    if shutil.which("node") and npm:
        env = dict(os.environ, NODE_PATH=os.path.dirname(os.path.dirname(npm[0])))
        r = subprocess.run(["node", os.path.join(os.path.dirname(__file__), "check_tokenizer.js"), a.model],
                           input=json.dumps(cases), capture_output=True, text=True, env=env, check=True)
        ref = json.loads(r.stdout)
        diff = [i for i in range(len(cases)) if ref[i]["ids"] != mine[i]]
        ddiff = [i for i in range(len(cases)) if ref[i]["decoded"] != tok.decode(mine[i])]
        print(f"@lenml/tokenizers: ids differ on {len(diff)}/{len(cases)}, decoded text differs on {len(ddiff)}")
        for i in diff[:3]:
            print(f"  {cases[i][:60]!r}: js {ref[i]['ids'][:20]} mine {mine[i][:20]}")
        for i in ddiff[:3]:
            print(f"  decode {cases[i][:60]!r}: js {ref[i]['decoded'][:60]!r}")
        status |= bool(diff or ddiff)
    else:
        print("@lenml/tokenizers: not found (node + build*/tests/tokenizer/npm), skipped")

    if a.shardlm:
        # one line per stdin line: only cases without newlines
        one_line = [t for t in cases if "\n" not in t and t]
        r = subprocess.run([a.shardlm, "tokenize", "--model", a.model, "--json"], input="\n".join(one_line) + "\n",
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"shardlm tokenize failed: {r.stderr.strip()[:200]}")
            status = 1
        else:
            got = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
            got = [g["ids"] if isinstance(g, dict) else g for g in got]
            diff = [i for i, t in enumerate(one_line) if i >= len(got) or got[i] != tok.encode(t)]
            print(f"shardlm tokenize: {len(got)} lines back for {len(one_line)}, ids differ on {len(diff)}")
            for i in diff[:3]:
                print(f"  {one_line[i][:60]!r}: shardlm {got[i][:20] if i < len(got) else None} mine {tok.encode(one_line[i])[:20]}")
            status |= bool(diff) or len(got) != len(one_line)
    sys.exit(status)


if __name__ == "__main__":
    main()
