"""The cost benchmark (posenc.study.benchmark): paths agree with the explicit one, skips carry reasons, files are tidy.

Everything runs on the CPU with the tiny preset (seconds). No test looks at how long
anything took: timings are only checked to be well formed.
"""

import csv
import dataclasses
import datetime
import json
import math
import sys

import pytest
import torch

import posenc.study.benchmark as bench
from posenc.study import bench_paths, runinfo

TINY = bench.PRESETS["tiny"]
CPU = torch.device("cpu")
ATTENTION = [(scheme, path) for scheme, paths in bench.SCHEME_PATHS.items() for path in paths]
ON_A_CPU = [(s, p) for s, p in ATTENTION if p not in bench.SDPA_BACKEND_PATHS]  # forced backends: GPU only
FLEX = ("flex", "flex_uncompiled")
NO_CPU_BACKWARD = "FlexAttention has no backward pass on the CPU"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    rows, meta = bench.run("tiny", out)
    return rows, meta, out


def expected_skip(row) -> str | None:
    """The reasons the tiny preset may skip a row on a CPU; None where it must run."""
    if row["path"] in ("hf_eager", "flex", "flex_direct"):
        return "left out of the tiny preset"
    if row["path"] in FLEX and row["pass"] == bench.BACKWARD and not torch.cuda.is_available():
        return NO_CPU_BACKWARD
    return None


def test_every_planned_measurement_has_one_row(tiny_run):
    rows, _, _ = tiny_run
    keys = [(r["scheme"], r["path"], r["pass"], r["seq_len"], r["batch"], r["dtype"]) for r in rows]
    assert len(keys) == len(set(keys))  # one row per measurement
    planned = {(t.scheme, t.path, t.pass_, t.seq_len, t.batch, t.dtype_name or "float32") for t in bench.plan("tiny")}
    assert planned | {("matmul", "mm", bench.FORWARD, TINY.matmul_size, 1, "float32")} == set(keys)
    for length in TINY.lengths:
        for scheme, path in ON_A_CPU:
            for pass_ in bench.PASSES:
                assert (scheme, path, pass_, length, TINY.batch, "float32") in planned
        assert not any(p in bench.SDPA_BACKEND_PATHS for _, p, *_ in planned)  # one SDPA kernel on a CPU
        assert ("rope", "posenc", bench.FORWARD, length, TINY.batch, "bfloat16") in planned


def test_each_path_runs_and_agrees_with_the_explicit_path(tiny_run):
    rows, _, _ = tiny_run
    for row in rows:
        why = expected_skip(row)
        if why is not None:
            assert row["status"] == "skipped" and why in row["reason"], row
            continue
        assert row["status"] == "ok", row
        if row["scheme"] == "matmul":
            continue
        assert row["check_seq_len"] == row["seq_len"]
        assert row["max_abs_err"] <= bench_paths.TOLERANCE[getattr(torch, row["dtype"])], row
        assert row["q25_ms"] <= row["median_ms"] <= row["q75_ms"] and row["repeats"] == TINY.repeats
        assert row["min_ms"] <= row["median_ms"] and row["calls"] >= 1 and row["host_ms"] > 0
        assert row["faults_per_call"] >= 0 and row["cpu_share"] > 0  # what the OS says of each sample
        # each ratio is to its group's baseline: the preallocated copy for RoPE, causal SDPA for attention
        assert row["baseline"] == ("preallocated" if row["scheme"] in ("copy", "rope") else "sdpa_causal"), row
        assert row["reason"] == "", row
        if row["path"] in FLEX or row["path"] == "posenc_compiled":  # no dispatch mode around compiled code: the resident peak
            assert row["memory_counter"] == "process_rss" and row["peak_mem_bytes"] >= 0, row
        else:
            assert row["memory_counter"] == "tensors" and row["peak_mem_bytes"] > 0 or row["path"] == "preallocated", row
            assert row["path"] != "preallocated" or row["peak_mem_bytes"] == 0  # it writes into a buffer made once


def test_skipped_rows_carry_reasons(tiny_run):
    rows, _, _ = tiny_run
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped, "the tiny preset on a CPU skips flex backward and the Hugging Face path"
    for row in skipped:
        assert row["reason"].strip() and row["median_ms"] is None and row["peak_mem_bytes"] is None


