"""The benchmark's GPU half (issues 22 and 30): the GPU code path end to end on the emulated device, goals in every
dtype and both passes, results where read_result finds them, interleaved timing, the preset's budget from its counts.

No test looks at how long anything took: timings are only checked to be well formed.
"""

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

import posenc.study.benchmark as bench
from posenc.study import bench_budget, bench_paths, goals, measure, results

STORED = Path(__file__).parents[1] / "chapters" / "results"
# the colab preset at tiny shapes: the same schemes, paths, passes and GPU steps (every SDPA backend, L2 flush,
# CUDA events around calls issued back to back)
COLAB_TINY = dataclasses.replace(bench.tiny("colab"), time_budget_s=300.0)
FORWARD_ONLY = "measured forward only"


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
        if row["scheme"] == "t5_computed" and row["pass"] == bench.BACKWARD:
            assert row["status"] == "skipped" and FORWARD_ONLY in row["reason"]
            continue
        assert row["status"] == "ok" and row["device"] == "cuda" and row["dtype"] == "bfloat16", row
        if row["scheme"] == "matmul":
            continue
        assert row["max_abs_err"] <= bench_paths.TOLERANCE[torch.bfloat16] and row["check_seq_len"] == row["seq_len"], row
        assert row["q25_ms"] <= row["median_ms"] <= row["q75_ms"] and row["repeats"] == COLAB_TINY.repeats
        assert row["calls"] >= COLAB_TINY.min_calls and row["host_ms"] > 0  # calls issued back to back per sample
        assert row["ratio_q25"] <= row["ratio"] <= row["ratio_q75"], row  # interleaved with the baseline in the same rounds
        assert row["memory_counter"] == "cuda_allocator" and row["memory_bound"] == "exact"
        assert row["peak_mem_bytes"] > 0 or row["path"] == "preallocated"  # a copy into a buffer made once
    timed = sum(r["repeats"] * r["calls"] for r in rows if r["scheme"] != "matmul" and r["status"] == "ok")
    assert len(flushes) == timed  # an L2 flush before every timed call
    # every SDPA backend is a row of its own; the baseline of a shape and pass is the fastest of them
    for length in COLAB_TINY.lengths:
        for pass_ in bench.PASSES:
            group = [r for r in rows if (r["seq_len"], r["pass"]) == (length, pass_) and r["scheme"] not in ("copy", "rope", "matmul")]
            sdpa = {r["path"]: r for r in group if r["path"] in bench.BASELINE_PATHS}
            assert set(sdpa) == set(bench.BASELINE_PATHS)
            fastest = min(sdpa.values(), key=lambda r: r["median_ms"])
            assert {r["baseline"] for r in group if r["status"] == "ok"} == {fastest["path"]} and fastest["ratio"] == 1.0
            assert all(r["kept_bytes"] == 0 and r["backend"] in ("default", "cudnn", "flash", "efficient") for r in sdpa.values())
    operations = [r for r in rows if r["scheme"] in ("copy", "rope") and r["status"] == "ok"]
    assert {r["baseline"] for r in operations} == {"preallocated"}  # RoPE in a group of its own, against the copy
    for r in rows:  # the SDPA paths of ALiBi and the window keep an (H, L, L) mask per shape: shown apart, not hidden
        if r["path"] == "sdpa" and r["scheme"] in ("alibi", "sliding_window"):
            assert r["kept_bytes"] >= COLAB_TINY.heads * r["seq_len"] ** 2 * 2 if r["scheme"] == "alibi" else r["kept_bytes"] >= r["seq_len"] ** 2, r
        if r["path"] == "flex":
            assert r["kept_bytes"] is None
        if r["scheme"] == "sliding_window" and r["status"] == "ok":  # the window's FLOPs: the blocks it leaves
            frac = meta["block_fractions"][str(r["seq_len"])]
            nominal = bench.nominal_flops(r["pass"], r["batch"], r["heads"], r["seq_len"], r["head_dim"])
            assert r["flops"] == round(nominal * frac["sliding_window"] / frac["causal"]) <= nominal
    with pytest.raises(ValueError, match="nbytes"):
        measure.l2_flusher("cuda", 0)
    assert meta["device"]["type"] == "cuda" and "L2 flush" in meta["timer"] and meta["budget"]["time_budget_s"] == 300.0
    per_length = 4 * 2 + 1 + 1  # flex: 4 schemes, both passes; T5's former score_mod forward; RoPE compiled
    assert meta["budget"]["compiles"] == meta["compiles_run"] == per_length * len(COLAB_TINY.lengths)
    assert meta["complete"] and len(meta["clocks"]) == len(bench.bench_run._groups(bench.plan(COLAB_TINY, 2**34, torch.bfloat16)))
    assert {c["group"] for c in meta["clocks"]} >= {"L=64 forward, copy and RoPE", "L=64 forward+backward"}  # nvidia-smi's where it runs

    # read back from the one results folder, with no folder named, and judged there
    text = results.read_result("benchmark_colab_tiny.csv")
    stored_meta = json.loads(results.read_result("benchmark_colab_tiny.json"))
    assert text is not None and stored_meta == meta
    back, again = bench.read_run("colab_tiny")
    assert again == meta and bench.read_run("colab_never_run") is None
    assert 0 < meta["compile_s_run"] and meta["budget"]["compile_s"] > 0  # what compiling took, beside what the budget assumed
    assert len(back) == len(rows)
    for got, row in zip(back, rows):
        for column in ("scheme", "path", "pass", "dtype", "seq_len", "status", "backend", "memory_counter", "kept_bytes", "peak_mem_bytes", "baseline", "run"):
            assert got[column] == row[column], (column, got, row)
        for column in ("median_ms", "ratio"):
            assert (got[column] is None) == (row[column] is None) and (got[column] is None or math.isclose(got[column], row[column], rel_tol=1e-5))
    judged = goals.goals(back, stored_meta["block_fractions"], from_length=64, samples=stored_meta["samples_ms"])
    assert len(judged) == len(meta["goals"])
    for new, old in zip(judged, meta["goals"]):  # the CSV keeps 6 digits: the same verdicts, the values to 1e-4
        assert (new["goal"], new["verdict"], new["met"], new["bound"]) == (old["goal"], old["verdict"], old["met"], old["bound"])
        assert (new["value"] is None) == (old["value"] is None) and (new["value"] is None or math.isclose(new["value"], old["value"], rel_tol=1e-4))
    names = {(g["goal"], g["pass"], g["seq_len"]) for g in judged}
    for pass_ in bench.PASSES:
        for length in COLAB_TINY.lengths:
            assert (f"plain causal flex, speed / the fastest causal SDPA ({pass_})", pass_, length) in names
            assert (f"nope: flex through posenc.attention / the kernel called directly ({pass_})", pass_, length) in names
            for scheme in ("alibi", "t5"):
                assert (f"{scheme}: flex / plain causal flex, the position's cost ({pass_})", pass_, length) in names
            assert (f"window: flex / (causal flex x its block fraction) ({pass_})", pass_, length) in names
    assert ("RoPE compiled: bandwidth / a preallocated copy's (bfloat16)", bench.FORWARD, 128) in names
    assert any("peak memory linear in L" in g["goal"] for g in judged)
    for g in judged:  # every goal judged from the numbers (the emulated device decides nothing about a real GPU)
        assert g["device"] == "cuda" and g["verdict"] in goals.VERDICTS, g
        if g["value"] is None:  # only where the preset left the partner out
            assert "Hugging Face" in g["reason"] or FORWARD_ONLY in g["reason"], g
            continue
        assert g["met"] in (True, False) and g["reason"] == "", g
        if g.get("iqr"):  # the spread of the per-round ratios travels with the verdict
            assert g["iqr"][0] <= g["value"] <= g["iqr"][1], g
    assert goals.goals(back, stored_meta["block_fractions"]) == [g for g in judged if "linear in L" in g["goal"]]  # tiny: below 4k


