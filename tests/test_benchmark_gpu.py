"""The benchmark's GPU half (issue 22): the GPU code path end to end on the emulated device, goals in every dtype and
both passes, results where read_result finds them, interleaved timing, the preset's budget from its counts.

No test looks at how long anything took: timings are only checked to be well formed.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import posenc.study.benchmark as bench
from posenc.study import bench_paths, goals, measure, presets, results

STORED = Path(__file__).parents[1] / "chapters" / "results"
# the colab preset at tiny shapes: the same schemes, paths, passes and GPU steps (backend choice, L2 flush, CUDA events)
COLAB_TINY = dataclasses.replace(
    bench.PRESETS["colab"], name="colab_tiny", lengths=(64, 128), batch=1, heads=2, head_dim=16, window=16, warmup=1, repeats=3,
    matmul_size=64, l2_flush_bytes=2**16, hf_rope=False, max_bytes=2**28, time_budget_s=300.0, t5_buckets=8, t5_max_distance=32,
)  # fmt: skip


def test_the_gpu_code_path_runs_end_to_end_on_the_emulated_device(emulated_cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_RESULTS", str(tmp_path))
    flushes = []
    real_flusher = bench_paths.l2_flusher

    def counting_flusher(device, nbytes=None):
        flush = real_flusher(device, nbytes)
        return lambda: (flushes.append(1), flush())

    monkeypatch.setattr(bench_paths, "l2_flusher", counting_flusher)
    rows, meta = bench.run(COLAB_TINY, results.results_dir())

    # every planned path ran on the device (Hugging Face's RoPE is left out of this preset), each checked
    for row in rows:
        if row["path"] == "hf_eager":
            assert row["status"] == "skipped" and "left out of the colab_tiny preset" in row["reason"]
            continue
        assert row["status"] == "ok" and row["device"] == "cuda" and row["dtype"] == "bfloat16", row
        if row["scheme"] == "matmul":
            continue
        assert row["max_abs_err"] <= bench_paths.TOLERANCE[torch.bfloat16] and row["check_seq_len"] == row["seq_len"], row
        assert row["q25_ms"] <= row["median_ms"] <= row["q75_ms"] and row["repeats"] == COLAB_TINY.repeats
        assert row["ratio_q25"] <= row["ratio"] <= row["ratio_q75"], row  # interleaved with the baseline in the same rounds
        assert row["memory_counter"] == "cuda_allocator" and row["memory_bound"] == "exact" and row["peak_mem_bytes"] > 0
    timed = sum(r["repeats"] for r in rows if r["scheme"] != "matmul" and r["status"] == "ok")
    assert len(flushes) == timed  # an L2 flush before every timed call
    baseline = [r for r in rows if (r["scheme"], r["path"]) == bench.BASELINE]
    assert baseline and all(r["ratio"] == 1.0 and r["backend"] in bench_paths.BACKENDS and r["kept_bytes"] == 0 for r in baseline)
    assert {(r["seq_len"], r["pass"]) for r in baseline} == {(n, p) for n in COLAB_TINY.lengths for p in bench.PASSES}  # chosen per shape and pass
    for r in rows:  # the SDPA paths of ALiBi and the window keep an (H, L, L) mask per shape: shown apart, not hidden
        if r["path"] == "sdpa" and r["scheme"] in ("alibi", "sliding_window"):
            assert r["kept_bytes"] >= COLAB_TINY.heads * r["seq_len"] ** 2 * 2 if r["scheme"] == "alibi" else r["kept_bytes"] >= r["seq_len"] ** 2, r
        if r["path"] == "flex":
            assert r["kept_bytes"] is None
    with pytest.raises(ValueError, match="nbytes"):
        measure.l2_flusher("cuda", 0)
    assert meta["device"]["type"] == "cuda" and "L2 flush" in meta["timer"] and meta["budget"]["time_budget_s"] == 300.0
    assert meta["budget"]["compiles"] == meta["compiles_run"] == 2 * len(COLAB_TINY.lengths) * 4 + len(COLAB_TINY.lengths)

    # read back from the one results folder, with no folder named, and judged there
    text = results.read_result("benchmark_colab_tiny.csv")
    stored_meta = json.loads(results.read_result("benchmark_colab_tiny.json"))
    assert text is not None and stored_meta == meta
    back, again = bench.read_run("colab_tiny")
    assert again == meta and bench.read_run("colab_never_run") is None
    assert 0 < meta["compile_s_run"] and meta["budget"]["compile_s"] > 0  # what compiling took, beside what the budget assumed
    assert len(back) == len(rows)
    for got, row in zip(back, rows):
        for column in ("scheme", "path", "pass", "dtype", "seq_len", "status", "backend", "memory_counter", "kept_bytes", "peak_mem_bytes"):
            assert got[column] == row[column], (column, got, row)
        for column in ("median_ms", "ratio"):
            assert (got[column] is None) == (row[column] is None) and (got[column] is None or math.isclose(got[column], row[column], rel_tol=1e-5))
    judged = goals.goals(back, stored_meta["block_fractions"], from_length=64)
    names = {(g["goal"], g["pass"], g["seq_len"]) for g in judged}
    for pass_ in bench.PASSES:
        for scheme in ("nope", "alibi", "t5"):
            assert (f"{scheme} through compiled flex, speed / fastest causal SDPA ({pass_})", pass_, 128) in names
        assert (f"window through compiled flex, time / (blocks computed x causal time) ({pass_})", pass_, 64) in names
    assert ("RoPE compiled, bandwidth / a copy's (bfloat16)", bench.FORWARD, 128) in names
    assert any("peak memory linear in L" in g["goal"] for g in judged)
    for g in judged:  # every goal judged from the numbers (the emulated device decides nothing about a real GPU)
        assert g["device"] == "cuda" and g["value"] is not None and g["met"] in (True, False) and g["reason"] == "", g
        if "flex" in g["goal"] and "linear" not in g["goal"]:  # the spread of the per-round ratios travels with the verdict
            assert g["iqr"][0] <= g["value"] <= g["iqr"][1], g
    assert goals.goals(back, stored_meta["block_fractions"]) == [g for g in judged if "linear in L" in g["goal"]]  # tiny: below 4k


def test_the_stored_cpu_runs_yield_their_goals():
    for name in ("cpu", "kernel"):
        meta = json.loads(results.read_result(f"benchmark_{name}.json", STORED, required=True))
        rows = bench.read_rows(results.read_result(f"benchmark_{name}.csv", STORED, required=True))
        assert {r["device"] for r in rows} == {"cpu"}
        judged = goals.goals(rows, meta["block_fractions"], from_length=meta["config"].get("goal_length", goals.GOAL_LENGTH))
        stored = {(g["goal"], g["seq_len"]): g for g in meta["goals"]}
        assert sorted((g["goal"], g["seq_len"]) for g in judged) == sorted(stored)  # the same goals, none dropped, none added
        for new in judged:
            old = stored[(new["goal"], new["seq_len"])]
            assert (new["met"], new["bound"], new["reason"]) == (old["met"], old["bound"], old["reason"]), new
            for key in ("value", "lower_bound_mib"):  # the CSV keeps 6 digits
                assert (new.get(key) is None) == (old.get(key) is None) and (new.get(key) is None or math.isclose(new[key], old[key], rel_tol=1e-4)), (key, new)
            if "peak memory" in new["goal"]:  # a resident-set growth, a lower bound: it cannot certify "<= 64 MiB"
                assert new["met"] is None and "lower bound" in new["reason"] and new["lower_bound_mib"] is not None


def _row(scheme, path, pass_, ms, length=4096, dtype="float16", status="ok", **extra):
    row = dict.fromkeys(bench.COLUMNS)
    row.update({"device": "cuda", "scheme": scheme, "path": path, "dtype": dtype, "seq_len": length, "batch": 1, "median_ms": ms, "status": status, "reason": "", **extra})
    row["pass"] = pass_
    return row


def test_gpu_goals_judge_every_dtype_and_both_passes_and_say_why_not():
    f, b = bench.FORWARD, bench.BACKWARD
    rows = [
        _row("nope", "sdpa_causal", f, 1.0), _row("nope", "sdpa_causal", b, 3.0),
        _row("nope", "flex", f, 1.0, ratio=1.0), _row("nope", "flex", b, 3.0, ratio=1.25),  # 0.8x of SDPA's speed backward: met
        _row("alibi", "flex", f, 1.2, ratio=1.2), _row("alibi", "flex", b, None, status="skipped", reason="InductorError: T4 (sm75) ..."),
        _row("sliding_window", "flex", f, 0.3, ratio=0.3), _row("sliding_window", "flex", b, 1.0, ratio=1 / 3),
        _row("copy", "clone", f, 0.1, bytes_moved=100), _row("rope", "posenc_compiled", f, 0.2, bytes_moved=100),
        _row("nope", "sdpa_causal", f, 2.0, dtype="bfloat16"), _row("t5", "flex", f, 2.0, dtype="bfloat16", ratio=1.0),
    ]  # fmt: skip
    judged = {(g["goal"], g["dtype"]): g for g in goals.goals(rows, {"4096": {"causal": 0.5, "sliding_window": 0.125}})}
    speed = "through compiled flex, speed / fastest causal SDPA"
    assert judged[(f"nope {speed} ({f})", "float16")]["met"] is True and judged[(f"nope {speed} ({b})", "float16")]["value"] == 0.8
    assert judged[(f"alibi {speed} ({f})", "float16")]["met"] is False  # 1/1.2 < 0.9
    skipped = judged[(f"alibi {speed} ({b})", "float16")]  # a goal a path cannot reach on this device: kept, with the reason
    assert skipped["met"] is None and skipped["value"] is None and "T4 (sm75)" in skipped["reason"]
    assert judged[(f"t5 {speed} ({f})", "bfloat16")]["met"] is True  # judged in bf16 as in fp16
    window = "window through compiled flex, time / (blocks computed x causal time)"
    assert math.isclose(judged[(f"{window} ({f})", "float16")]["value"], 0.3 / 0.25) and judged[(f"{window} ({f})", "float16")]["met"] is False
    assert math.isclose(judged[(f"{window} ({b})", "float16")]["value"], (1 / 3) / 0.25) and judged[(f"{window} ({b})", "float16")]["met"] is False
    assert judged[("RoPE compiled, bandwidth / a copy's (float16)", "float16")]["value"] == 0.5
    no_fractions = {g["goal"]: g for g in goals.goals(rows) if g["goal"].startswith("window")}
    assert all(g["met"] is None and "block fractions" in g["reason"] for g in no_fractions.values()) and len(no_fractions) == 2


def test_memory_goals_use_only_exact_counters():
    f = bench.FORWARD
    series = [_row("alibi", "flex", f, 1.0, length=n, peak_mem_bytes=m, memory_counter=c) for n, m, c in
              ((1024, 10, "cuda_allocator"), (2048, 20, "cuda_allocator"), (4096, 41, "cuda_allocator"))]  # fmt: skip
    quadratic = [dict(r, scheme="t5", peak_mem_bytes=r["seq_len"] ** 2) for r in series]
    mixed = [dict(r, scheme="nope", memory_counter=c) for r, c in zip(series, ("cuda_allocator", "process_rss", "cuda_allocator"))]
    judged = {g["scheme"]: g for g in goals.goals(series + quadratic + mixed) if "linear in L" in g["goal"]}
    assert judged["alibi"]["met"] is True and judged["alibi"]["lengths"] == [1024, 2048, 4096]
    assert judged["t5"]["met"] is False and judged["t5"]["value"] == 2.0
    assert judged["nope"]["met"] is None and "not one exact counter" in judged["nope"]["reason"]  # two counters are never compared
    cpu = [dict(r, device="cpu", peak_mem_bytes=2**20, memory_counter="process_rss") for r in series[-1:]]
    memory = [g for g in goals.goals(cpu) if "peak memory" in g["goal"]]
    assert memory and memory[0]["met"] is None and "lower bound" in memory[0]["reason"]
    exact = goals.goals([dict(cpu[0], memory_counter="tensors")])
    assert [g["met"] for g in exact if "peak memory" in g["goal"]] == [True]


def test_time_rounds_interleaves_and_drops_a_call_that_fails():
    order = []

    def make(name):
        return lambda: order.append(name)

    def broken():
        raise RuntimeError("no kernel for this shape")

    times, failed = measure.time_rounds({"a": make("a"), "b": make("b"), "c": make("c"), "x": broken}, torch.device("cpu"), 0, 3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # round-robin, the start rotating
    assert set(times) == {"a", "b", "c"} and all(len(t) == 3 for t in times.values()) and "no kernel" in str(failed["x"])
    with pytest.raises(ValueError, match="rounds"):
        measure.time_rounds({"a": make("a")}, "cpu", 0, 0)
    with pytest.raises(TypeError, match="dict"):
        measure.time_rounds([make("a")], "cpu", 0, 1)
    assert measure.l2_flusher("cpu") is None  # a CPU's caches cannot be flushed from here: none is pretended


def test_the_colab_preset_is_sized_from_its_counts():
    colab = bench.PRESETS["colab"]
    assert colab.device == "cuda" and colab.time_budget_s is None and min(colab.lengths) == 4096 and len(colab.lengths) >= 2
    for dtype, model in ((torch.float16, "t4"), (torch.bfloat16, "h100")):
        est = bench.budget(colab, 15 * 2**30, dtype, model)
        tasks = [t for t in bench.plan(colab, 15 * 2**30, dtype) if t.skip is None]
        assert est["measurements"] == len(tasks)
        assert est["compiles"] == sum(t.path in ("flex", "posenc_compiled") for t in tasks) == 4 * 2 * len(colab.lengths) + len(colab.lengths)
        m = presets.COST_MODELS[model]
        n_fwd, n_bwd = est["compiles_by_pass"][bench.FORWARD], est["compiles_by_pass"][bench.BACKWARD]
        assert math.isclose(est["compile_s"], n_fwd * m.compile_forward_s + n_bwd * m.compile_backward_s)
        assert est["estimate_s"] >= m.fixed_s + est["compile_s"] + est["run_s"] - 0.2
        assert est["time_budget_s"] == round(presets.BUDGET_MARGIN * est["estimate_s"])
        assert est["model"] == dataclasses.asdict(m)  # the assumptions travel with the estimate
    assert bench.budget(colab, 15 * 2**30, torch.float16)["estimate_s"] < 600  # sized for Colab under the T4 assumptions
    assert bench.budget("tiny")["time_budget_s"] == bench.PRESETS["tiny"].time_budget_s  # a stated budget is kept


def test_results_live_in_one_place_and_the_printed_command_writes_there(tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_RESULTS", raising=False)
    assert results.results_dir() == STORED.resolve()  # a checkout: its chapters/results, where the stored runs are
    monkeypatch.chdir(STORED.parent)
    assert results.command_line("benchmark", "colab") == "python -m posenc.study.benchmark --preset colab --out results"
    monkeypatch.setattr(results, "_checkout_results", lambda: None)  # posenc pip-installed: Colab's /content, say
    monkeypatch.chdir(tmp_path)
    assert results.results_dir() == tmp_path / "posenc_results"
    assert results.command_line("benchmark", "colab", notebook=True) == "!python -m posenc.study.benchmark --preset colab --out posenc_results"
    assert results.command_line("extrapolation", "gpu").startswith("python -m posenc.study.extrapolation --preset gpu --out posenc_results")
    assert bench.main(["--preset", "tiny", "--schemes", "copy", "--quiet"]) == 0  # the default --out: the same folder
    assert results.read_result("benchmark_tiny.csv") == (tmp_path / "posenc_results" / "benchmark_tiny.csv").read_text()
    monkeypatch.setenv("POSENC_RESULTS", str(tmp_path / "mine"))
    assert results.results_dir() == tmp_path / "mine" and results.command_line("benchmark", "tiny").endswith("--out mine")
    with pytest.raises(ValueError, match="entry"):
        results.command_line("bench", "tiny")
    with pytest.raises(TypeError, match="preset"):
        results.command_line("benchmark", None)
    with pytest.raises(ValueError, match="file name"):
        results.read_result("results/benchmark_cpu.csv")


def test_bad_arguments_get_named_errors():
    with pytest.raises(ValueError, match="device"):
        dataclasses.replace(COLAB_TINY, device="tpu")
    with pytest.raises(TypeError, match="lengths"):
        dataclasses.replace(COLAB_TINY, lengths=[64])
    with pytest.raises(ValueError, match="lengths"):
        dataclasses.replace(COLAB_TINY, lengths=(0,))
    with pytest.raises(ValueError, match="unknown paths"):
        dataclasses.replace(COLAB_TINY, paths=("flash",))
    with pytest.raises(ValueError, match="rope_dtypes"):
        dataclasses.replace(COLAB_TINY, rope_dtypes=("half8",))
    with pytest.raises(ValueError, match="repeats"):
        dataclasses.replace(COLAB_TINY, repeats=0)
    with pytest.raises(TypeError, match="preset"):
        bench.get_preset(3)
    with pytest.raises(TypeError, match="rows"):
        goals.goals("rows")
    with pytest.raises(ValueError, match="device"):
        goals.goals([], device="tpu")
    with pytest.raises(TypeError, match="text"):
        bench.read_rows(b"preset")
    with pytest.raises(TypeError, match="schemes"):
        bench.run("tiny", schemes="copy")


def test_preset_here_is_the_tiny_variant_where_posenc_tiny_is_set(monkeypatch):
    colab = bench.PRESETS["colab"]
    monkeypatch.delenv(bench.TINY_ENV, raising=False)
    assert bench.preset_here("colab") is colab
    monkeypatch.setenv(bench.TINY_ENV, "1")
    small = bench.preset_here("colab")
    assert small.name == "colab_tiny" and small.device == "cuda" and max(small.lengths) <= 128 and small.goal_length == min(small.lengths)
    assert (small.schemes, small.paths, small.passes) == (colab.schemes, colab.paths, colab.passes) and bench.tiny(small) == small
    monkeypatch.setenv(bench.TINY_ENV, "0")
    assert bench.preset_here("colab") is colab
    with pytest.raises(ValueError, match="goal_length"):
        dataclasses.replace(colab, goal_length=0)
