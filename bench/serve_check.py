#!/usr/bin/env python3
"""End-to-end check of `shardlm serve` on one device (bench/gpu_check.sh's serve-http step).

Starts the server on the shipped model (FP32 weights and KV cache, so that the device's greedy
tokens are the CPU's), then over HTTP: a completion equal to `shardlm generate --device cpu`;
six concurrent requests through four slots, each equal to its CPU text; a streamed completion
equal to the plain one; logprobs of a greedy completion against the same text scored with
echo and max_tokens 0 (prefix cache and all_logits chunks on the device); a conversation's next
turn loaded back from the prefix cache's host tier (--cache-ram) after other prompts took its slot,
equal to its CPU text; SIGTERM ends it with status 0 and writes the tier to its --cache-file; a
second server started on that file answers the conversation's turn again from the loaded keys and
values, equal to the CPU's text. Prints one line per check and exits 1 when any fails.

    bench/serve_check.py --bin build/shardlm --model launch/models/kjv-small --device cuda
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def cpu_text(args, prompt, max_new):
    out = subprocess.run([args.bin, "generate", "--model", args.model, "--device", "cpu", "--weights", "fp32",
                          "--kv", "fp32", "--temperature", "0", "--json", "--prompt", prompt,
                          "--max-new-tokens", str(max_new)], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["results"][0]["text"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()

    cache_file = tempfile.NamedTemporaryFile(suffix=".kv", delete=False).name
    os.unlink(cache_file)  # the server writes it at shutdown

    def start():
        log = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
        srv = subprocess.Popen([args.bin, "serve", "--model", args.model, "--device", args.device, "--weights", "fp32",
                                "--kv", "fp32", "--batch", "4", "--ctx", "512", "--cache-ram", "64", "--cache-file",
                                cache_file, "--port", "0"], stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.time() + 120
        tag = "listening on http://127.0.0.1:"
        while time.time() < deadline and srv.poll() is None:
            text = open(log.name).read()
            if tag in text and " " in text.split(tag, 1)[1]:
                print(text.strip())
                return srv, int(text.split(tag, 1)[1].split(" ", 1)[0]), log
            time.sleep(0.2)
        print("FAIL server did not start:", open(log.name).read()[-2000:])
        srv.kill()
        return srv, 0, log

    def stop(srv, log):
        srv.terminate()
        try:
            rc = srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            rc = -1
        check("SIGTERM stops it with status 0", rc == 0, f"status {rc}: {open(log.name).read()[-1000:]}")

    failed = []

    def check(name, ok, detail=""):
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else ": " + detail))
        if not ok:
            failed.append(name)

    srv, port, log = start()
    if not port:
        return 1
    try:
        one = json.loads(post(port, "/v1/completions", {"prompt": "And God said", "max_tokens": 24, "temperature": 0}))
        want = cpu_text(args, "And God said", 24)
        check("completion == cpu generate", one["choices"][0]["text"] == want,
              f"{one['choices'][0]['text']!r} vs {want!r}")

        prompts = ["In the beginning", "And the LORD", "Blessed are", "Now it came to pass", "And he said", "Behold"]
        got = [None] * len(prompts)

        def ask(i):
            got[i] = json.loads(post(port, "/v1/completions",
                                     {"prompt": prompts[i], "max_tokens": 6 + 3 * i, "temperature": 0}))
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, p in enumerate(prompts):
            w = cpu_text(args, p, 6 + 3 * i)
            check(f"concurrent {i} == cpu generate", got[i]["choices"][0]["text"] == w,
                  f"{got[i]['choices'][0]['text']!r} vs {w!r}")

        raw = post(port, "/v1/completions", {"prompt": "And God said", "max_tokens": 24, "temperature": 0,
                                             "stream": True})
        text = "".join(json.loads(l[6:])["choices"][0]["text"] for l in raw.splitlines()
                       if l.startswith("data: {"))
        check("streamed == plain", text == want, f"{text!r}")

        gen = json.loads(post(port, "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0,
                                                        "logprobs": 1}))
        ids = json.loads(subprocess.run([args.bin, "generate", "--model", args.model, "--device", "cpu", "--weights",
                                         "fp32", "--kv", "fp32", "--temperature", "0", "--json", "--prompt-ids",
                                         "5,6,7", "--max-new-tokens", "8"], capture_output=True, text=True,
                                        check=True).stdout)["results"][0]["tokens"]
        scored = json.loads(post(port, "/v1/completions", {"prompt": [5, 6, 7] + ids, "max_tokens": 0, "echo": True,
                                                           "logprobs": 1, "temperature": 0}))
        a = gen["choices"][0]["logprobs"]["token_logprobs"]
        b = scored["choices"][0]["logprobs"]["token_logprobs"][3:]
        diff = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) == 8 else float("inf")
        check("echo scores == generation logprobs", diff < 1e-3, f"max diff {diff} ({a} vs {b})")
        # The prefix cache's host tier (--cache-ram): a conversation, then four other prompts one
        # after another (each takes the slot freed longest ago, so one takes the conversation's,
        # which saves it to host memory first), then the conversation's next turn: it loads its
        # earlier turn back (device <- host copies) and answers the CPU's text.
        first = ("And God said, Let there be light: and there was light. And God saw the light, "
                 "that it was good: and God divided the light from the darkness.")
        turn = json.loads(post(port, "/v1/completions", {"prompt": first, "max_tokens": 8, "temperature": 0}))
        for i, p in enumerate(["And Adam knew", "These are the generations", "Now the serpent", "And Cain talked"]):
            post(port, "/v1/completions", {"prompt": p, "max_tokens": 4 + i, "temperature": 0})
        second = first + turn["choices"][0]["text"] + " And"
        again = json.loads(post(port, "/v1/completions", {"prompt": second, "max_tokens": 8, "temperature": 0}))
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("host tier: next turn loads the earlier one", cached >= turn["usage"]["prompt_tokens"],
              f"{cached} cached of {again['usage']['prompt_tokens']}")
        w = cpu_text(args, second, 8)
        check("host tier: next turn == cpu generate", again["choices"][0]["text"] == w,
              f"{again['choices'][0]['text']!r} vs {w!r}")
        print(f"note: serve on {args.device}: {len(prompts) + 10} requests, echo vs generation logprob diff {diff:.2e}, "
              f"host tier {cached} of {again['usage']['prompt_tokens']} prompt tokens cached")
    except Exception as e:  # a refused connection, an HTTP error, a bad JSON body
        check("requests", False, repr(e))
    stop(srv, log)
    check("--cache-file written at shutdown", re.search(r"--cache-file \S+: .* saved", open(log.name).read())
          and os.path.exists(cache_file), open(log.name).read()[-1000:])
    # A second server on the file: the conversation's turn again, from the keys and values the
    # first one saved (host -> file -> host -> device).
    srv, port, log = start()
    if not port:
        return 1
    try:
        again2 = json.loads(post(port, "/v1/completions", {"prompt": second, "max_tokens": 8, "temperature": 0}))
        # (The server prints its load after the listening line, before it takes a request: once
        # the request is answered the line is there.)
        loaded = re.search(r"--cache-file \S+: \d+ prefix(es)?, \d+ positions \(.*\) loaded", open(log.name).read())
        check("--cache-file loaded at start", loaded, open(log.name).read()[-1000:])
        cached2 = again2["usage"]["prompt_tokens_details"]["cached_tokens"]
        check("--cache-file: the turn after a restart loads it", cached2 >= again2["usage"]["prompt_tokens"] - 1,
              f"{cached2} cached of {again2['usage']['prompt_tokens']}")
        check("--cache-file: the turn after a restart == cpu generate", again2["choices"][0]["text"] == w,
              f"{again2['choices'][0]['text']!r} vs {w!r}")
    except Exception as e:
        check("requests after the restart", False, repr(e))
    stop(srv, log)
    os.unlink(cache_file)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