def test_the_stored_cpu_runs_yield_their_goals():
    for name in ("cpu", "kernel"):
        meta = json.loads(results.read_result(f"benchmark_{name}.json", STORED, required=True))
        if meta.get("format", 1) < bench.FORMAT:
            pytest.skip(f"the stored {name} run predates format {bench.FORMAT}: re-make it (README, 'Reproduce')")
        rows = bench.read_rows(results.read_result(f"benchmark_{name}.csv", STORED, required=True))
        assert {r["device"] for r in rows} == {"cpu"} and {r["run"] for r in rows} == {1, 2, 3}  # three fresh runs
        assert [r["run"] for r in meta["runs"]] == [1, 2, 3] and meta["complete"]
        judged = goals.goals(rows, meta["block_fractions"], from_length=meta["config"].get("goal_length", goals.GOAL_LENGTH),
                             samples=meta["samples_ms"])
        stored = {(g["goal"], g["seq_len"]): g for g in meta["goals"]}
        assert sorted((g["goal"], g["seq_len"]) for g in judged) == sorted(stored)  # the same goals, none dropped, none added
        for new in judged:
            old = stored[(new["goal"], new["seq_len"])]
            assert (new["met"], new["verdict"], new["bound"], new["reason"]) == (old["met"], old["verdict"], old["bound"], old["reason"]), new
            for key in ("value", "lower_bound_mib"):  # the CSV keeps 6 digits
                assert (new.get(key) is None) == (old.get(key) is None) and (new.get(key) is None or math.isclose(new[key], old[key], rel_tol=1e-4)), (key, new)
            if "peak memory" in new["goal"]:  # a resident-set growth, a lower bound: it cannot certify "<= 64 MiB"
                assert new["met"] is None and "lower bound" in new["reason"] and new["lower_bound_mib"] is not None


