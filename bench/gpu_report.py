#!/usr/bin/env python3
"""Helpers of bench/gpu_check.sh (standard library only).

    gpu_report.py status JSONL STEP STATUS SECONDS NOTE      append one step's status line
    gpu_report.py rows JSONL STEP ENGINE GRAPHS FLAGS < rows  append bench rows, tagged with the step
    gpu_report.py gtest JSONL STEP FILE.json GPU(0|1)         append a gtest summary; exit 1 on failures
                                                            (or, with GPU=1, when every test skipped)
    gpu_report.py tokens A.json B.json                        exit 1 unless both --json outputs' tokens match
    gpu_report.py table JSONL [HEADER_FILE]                   the markdown report on stdout
    gpu_report.py kernels NCU.csv                             per-kernel times of the last decode step
                                                            in an `ncu --csv --metrics gpu__time_duration.sum` log

The markdown table has one line per benchmark run (its pp and tg rows merged): test, batch, weights,
kv, graphs, prefill ms, decode ms/token, GB/s, fraction of peak, memory, and for shardlm rows the
ratio of its times to PyTorch's at the same batch and graph mode (< 1: shardlm is faster).
"""
import json
import sys


def append(path, obj):
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")


def cmd_status(path, step, status, seconds, note):
    append(path, {"step": step, "status": status, "seconds": round(float(seconds), 1), "note": note})


def cmd_rows(path, step, engine, graphs, flags):
    n = 0
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "skipped" in r:
            continue
        r.setdefault("engine", engine)
        # The row's own graph field wins over what the flags say.
        for k in ("cuda_graph", "cuda_graphs", "graphs"):
            if k in r:
                r["graphs"] = bool(r[k])
                break
        else:
            r["graphs"] = graphs == "1"
        r["step"], r["flags"] = step, flags
        append(path, r)
        n += 1
    if n == 0:
        print("gpu_report: no JSON rows on stdin", file=sys.stderr)
        sys.exit(1)


def cmd_gtest(path, step, file, gpu):
    j = json.load(open(file))
    tests = failures = skipped = 0
    failed = []
    for suite in j.get("testsuites", []):
        for t in suite.get("testsuite", []):
            tests += 1
            if t.get("failures"):
                failures += 1
                failed.append(f'{suite["name"]}.{t["name"]}')
            elif t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                skipped += 1
    append(path, {"step": step, "gtest": {"tests": tests, "failures": failures, "skipped": skipped,
                                          "failed": failed[:20]}})
    print(f"{tests} tests, {failures} failed, {skipped} skipped")
    if failures:
        sys.exit(1)
    if gpu == "1" and tests and skipped == tests:
        print("every test skipped on a machine with a GPU", file=sys.stderr)
        sys.exit(1)