def test_the_csv_is_tidy(tiny_run):
    rows, _, out = tiny_run
    csv_path, _ = bench.result_paths(out, "tiny")
    with csv_path.open(newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        lines = list(reader)
    assert tuple(header) == bench.COLUMNS
    assert len(lines) == len(rows) and all(len(line) == len(header) for line in lines)
    records = [dict(zip(header, line)) for line in lines]
    for r in records:
        assert r["preset"] == "tiny" and r["status"] in ("ok", "skipped")
        assert r["pass"] in bench.PASSES and r["dtype"] in ("float32", "bfloat16") and (r["dtype"] == "float32" or r["scheme"] in ("rope", "copy"))
        for column in ("seq_len", "batch", "heads", "head_dim"):
            assert int(r[column]) > 0
        for column in ("median_ms", "q25_ms", "q75_ms", "peak_mem_bytes", "flops", "bytes_moved", "max_abs_err"):
            assert r[column] == "" or math.isfinite(float(r[column]))
        assert (r["median_ms"] == "") == (r["status"] == "skipped")


def test_the_metadata_is_complete(tiny_run):
    rows, meta, out = tiny_run
    _, json_path = bench.result_paths(out, "tiny")
    assert json.loads(json_path.read_text()) == meta
    for key in ("preset", "config", "device", "dtype", "versions", "git", "date", "threads", "platform", "timer", "memory", "baseline", "block_fractions", "elapsed_s"):
        assert key in meta, key
    assert meta["preset"] == "tiny" and meta["dtype"] == "float32" and meta["threads"] == TINY.threads == 1
    assert meta["config"] == json.loads(json.dumps(dataclasses.asdict(TINY)))
    assert set(meta["device"]) == {"type", "name", "capability", "total_memory_bytes"} and meta["device"]["type"] == "cpu"
    assert {"python", "torch", "cuda_runtime", "cuda_driver", "transformers", "posenc"} <= set(meta["versions"])
    assert meta["versions"]["torch"] == torch.__version__
    assert datetime.datetime.fromisoformat(meta["date"]).tzinfo is not None
    commit = meta["git"]["commit"]
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)
    assert meta["package_sha256"] == runinfo.source_sha256() and len(meta["package_sha256"]) == 64  # the code that made it, without git
    assert meta["benchmarked_sha256"] == runinfo.benchmarked_sha256() != runinfo.source_sha256()  # the part a benchmark measures
    assert meta["timer"].startswith("time.perf_counter") and meta["baseline"]["paths"] == ["sdpa_causal"]
    assert meta["baseline"]["operations"] == "copy/preallocated" and meta["format"] == bench.FORMAT
    assert meta["budget"]["time_budget_s"] == TINY.time_budget_s and meta["baseline_backend"] == ["sdpa_causal"]
    assert meta["complete"] is True and meta["allocator"] is None  # the tiny preset leaves glibc as it is
    timed = [r for r in rows if r["status"] == "ok" and r["scheme"] != "matmul"]
    assert {bench.sample_key(r) for r in timed} == set(meta["samples_ms"])  # every sample kept
    assert all(len(meta["samples_ms"][bench.sample_key(r)]) == r["repeats"] for r in timed)
    assert bench.read_metadata(out, "tiny") == meta and bench.read_metadata(out, "no-such-preset") is None


def test_a_path_that_disagrees_is_skipped_by_its_check(monkeypatch):
    runner = bench_paths.Runner(TINY, CPU, torch.float32)
    good = runner.attention_fn

    def slightly_wrong(scheme, path):
        fn = good(scheme, path)
        return fn if path == "explicit" else (lambda q, k, v: fn(q, k, v) * 1.01)

    monkeypatch.setattr(runner, "attention_fn", slightly_wrong)
    task = bench.Task("alibi", "sdpa", bench.FORWARD, 64, 1)
    with pytest.raises(bench_paths.SkipPath, match="check failed"):
        runner.check(task, 64)
    row = bench.execute(runner, task)
    assert row["status"] == "skipped" and row["reason"].startswith("check failed")


@pytest.mark.parametrize("scheme,path", [(s, p) for s, p in ON_A_CPU if p not in ("flex", "flex_direct")])
def test_each_path_matches_its_reference_forward_and_backward(scheme, path):
    runner = bench_paths.Runner(TINY, CPU, torch.float32)
    for pass_ in bench.PASSES:
        if path == "flex_uncompiled" and pass_ == bench.BACKWARD:
            continue  # no FlexAttention backward on the CPU
        error = runner.check(bench.Task(scheme, path, pass_, 64, 1), 64)
        assert error <= bench_paths.TOLERANCE[torch.float32]