def _row(scheme, path, pass_, ms, length=4096, dtype="float16", status="ok", run=1, **extra):
    row = dict.fromkeys(bench.COLUMNS)
    row.update({"device": "cuda", "scheme": scheme, "path": path, "dtype": dtype, "seq_len": length, "batch": 1,
                "median_ms": ms, "status": status, "reason": "", "run": run, **extra})
    row["pass"] = pass_
    return row


def test_gpu_goals_ask_one_question_each_in_every_dtype_and_pass_and_say_why_not():
    f, b = bench.FORWARD, bench.BACKWARD
    rows = [
        _row("nope", "sdpa_causal", f, 1.1), _row("nope", "sdpa_cudnn", f, 1.0), _row("nope", "sdpa_causal", b, 3.0),
        _row("nope", "flex", f, 1.0), _row("nope", "flex", b, 3.75),  # 0.8x of SDPA's speed backward: met
        _row("nope", "flex_direct", f, 0.9), _row("nope", "flex_direct", b, 3.75),
        _row("alibi", "flex", f, 1.2), _row("alibi", "flex", b, None, status="skipped", reason="InductorError: T4 (sm75) ..."),
        _row("sliding_window", "flex", f, 0.3), _row("sliding_window", "flex", b, 1.0),
        _row("copy", "preallocated", f, 0.1), _row("rope", "posenc_compiled", f, 0.2),
        _row("rope", "posenc", f, 0.3), _row("rope", "hf_eager", f, 0.3),
        _row("nope", "sdpa_causal", f, 2.0, dtype="bfloat16"), _row("nope", "flex", f, 2.0, dtype="bfloat16"),
        _row("t5", "flex", f, 2.6, dtype="bfloat16"),
    ]
    judged = {(g["goal"], g["dtype"]): g for g in goals.goals(rows, {"4096": {"causal": 0.5, "sliding_window": 0.125}})}
    speed = "plain causal flex, speed / the fastest causal SDPA"
    assert judged[(f"{speed} ({f})", "float16")]["met"] is True and judged[(f"{speed} ({f})", "float16")]["baseline_path"] == "sdpa_cudnn"
    assert judged[(f"{speed} ({b})", "float16")]["value"] == 0.8 and judged[(f"{speed} ({b})", "float16")]["met"] is True
    overhead = judged[(f"nope: flex through posenc.attention / the kernel called directly ({f})", "float16")]
    assert math.isclose(overhead["value"], 1 / 0.9) and overhead["met"] is False  # posenc's own cost, apart
    position = "flex / plain causal flex, the position's cost"
    assert judged[(f"alibi: {position} ({f})", "float16")]["met"] is False  # 1.2 > 1.1
    skipped = judged[(f"alibi: {position} ({b})", "float16")]  # a goal a path cannot reach on this device: kept, with the reason
    assert skipped["met"] is None and skipped["value"] is None and "T4 (sm75)" in skipped["reason"]
    assert judged[(f"t5: {position} ({f})", "bfloat16")]["met"] is False and judged[(f"t5: {position} ({f})", "bfloat16")]["value"] == 1.3
    window = "window: flex / (causal flex x its block fraction)"  # against causal flex, not SDPA
    assert math.isclose(judged[(f"{window} ({f})", "float16")]["value"], 0.3 / 1.0 / 0.25) and judged[(f"{window} ({f})", "float16")]["met"] is False
    assert math.isclose(judged[(f"{window} ({b})", "float16")]["value"], 1.0 / 3.75 / 0.25) and judged[(f"{window} ({b})", "float16")]["met"] is True
    assert judged[("RoPE compiled: bandwidth / a preallocated copy's (float16)", "float16")]["value"] == 0.5
    assert judged[("RoPE eager: posenc / Hugging Face (float16)", "float16")]["value"] == 1.0
    no_fractions = {g["goal"]: g for g in goals.goals(rows) if g["goal"].startswith("window")}
    assert all(g["met"] is None and "block fractions" in g["reason"] for g in no_fractions.values()) and len(no_fractions) == 2


