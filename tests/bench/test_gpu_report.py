#!/usr/bin/env python3
"""bench/gpu_report.py's parsers, on fixtures in ncu's and shardlm's real formats (CTest: bench)."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "..", "bench", "gpu_report.py")
sys.path.insert(0, os.path.dirname(REPORT))
import gpu_report  # noqa: E402


def run(*args):
    return subprocess.run([sys.executable, REPORT, *args], capture_output=True, text=True)


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


def read_text(path):
    with open(path) as f:
        return f.read()


class ShortKernel(unittest.TestCase):
    def test_names(self):
        s = gpu_report.short_kernel
        self.assertEqual(s("void shardlm::<unnamed>::gemv_vec_kernel<3, 1, 4, 2, 2>(shardlm::<unnamed>::GemvArgs)"),
                         "gemv_vec_kernel<3, 1, 4, 2, 2>")
        self.assertEqual(s("void shardlm::(anonymous namespace)::gemv_vec_kernel<(shardlm::(anonymous namespace)::WKind)3,"
                           " 1, 1, 8, 4>(shardlm::(anonymous namespace)::GemvArgs)"), "gemv_vec_kernel<3, 1, 1, 8, 4>")
        self.assertEqual(s("shardlm::<unnamed>::dequant_i8_kernel(const signed char *, const float *, __half *, long)"),
                         "dequant_i8_kernel")
        self.assertEqual(s("nvjet_sm90_hss_128x64_64x8_1x2_h_bz_TNT"), "nvjet_sm90_hss_128x64_64x8_1x2_h_bz_TNT")


class Kernels(unittest.TestCase):
    def test_last_complete_decode_step_and_prefill(self):
        r = run("kernels", os.path.join(HERE, "ncu_step.csv"))
        self.assertEqual(r.returncode, 0, r.stderr)
        decode, _, prefill = r.stdout.partition("prefill:")
        # The timed decode step (the warm-up's gemv ran 9 us, the cut-off pass's 99 us): two
        # launches of one variant and grid merged into one row.
        self.assertIn("| gemv_vec_kernel<3, 1, 4, 2, 2> | (256, 1, 1) | (256, 1, 1) | 2 | 10.0 | 5.00 |", decode)
        self.assertIn("| norm_vec_kernel<2> | (1, 1, 1) | (256, 1, 1) | 1 | 2.5 | 2.50 |", decode)
        self.assertNotIn("prefill_kernel", decode)
        # The timed prefill (followed by a decode step), its "us" row scaled to ns.
        self.assertIn("| dequant_i8_kernel | (4096, 1, 1) | (256, 1, 1) | 1 | 40.0 | 40.00 |", prefill)
        self.assertIn("| flash_prefill_kernel<128, 64> | (32, 8, 1) | (256, 1, 1) | 1 | 112.0 |", prefill)
        self.assertIn("total: decode step 0.044 ms in 6 launches; prefill 0.160 ms in 3 launches", r.stdout)

    def test_errors_name_the_file(self):
        with tempfile.TemporaryDirectory() as d:
            empty = os.path.join(d, "empty.csv")
            write_text(empty, "==PROF== nothing profiled\n")
            r = run("kernels", empty)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no ncu CSV header in " + empty, r.stderr)
            lines = read_text(os.path.join(HERE, "ncu_step.csv")).splitlines()
            prefill_only = os.path.join(d, "prefill.csv")
            write_text(prefill_only, "\n".join(lines[:8]) + "\n")  # setup and the first prefill
            r = run("kernels", prefill_only)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("no complete decode step", r.stderr)
            bad_unit = os.path.join(d, "unit.csv")
            write_text(bad_unit, "\n".join(lines).replace('"ns","6,000"', '"furlong","6,000"') + "\n")
            r = run("kernels", bad_unit)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("unknown time unit 'furlong'", r.stderr)


class Table(unittest.TestCase):
    def test_decode_alternatives_against_the_default(self):
        def row(step, test, ms, grid, pdl=True, attention="flash+rope+merge", stage=False):
            return json.dumps({"test": test, "batch": 1, "weights": "int8", "kv": "int8", "graphs": True,
                               "attention": attention, "pdl": pdl, "gemv_grid": grid, "gemm_stage": stage,
                               "avg_ms": ms, "gbps": 1.0, "peak_gbps": 4000.0, "engine": "shardlm", "step": step})
        with tempfile.TemporaryDirectory() as d:
            jsonl = os.path.join(d, "rows.jsonl")
            write_text(jsonl, "\n".join([
                row("base", "pp512", 9.0, "persistent+norm"), row("base", "tg128", 128.0, "persistent+norm"),
                row("tiles", "pp512", 9.0, "tiles+norm"), row("tiles", "tg128", 160.0, "tiles+norm"),
                row("rope", "pp512", 9.0, "persistent+norm", attention="flash+merge"),
                row("rope", "tg128", 136.0, "persistent+norm", attention="flash+merge"),
                row("norm", "pp512", 9.0, "persistent"), row("norm", "tg128", 144.0, "persistent"),
                row("merge", "pp512", 9.0, "persistent+norm", attention="flash+rope"),
                row("merge", "tg128", 132.0, "persistent+norm", attention="flash+rope"),
                # The staged prefill is a prefill comparison: not a decode column.
                row("stage", "pp512", 8.0, "persistent", stage=True),
                row("stage", "tg128", 999.0, "persistent", stage=True),
                # PDL off is another comparison: not an alternative column.
                row("nopdl", "pp512", 9.0, "persistent", pdl=False),
                row("nopdl", "tg128", 256.0, "persistent", pdl=False),
            ]) + "\n")
            r = run("table", jsonl)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| batch | weights | kv | default | per-tile grid | separate merge kernel | norm kernels | "
                          "separate RoPE kernel |", r.stdout)
            self.assertIn("| 1 | int8 | int8 | 1.000 | 1.250 (1.25) | 1.031 (1.03) | 1.125 (1.12) | 1.062 (1.06) |",
                          r.stdout)
            # the main table's columns
            self.assertIn("| int8 | int8 | on | flash+rope+merge | on | persistent+norm | off |", r.stdout)
            # Without alternative rows there is no such table.
            write_text(jsonl, row("base", "pp512", 9.0, "persistent") + "\n" +
                       row("base", "tg128", 128.0, "persistent") + "\n")
            self.assertNotIn("Decode alternatives", run("table", jsonl).stdout)

    def test_ablation_rows_give_each_kernel_class_its_share(self):
        def row(test, ms, batch=1, ablate=None):
            r = {"test": test, "batch": batch, "weights": "fp16", "kv": "fp16", "graphs": True,
                 "attention": "flash+rope", "pdl": True, "gemv_grid": "persistent+norm", "gemm_stage": False,
                 "avg_ms": ms, "gbps": 0.0 if ablate else 2700.0, "peak_gbps": 4800.0, "engine": "shardlm",
                 "step": "ablate"}
            if ablate:
                r["ablate"] = ablate
            return json.dumps(r)
        with tempfile.TemporaryDirectory() as d:
            jsonl = os.path.join(d, "rows.jsonl")
            write_text(jsonl, "\n".join([
                row("pp512", 9.0), row("tg128", 166.4), row("tg128", 134.4, ablate="attention"),
                row("tg128", 64.0, ablate="mlp"), row("tg128", 12.8, ablate="qkv+attention+o+mlp"),
                row("pp512", 20.0, batch=4), row("tg128", 230.4, batch=4), row("tg128", 192.0, batch=4, ablate="attention"),
            ]) + "\n")
            r = run("table", jsonl)
            self.assertEqual(r.returncode, 0, r.stderr)
            cost = r.stdout.split("Marginal cost of each kernel class")[1]
            self.assertIn("| batch | weights | kv | step | attention | mlp | qkv+attention+o+mlp |", cost)
            self.assertIn("| 1 | fp16 | fp16 | 1.300 | 0.250 (19%) | 0.800 (62%) | 1.200 (92%) |", cost)
            self.assertIn("| 4 | fp16 | fp16 | 1.800 | 0.300 (17%) | - | - |", cost)
            # The main table keeps the full step's rows (an ablated row does not replace them).
            self.assertIn("| pp512/tg128 | 1 | fp16 | fp16 | on | flash+rope | on | persistent+norm | off | 9.0 | 1.300 |",
                          r.stdout)
            write_text(jsonl, row("pp512", 9.0) + "\n" + row("tg128", 166.4) + "\n")
            self.assertNotIn("Marginal cost", run("table", jsonl).stdout)

    def test_staged_int8_prefill_against_the_default(self):
        def row(step, test, ms, stage, batch=4):
            return json.dumps({"test": test, "batch": batch, "weights": "int8", "kv": "int8", "graphs": True,
                               "attention": "flash+rope", "pdl": True, "gemv_grid": "persistent",
                               "gemm_stage": stage, "avg_ms": ms, "gbps": 1.0, "peak_gbps": 4000.0,
                               "engine": "shardlm", "step": step})
        with tempfile.TemporaryDirectory() as d:
            jsonl = os.path.join(d, "rows.jsonl")
            write_text(jsonl, "\n".join([
                row("base", "pp512", 20.0, False), row("base", "tg128", 128.0, False),
                row("stage", "pp512", 16.0, True), row("stage", "tg128", 128.0, True),
                row("b1", "pp512", 9.0, False, batch=1),  # no staged row to compare with
            ]) + "\n")
            r = run("table", jsonl)
            self.assertEqual(r.returncode, 0, r.stderr)
            staged = r.stdout.split("INT8 prefill with the dequantization staged ahead")[1]
            self.assertIn("| 4 | int8 | int8 | 20.00 | 16.00 (0.80) |", staged)
            self.assertNotIn("| 1 | int8 |", staged)
            self.assertNotIn("Decode alternatives", r.stdout)  # staged rows are not decode alternatives
            write_text(jsonl, row("base", "pp512", 20.0, False) + "\n")
            self.assertNotIn("staged ahead", run("table", jsonl).stdout)

    def test_prefill_on_tensor_cores_against_fp32(self):
        def row(step, test, ms, attention, kv="int8"):
            return json.dumps({"test": test, "batch": 4, "weights": "int8", "kv": kv, "graphs": True,
                               "attention": attention, "pdl": True, "gemv_grid": "persistent",
                               "avg_ms": ms, "gbps": 1.0, "peak_gbps": 4000.0, "engine": "shardlm", "step": step})
        with tempfile.TemporaryDirectory() as d:
            jsonl = os.path.join(d, "rows.jsonl")
            write_text(jsonl, "\n".join([
                row("base", "pp512", 20.0, "flash+rope"), row("base", "tg128", 128.0, "flash+rope"),
                row("fp32", "pp512", 25.0, "flash-fp32+rope"), row("fp32", "tg128", 128.0, "flash-fp32+rope"),
                row("f16", "pp512", 20.0, "flash+rope", kv="fp16"),  # no FP32 row to compare with
            ]) + "\n")
            r = run("table", jsonl)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("| 4 | int8 | int8 | 25.00 | 20.00 (0.80) |", r.stdout)
            self.assertNotIn("| 4 | int8 | fp16 |", r.stdout.split("Prefill attention on tensor cores")[1])
            self.assertNotIn("Decode alternatives", r.stdout)  # flash-fp32 rows are not decode alternatives
            write_text(jsonl, row("base", "pp512", 20.0, "flash+rope") + "\n")
            self.assertNotIn("Prefill attention on tensor cores", run("table", jsonl).stdout)


class Tokens(unittest.TestCase):
    def test_equal_and_different(self):
        with tempfile.TemporaryDirectory() as d:
            def write(name, toks):
                p = os.path.join(d, name)
                write_text(p, json.dumps({"results": [{"tokens": t} for t in toks]}))
                return p
            a = write("a.json", [[1, 2, 3], [4]])
            self.assertEqual(run("tokens", a, write("b.json", [[1, 2, 3], [4]])).returncode, 0)
            r = run("tokens", a, write("c.json", [[1, 2, 9], [4]]))
            self.assertEqual(r.returncode, 1)
            self.assertIn("tokens differ", r.stderr)


if __name__ == "__main__":
    unittest.main()