def cmd_tokens(a, b):
    ta = [r["tokens"] for r in json.load(open(a))["results"]]
    tb = [r["tokens"] for r in json.load(open(b))["results"]]
    print("A:", ta)
    print("B:", tb)
    if ta != tb:
        print("tokens differ", file=sys.stderr)
        sys.exit(1)


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def cmd_table(path, header=None):
    lines = [json.loads(l) for l in open(path) if l.strip()]
    out = []
    if header:
        out.append(open(header).read().rstrip() + "\n")
    # Benchmark runs: merge the pp and tg rows of one step.
    runs, order = {}, []
    for r in lines:
        if "test" not in r or "avg_ms" not in r or r.get("ablate"):
            continue
        pdl = r.get("pdl")
        key = (r.get("step"), r.get("engine"), r.get("batch"), r.get("weights"), r.get("kv"), r["graphs"],
               r.get("attention", "-"), "-" if pdl is None else ("on" if pdl else "off"), r.get("gemv_grid", "-"),
               "on" if r.get("gemm_stage") else "off")
        if key not in runs:
            runs[key] = {"r": r}
            order.append(key)
        kind = r["test"].rstrip("0123456789")
        runs[key][kind] = r
    order.sort(key=lambda k: k[1] != "shardlm")  # shardlm rows first, then PyTorch's
    torch = {}
    for k in order:
        run = runs[k]
        if k[1] == "torch" and "pp" in run and "tg" in run:
            torch[(k[2], k[5])] = run
    if order:
        out.append("| engine | test | batch | weights | kv | graphs | attention | pdl | gemv grid | gemm stage | "
                   "prefill ms | decode ms/token | GB/s | fraction of peak | memory GB (weights+kv+workspace) | peak GB | "
                   "prefill x torch | decode x torch |")
        out.append("|---|---|---:|---|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for k in order:
            run = runs[k]
            pp, tg, r = run.get("pp"), run.get("tg"), run["r"]
            pre = pp["avg_ms"] if pp else None
            dec = tg["avg_ms"] / int(tg["test"][2:]) if tg else None
            gbps = tg.get("gbps") if tg else None
            peak = (tg or r).get("peak_gbps") or None
            frac = gbps / peak if gbps and peak else None
            m = r.get("memory", {})
            mem = sum(m.get(x, 0) for x in ("weights_bytes", "kv_cache_bytes", "workspace_bytes")) / 1e9 if m else None
            peak_mem = m.get("peak_bytes", 0) / 1e9 if m else None
            test = "/".join(x["test"] for x in (pp, tg) if x)
            rp = rd = None
            t = torch.get((k[2], k[5]))
            if k[1] != "torch" and t:
                if pre is not None:
                    rp = pre / t["pp"]["avg_ms"]
                if dec is not None:
                    rd = dec / (t["tg"]["avg_ms"] / int(t["tg"]["test"][2:]))
            out.append(f'| {k[1]} | {test} | {k[2]} | {k[3]} | {k[4]} | {"on" if k[5] else "off"} | {k[6]} | {k[7]} | {k[8]} | {k[9]} | {fmt(pre, ".1f")} | '
                       f'{fmt(dec, ".3f")} | {fmt(gbps, ".0f")} | {fmt(frac, ".2f")} | {fmt(mem, ".2f")} | '
                       f'{fmt(peak_mem, ".2f")} | {fmt(rp, ".2f")} | {fmt(rd, ".2f")} |')
        peaks = sorted({round(runs[k]["r"].get("peak_gbps") or 0) for k in order} - {0})
        out.append(f"\nGB/s: bytes one decode step reads (weights + KV up to the mean position) / decode time; "
                   f"peak: the measured copy bandwidth of each engine's row ({', '.join(map(str, peaks)) or '-'} GB/s). "
                   f"x torch: shardlm time / PyTorch FP16 time at the same batch and graph mode.\n")
    out.extend(ablations(lines))
    out.extend(candidates(runs, order))
    out.extend(prefill_tc(runs, order))
    out.extend(prefill_staging(runs, order))
    # Tests
    gt = [r for r in lines if "gtest" in r]
    if gt:
        out.append("| test binary | tests | failed | skipped |")
        out.append("|---|---:|---:|---:|")
        for r in gt:
            g = r["gtest"]
            out.append(f'| {r["step"]} | {g["tests"]} | {g["failures"]} | {g["skipped"]} |')
            for f in g["failed"]:
                out.append(f"|   failed: {f} | | | |")
        out.append("")
    # Steps
    st = [r for r in lines if "status" in r]
    out.append("| step | status | seconds | note |")
    out.append("|---|---|---:|---|")
    for r in st:
        note = str(r["note"]).replace("|", "/").replace("\n", " ")
        out.append(f'| {r["step"]} | {r["status"]} | {r["seconds"]} | {note} |')
    n_fail = sum(r["status"] == "fail" for r in st)
    n_skip = sum(r["status"] == "skip" for r in st)
    out.append(f"\n{len(st) - n_fail - n_skip} passed, {n_fail} failed, {n_skip} skipped")
    print("\n".join(out))


def ablations(lines):
    """bench --ablate rows: per step and (batch, weights, kv), the decode step's ms/token with every
    kernel, then without each listed class, and what leaving it out saved (its marginal cost under
    graphs and PDL) as ms/token and as a share of the step. Empty without such rows."""
    full, cut, seen = {}, {}, []
    for r in lines:
        if "test" not in r or not r["test"].startswith("tg") or "avg_ms" not in r:
            continue
        group = (r.get("step"), r.get("batch"), r.get("weights"), r.get("kv"))
        ms = r["avg_ms"] / int(r["test"][2:])
        if r.get("ablate"):
            if group not in cut:
                cut[group] = {}
                seen.append(group)
            cut[group][r["ablate"]] = ms
        else:
            full[group] = ms
    rows = [g for g in seen if g in full]
    if not rows:
        return []
    cols = []
    for g in rows:
        cols += [c for c in cut[g] if c not in cols]
    out = ["\nMarginal cost of each kernel class in a decode step (`bench --ablate`: ms/token with every kernel, "
           "then the time saved without the class, in brackets its share of the step):\n",
           "| batch | weights | kv | step | " + " | ".join(cols) + " |",
           "|---:|---|---|---:|" + "---:|" * len(cols)]
    for g in rows:
        base = full[g]
        cells = ["%.3f" % base] + ["-" if c not in cut[g] else "%.3f (%.0f%%)" % (base - cut[g][c], 100 * (base - cut[g][c]) / base)
                                   for c in cols]
        out.append(f"| {g[1]} | {g[2]} | {g[3]} | " + " | ".join(cells) + " |")
    out.append("")
    return out


# A row's decode kernels are named by two labels (src/cli/cmd_bench.cpp): the attention's
# ("flash" or "flash-fp32", then "+rope" where the RoPE prologue runs inside the split-KV decode
# kernel) and the GEMV grid's ("persistent" or "tiles", then "+norm" where the GEMVs run the norms
# and residual adds). Each fusion can be turned off (SHARDLM_FUSED_ROPE=0, SHARDLM_FUSED_NORM=0):
# the alternatives below. (Rows of 2026-12-04 also show "+merge": the split-KV merge in the last
# split block, since removed.)
FUSION_TITLES = {"rope": "separate RoPE kernel", "merge": "separate merge kernel", "norm": "norm kernels"}


def split_label(label):
    """A label as (base, set of fusions): "flash+rope+merge" -> ("flash", {"rope", "merge"})."""
    parts = str(label).split("+")
    return parts[0], frozenset(parts[1:])


def default_grid(label):
    """Whether a GEMV grid label is the default grid ("persistent", any fusions) or the CPU's "-"."""
    return split_label(label)[0] in ("persistent", "-")


def candidates(runs, order):
    """The decode tuning switches against the default, per (batch, weights, kv): shardlm rows with
    graphs and PDL on, flash attention, no prefill staging. The default row is the persistent grid
    with every fusion the group's rows show; the alternatives are the per-tile grid with the same
    fusions, and the default less one fusion. Ratio < 1: the alternative is faster. Empty when no
    alternative row ran."""
    # key: (step, engine, batch, weights, kv, graphs, attention, pdl, gemv_grid, gemm_stage)
    table, seen = {}, []
    for k in order:
        run = runs[k]
        att, att_f = split_label(k[6])
        if k[1] != "shardlm" or not k[5] or att not in ("flash", "-") or k[7] == "off" or k[9] == "on" or \
                "tg" not in run:
            continue
        grid, grid_f = split_label(k[8])
        group = (k[2], k[3], k[4])
        if group not in table:
            table[group] = {}
            seen.append(group)
        table[group][(grid, att_f | grid_f)] = run["tg"]["avg_ms"] / int(run["tg"]["test"][2:])
    cols, rows = [], []
    for g in seen:
        fusions = frozenset().union(*(f for grid, f in table[g] if grid == "persistent"))
        default = ("persistent", fusions)
        alts = [("tiles", fusions, "per-tile grid")] + \
               [("persistent", fusions - {f}, FUSION_TITLES.get(f, f)) for f in sorted(fusions)]
        alts = [a for a in alts if a[:2] in table[g]]
        if default not in table[g] or not alts:
            continue
        rows.append((g, default, alts))
        for a in alts:
            if a[2] not in cols:
                cols.append(a[2])
    if not rows:
        return []
    out = ["\nDecode alternatives (ms/token; in brackets the ratio to the default row, < 1 is faster):\n",
           "| batch | weights | kv | default | " + " | ".join(cols) + " |",
           "|---:|---|---|---:|" + "---:|" * len(cols)]
    for g, default, alts in rows:
        base = table[g][default]
        by_title = {a[2]: table[g][a[:2]] for a in alts}
        cells = ["%.3f" % base] + ["-" if c not in by_title else "%.3f (%.2f)" % (by_title[c], by_title[c] / base)
                                   for c in cols]
        out.append(f"| {g[0]} | {g[1]} | {g[2]} | " + " | ".join(cells) + " |")
    out.append("")
    return out


def prefill_ab(runs, order, keep, variant, base, cand, title, heads):
    """Prefill ms of a candidate variant against a base one, per (batch, weights, kv), among
    shardlm rows with graphs and PDL on that keep(key) accepts; variant(key) names a row's variant.
    Empty when no group ran both."""
    table, seen = {}, []
    for k in order:
        run = runs[k]
        if k[1] != "shardlm" or not k[5] or k[7] == "off" or not keep(k) or "pp" not in run:
            continue
        group = (k[2], k[3], k[4])
        if group not in table:
            table[group] = {}
            seen.append(group)
        table[group][variant(k)] = run["pp"]["avg_ms"]
    rows = [g for g in seen if base in table[g] and cand in table[g]]
    if not rows:
        return []
    out = [f"\n{title} (prefill ms; in brackets the ratio to the {heads[0]} row, < 1 is faster):\n",
           f"| batch | weights | kv | {heads[0]} | {heads[1]} |", "|---:|---|---|---:|---:|"]
    for g in rows:
        b, c = table[g][base], table[g][cand]
        out.append(f"| {g[0]} | {g[1]} | {g[2]} | {b:.2f} | {c:.2f} ({c / b:.2f}) |")
    out.append("")
    return out


def prefill_tc(runs, order):
    """Prefill with attention on tensor cores (attention "flash") against the FP32-pipe kernel
    ("flash-fp32", SHARDLM_PREFILL_TC=0), with the default decode and prefill settings."""
    return prefill_ab(runs, order,
                      lambda k: split_label(k[6])[0] in ("flash", "flash-fp32") and default_grid(k[8]) and
                      k[9] == "off",
                      lambda k: split_label(k[6])[0], "flash-fp32", "flash", "Prefill attention on tensor cores",
                      ("FP32 pipes", "tensor cores"))


def prefill_staging(runs, order):
    """INT8 prefill with each matrix dequantized ahead on a side stream (gemm_stage on,
    SHARDLM_GEMM_STAGE=1) against the default, with flash attention and the default decode settings."""
    return prefill_ab(runs, order, lambda k: split_label(k[6])[0] == "flash" and default_grid(k[8]),
                      lambda k: k[9], "off", "on", "INT8 prefill with the dequantization staged ahead",
                      ("default", "staged"))


def short_kernel(name):
    """`void shardlm::<unnamed>::gemv_vec_kernel<3, 1, 1, 4, 4>(shardlm::<unnamed>::GemvArgs)` (or with
    `(anonymous namespace)` and enum casts `(WKind)3`) -> `gemv_vec_kernel<3, 1, 1, 4, 4>`."""
    name = name.replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    if name.startswith("void "):
        name = name[5:]
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0 and i > 0:
            cut = i
            break
    name = name[:cut]
    while "(" in name and ")" in name:  # enum casts inside template arguments: (WKind)3 -> 3
        a = name.index("(")
        b = name.index(")", a)
        name = name[:a] + name[b + 1:]
    head, lt, tail = name.partition("<")  # drop namespaces before the template arguments
    return head.split("::")[-1] + lt + tail


def cmd_kernels(path):
    """The kernels of the last complete decode step and of the last complete prefill (a pass
    with prefill attention), one row per kernel variant and grid."""
    import csv
    with open(path) as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("gpu_report kernels: no ncu CSV header in " + path, file=sys.stderr)
        sys.exit(1)
    launches = {}
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit)
        if scale is None:
            print("gpu_report kernels: unknown time unit %r in %s" % (unit, path), file=sys.stderr)
            sys.exit(1)
        ns = float(r["Metric Value"].replace(",", "")) * scale
        launches[int(r["ID"])] = (short_kernel(r["Kernel Name"]), r.get("Grid Size", ""), r.get("Block Size", ""), ns)
    seq = [launches[i] for i in sorted(launches)]
    starts = [i for i, k in enumerate(seq) if k[0].startswith("embedding_kernel")]

    def last_step(prefill):
        # A forward pass runs from its embedding launch to the next one; a decode step is complete
        # with its argmax/top-k, a prefill (whose logits go to the host) when another pass follows.
        for i in reversed(range(len(starts))):
            a = starts[i]
            end = starts[i + 1] if i + 1 < len(starts) else len(seq)
            names = [k[0] for k in seq[a:end]]
            if any("prefill" in n for n in names) != prefill:
                continue
            if prefill and end == len(seq):
                continue
            if not prefill:
                last = next((j for j in range(len(names)) if names[j].startswith(("argmax", "topk"))), None)
                if last is None:
                    continue
                end = a + last + 1
            return seq[a:end]
        return None

    decode = last_step(False)
    if decode is None:
        print("gpu_report kernels: no complete decode step (embedding ... argmax) in " + path, file=sys.stderr)
        sys.exit(1)
    totals = []
    for title, step in (("decode step", decode), ("prefill", last_step(True))):
        if step is None:
            continue
        rows = {}
        for name, grid, block, ns in step:
            r = rows.setdefault((name, grid, block), [0, 0.0])
            r[0] += 1
            r[1] += ns
        total = sum(k[3] for k in step)
        totals.append("%s %.3f ms in %d launches" % (title, total / 1e6, len(step)))
        print("%s:\n" % title)
        print("| kernel | grid | block | launches | total us | us each | share |")
        print("|---|---|---|---:|---:|---:|---:|")
        for (name, grid, block), (n, ns) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            if title == "prefill" and 100 * ns / total < 0.5:
                continue  # (prefill: the small ones left out)
            print("| %s | %s | %s | %d | %.1f | %.2f | %.1f%% |" % (name, grid, block, n, ns / 1e3, ns / 1e3 / n,
                                                                    100 * ns / total))
        print()
    print("total: " + "; ".join(totals) + " of kernel time (each kernel alone, as ncu runs them)")


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, args = sys.argv[1], sys.argv[2:]
    {"status": cmd_status, "rows": cmd_rows, "gtest": cmd_gtest, "tokens": cmd_tokens, "table": cmd_table,
     "kernels": cmd_kernels}[cmd](*args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