def test_a_goal_is_met_only_where_every_run_meets_it_and_ratios_are_paired_per_round():
    f = bench.FORWARD
    # RoPE and Hugging Face's, timed in the same three rounds: the per-round ratios, not the ratio of medians
    rope = [_row("rope", "posenc", f, 1.0, run=1), _row("rope", "hf_eager", f, 1.0, run=1)]
    samples = {"1/rope/posenc/forward/float16/4096/1": [1.0, 2.0, 4.0], "1/rope/hf_eager/forward/float16/4096/1": [2.0, 2.0, 2.0]}
    value, iqr = goals.paired(rope[0], rope[1], samples)
    assert value == 1.0 and iqr == [0.75, 1.5]
    assert goals.paired(rope[0], rope[1], None) == (1.0, None)  # no samples kept: the ratio of medians
    runs = [_row("rope", "posenc", f, ms, run=i) for i, ms in ((1, 1.0), (2, 1.0), (3, 1.3))]
    runs += [_row("rope", "hf_eager", f, 1.0, run=i) for i in (1, 2, 3)]
    judged = [g for g in goals.goals(runs) if g["goal"].startswith("RoPE eager")]
    assert len(judged) == 1 and judged[0]["verdict"] == "inconclusive" and judged[0]["met"] is None
    assert judged[0]["values"] == [1.0, 1.0, 1.3] and judged[0]["reason"] == "met in 2 of 3 runs" and judged[0]["value"] == 1.0
    same = [dict(r, median_ms=1.3) if r["path"] == "posenc" else r for r in runs]
    assert [g["verdict"] for g in goals.goals(same) if g["goal"].startswith("RoPE eager")] == ["NOT met"]
    rows, meta = bench.merge_runs([([dict(r, run=1) for r in runs if r["run"] == i], {
        "preset": "p", "device": {"type": "cuda"}, "config": {"goal_length": 4096}, "block_fractions": {},
        "samples_ms": {}, "complete": True, "elapsed_s": 1.0, "date": str(i)}) for i in (1, 2, 3)])
    assert [r["run"] for r in rows] == [1, 1, 2, 2, 3, 3] and [r["date"] for r in meta["runs"]] == ["1", "2", "3"]
    assert [g["verdict"] for g in meta["goals"] if g["goal"].startswith("RoPE eager")] == ["inconclusive"]