def test_gpu_preset_configuration_and_plan():
    gpu = bench.PRESETS["gpu"]
    assert gpu.device == "cuda" and sorted(gpu.lengths) == [512, 1024, 2048, 4096, 8192, 16384] and gpu.long_lengths == (32768,)
    assert gpu.lengths[:3] == (4096, 8192, 16384)  # the lengths the goals need run first
    assert gpu.compile_flex and not gpu.flex_uncompiled and gpu.max_bytes is None
    assert bench.choose_dtype(torch.device("cuda"), bf16_supported=True) == torch.bfloat16
    assert bench.choose_dtype(torch.device("cuda"), bf16_supported=False) == torch.float16  # Colab's free T4
    assert bench.choose_dtype(CPU) == torch.float32
    with pytest.raises(ValueError, match="device_memory"):
        bench.plan(gpu)
    tasks = bench.plan(gpu, device_memory=80 * 2**30, dtype=torch.bfloat16)
    by_key = {(t.scheme, t.path, t.pass_, t.seq_len): t for t in tasks}
    assert {t.batch for t in tasks if t.seq_len == 32768} == {1}
    assert all(t.batch == gpu.tokens // t.seq_len for t in tasks if t.seq_len < 32768)  # the same tokens per call
    for length in (*gpu.lengths, *gpu.long_lengths):
        for pass_ in bench.PASSES:
            assert by_key[("nope", "sdpa_causal", pass_, length)].skip is None  # the baseline runs at every length
            assert by_key[("alibi", "flex", pass_, length)].skip is None
            assert "materialises" in by_key[("alibi", "flex_uncompiled", pass_, length)].skip
    assert by_key[("nope", "explicit", bench.FORWARD, 512)].skip is None
    assert "GiB by estimate" in by_key[("nope", "explicit", bench.FORWARD, 16384)].skip  # (B, H, L, L) float32 scores
    assert all(t.skip is None or t.skip.strip() for t in tasks)


def test_cpu_preset_states_its_threads_and_skips():
    cpu = bench.PRESETS["cpu"]
    assert cpu.threads == 1 and cpu.lengths == (256, 512, 1024, 2048)
    tasks = bench.plan(cpu)
    assert all("--compile-flex" in t.skip for t in tasks if t.path == "flex")
    assert all(t.skip is None for t in tasks if t.path in ("explicit", "sdpa_causal", "sdpa", "flex_uncompiled"))


def test_metadata_logic_without_a_gpu():
    info = runinfo.cuda_info(CPU)
    assert {"name", "capability", "total_memory_bytes", "cuda_runtime", "cuda_driver", "cudnn", "triton", "clocks",
            "shared_memory_per_block_optin", "multiprocessors", "l2_cache_bytes", "tf32_matmul"} == set(info)
    assert info["name"] is None and info["capability"] is None and info["cuda_driver"] is None
    meta = runinfo.run_metadata("gpu", bench.PRESETS["gpu"], CPU, torch.bfloat16)  # the gpu preset's metadata logic, run on a CPU
    assert meta["preset"] == "gpu" and meta["dtype"] == "bfloat16" and meta["config"]["long_lengths"] == [32768]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_preset_refuses_to_run_without_a_gpu(capsys):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        bench.run("gpu")
    assert bench.main(["--preset", "gpu", "--quiet"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err


def test_command_line_writes_both_files(tmp_path):
    assert bench.main(["--preset", "tiny", "--schemes", "copy", "--out", str(tmp_path), "--quiet"]) == 0
    csv_path, json_path = bench.result_paths(tmp_path, "tiny")
    rows = list(csv.DictReader(csv_path.open()))
    assert {(r["scheme"], r["path"]) for r in rows} == {("copy", "preallocated"), ("copy", "clone"), ("nope", "sdpa_causal"), ("matmul", "mm")}
    assert json.loads(json_path.read_text())["schemes"] == ["copy"]


def test_time_budget_skips_with_a_reason():
    rows, _ = bench.run(dataclasses.replace(TINY, time_budget_s=0.0), schemes=("copy",))
    timed = [r for r in rows if r["scheme"] != "matmul"]
    assert timed and all(r["status"] == "skipped" and "time budget" in r["reason"] for r in timed)


def test_summary_is_median_and_quartiles():
    assert bench.summarize([3.0, 1.0, 2.0, 4.0, 5.0]) == (3.0, 2.0, 4.0)
    assert bench.summarize([2.0]) == (2.0, 2.0, 2.0)


def test_hugging_face_rope_path_agrees_or_says_it_is_missing(monkeypatch):
    preset = dataclasses.replace(TINY, hf_rope=True)
    task = bench.Task("rope", "hf_eager", bench.FORWARD, 64, 1)
    pytest.importorskip("transformers")
    row = bench.execute(bench_paths.Runner(preset, CPU, torch.float32), task)
    assert row["status"] == "ok" and row["max_abs_err"] == 0.0, row  # the same cos and sin: bit-identical
    monkeypatch.setitem(sys.modules, "transformers.models.llama.modeling_llama", None)  # as if not installed
    row = bench.execute(bench_paths.Runner(preset, CPU, torch.float32), task)
    assert row["status"] == "skipped" and "transformers is not installed" in row["reason"]


def test_runs_from_fresh_processes_are_merged_into_one_result(tmp_path):
    assert bench.main(["--preset", "tiny", "--schemes", "copy", "--runs", "2", "--out", str(tmp_path), "--quiet"]) == 0
    rows, meta = bench.read_run("tiny", tmp_path, only=True)
    assert sorted({r["run"] for r in rows}) == [1, 2] and [r["run"] for r in meta["runs"]] == [1, 2]
    assert meta["complete"] and all(key.split("/")[0] in ("1", "2") for key in meta["samples_ms"])
    assert len({r["date"] for r in meta["runs"]}) == 2  # two processes, one after the other
    per_run = [[(r["scheme"], r["path"], r["dtype"]) for r in rows if r["run"] == i] for i in (1, 2)]
    assert per_run[0] == per_run[1]  # the same measurements in each run