def test_memory_goals_use_only_exact_counters():
    f = bench.FORWARD
    series = [_row("alibi", "flex", f, 1.0, length=n, peak_mem_bytes=m, memory_counter=c) for n, m, c in
              ((1024, 10, "cuda_allocator"), (2048, 20, "cuda_allocator"), (4096, 41, "cuda_allocator"))]
    quadratic = [dict(r, scheme="t5", peak_mem_bytes=r["seq_len"] ** 2) for r in series]
    mixed = [dict(r, scheme="nope", memory_counter=c) for r, c in zip(series, ("cuda_allocator", "process_rss", "cuda_allocator"))]
    # the same tokens per call: a batch that halves as L doubles leaves the memory per sequence linear
    same_tokens = [dict(r, scheme="sliding_window", batch=4096 // r["seq_len"], peak_mem_bytes=100) for r in series]
    judged = {g["scheme"]: g for g in goals.goals(series + quadratic + mixed + same_tokens) if "linear in L" in g["goal"]}
    assert judged["alibi"]["met"] is True and judged["alibi"]["lengths"] == [1024, 2048, 4096]
    assert judged["t5"]["met"] is False and judged["t5"]["value"] == 2.0
    assert judged["sliding_window"]["met"] is True and judged["sliding_window"]["value"] == 1.0
    assert judged["nope"]["met"] is None and "not one exact counter" in judged["nope"]["reason"]  # two counters are never compared
    cpu = [dict(r, device="cpu", peak_mem_bytes=2**20, memory_counter="process_rss") for r in series[-1:]]
    memory = [g for g in goals.goals(cpu) if "peak memory" in g["goal"]]
    assert memory and memory[0]["met"] is None and "lower bound" in memory[0]["reason"]
    exact = goals.goals([dict(cpu[0], memory_counter="tensors")])
    assert [g["met"] for g in exact if "peak memory" in g["goal"]] == [True]


def test_time_rounds_interleaves_samples_and_drops_a_call_that_fails():
    order = []

    def make(name):
        return lambda: order.append(name)

    def broken():
        raise RuntimeError("no kernel for this shape")

    times, failed = measure.time_rounds({"a": make("a"), "b": make("b"), "c": make("c"), "x": broken}, torch.device("cpu"), 0, 3)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # round-robin, the start rotating
    assert set(times) == {"a", "b", "c"} and all(len(t) == 3 and t.calls == 1 for t in times.values()) and "no kernel" in str(failed["x"])
    order.clear()
    times, _ = measure.time_rounds({"a": make("a"), "b": make("b")}, "cpu", 0, 2, min_calls=3)
    assert order == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3  # a sample: calls back to back
    assert all(len(t.ms) == len(t.host_ms) == len(t.faults) == 2 for t in times.values())
    with pytest.raises(ValueError, match="rounds"):
        measure.time_rounds({"a": make("a")}, "cpu", 0, 0)
    with pytest.raises(TypeError, match="dict"):
        measure.time_rounds([make("a")], "cpu", 0, 1)
    assert measure.l2_flusher("cpu") is None  # a CPU's caches cannot be flushed from here: none is pretended


def test_the_colab_preset_is_sized_from_its_counts():
    colab = bench.PRESETS["colab"]
    assert colab.device == "cuda" and colab.time_budget_s is None and colab.lengths[0] == max(colab.lengths)  # longest first
    assert all(colab.batch_at(n) * n == colab.tokens == 65536 for n in colab.lengths)  # every call long enough to time
    for dtype, model in ((torch.float16, "t4"), (torch.bfloat16, "h100")):
        est = bench.budget(colab, 15 * 2**30, dtype, model)
        tasks = [t for t in bench.plan(colab, 15 * 2**30, dtype) if t.skip is None]
        assert est["measurements"] == len(tasks)
        assert est["compiles"] == sum(t.path in ("flex", "posenc_compiled") for t in tasks) == (4 * 2 + 1 + 1) * len(colab.lengths)
        m = bench_budget.COST_MODELS[model]
        n_fwd, n_bwd = est["compiles_by_pass"][bench.FORWARD], est["compiles_by_pass"][bench.BACKWARD]
        assert math.isclose(est["compile_s"], n_fwd * m.compile_forward_s + n_bwd * m.compile_backward_s)
        assert est["estimate_s"] >= m.fixed_s + est["compile_s"] + est["run_s"] - 0.2
        assert est["time_budget_s"] == round(bench_budget.BUDGET_MARGIN * est["estimate_s"])
        assert est["model"] == dataclasses.asdict(m)  # the assumptions travel with the estimate
    # the cost model follows the device: a T4's assumptions are not an H100's
    assert [bench.cost_model_for(c) for c in (None, (7, 5), (8, 0), (8, 9), (9, 0), (10, 0))] == ["cpu", "t4", "a100", "l4", "h100", "h100"]
    assert bench.budget(colab, 80 * 2**30, torch.bfloat16, "h100")["estimate_s"] < 240  # the GPU command's benchmark stage
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
