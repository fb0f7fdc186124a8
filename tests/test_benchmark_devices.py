"""The benchmark on every GPU a reader may have, checked at the shape it times, and safe to stop (issue 30).

A T4 is emulated (compute capability 7.5, 64 KiB of shared memory per block, no native bfloat16); the explicit
reference computed a block of queries at a time equals the whole one; a run stopped after a group keeps every
finished group whole; glibc's allocator is held steady where a preset says. No test looks at how long anything took.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

import posenc
import posenc.study.benchmark as bench
from posenc import core
from posenc.study import bench_paths, bench_run

FLEX = sys.modules[core.flex_kernel_options.__module__]  # where FlexAttention's helpers live (its block sizes)

TINY = bench.PRESETS["tiny"]
CPU = torch.device("cpu")


def gpu_properties(name, major, minor, shared, memory=15 * 2**30):
    return SimpleNamespace(name=name, major=major, minor=minor, total_memory=memory, multi_processor_count=40,
                           shared_memory_per_block_optin=shared, L2_cache_size=4 * 2**20, is_integrated=False)


@pytest.fixture
def t4(emulated_cuda, monkeypatch):
    """The emulated device as a T4: capability 7.5, 64 KiB of shared memory per block, bfloat16 only emulated."""
    props = gpu_properties("Tesla T4", 7, 5, 65536)
    monkeypatch.setattr(emulated_cuda, "CAPABILITY", (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: props.name)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    return props


def test_flex_blocks_follow_the_shared_memory(emulated_cuda, monkeypatch):
    cuda = torch.device("cuda")
    for props, expected in ((gpu_properties("NVIDIA H100", 9, 0, 232448), None),
                            (gpu_properties("NVIDIA A100", 8, 0, 166912), None),
                            (gpu_properties("NVIDIA L4", 8, 9, 101376), FLEX.FLEX_BLOCKS_MEDIUM),
                            (gpu_properties("Tesla T4", 7, 5, 65536), FLEX.FLEX_BLOCKS_SMALL)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None, p=props: p)
        assert core.flex_kernel_options(cuda) == expected, props.name
    assert core.flex_kernel_options(CPU) is None
    for blocks in (FLEX.FLEX_BLOCKS_SMALL, FLEX.FLEX_BLOCKS_MEDIUM):  # the backward kernel's constraints
        assert blocks["BLOCK_N1"] % blocks["BLOCK_M1"] == 0 and blocks["BLOCK_M2"] % blocks["BLOCK_N2"] == 0


def test_a_t4_runs_float16_with_small_flex_blocks(t4, monkeypatch, tmp_path):
    import torch.nn.attention.flex_attention as flex

    assert bench.choose_dtype(torch.device("cuda")) == torch.float16  # no bfloat16 tensor cores there
    seen = []
    emulated = flex.flex_attention

    def recording(*args, **kwargs):
        seen.append(kwargs.get("kernel_options"))
        return emulated(*args, **kwargs)

    monkeypatch.setattr(flex, "flex_attention", recording)
    monkeypatch.setattr(FLEX, "_fitted", {})  # the blocks fitted by earlier tests of this process left out
    core.compiled_flex_attention.cache_clear()
    try:
        q, k, v = (torch.randn(1, 2, 64, 16, device="cuda", dtype=torch.float16) for _ in range(3))
        out = posenc.attention(q, k, v, posenc.ALiBi(2).to("cuda"), backend="flex")
        assert out.dtype == torch.float16 and seen == [FLEX.FLEX_BLOCKS_SMALL]
        preset = bench.tiny("colab")
        rows, meta = bench.run(preset, tmp_path, schemes=("nope", "alibi"))
    finally:
        core.compiled_flex_attention.cache_clear()
    assert meta["device"]["name"] == "Tesla T4" and meta["dtype"] == "float16"
    assert meta["flex_kernel_options"] == FLEX.FLEX_BLOCKS_SMALL and meta["budget"]["model"]["name"] == "t4"
    # the T4's blocks fitted at once: every flex key ran with them, none was retried
    assert set(map(str, meta["flex_blocks_fitted"].values())) == {str(FLEX.FLEX_BLOCKS_SMALL)}
    flex_rows = [r for r in rows if r["path"] == "flex"]
    assert flex_rows and all(r["status"] == "ok" and r["dtype"] == "float16" for r in flex_rows)
    assert all(options == FLEX.FLEX_BLOCKS_SMALL for options in seen[1:])  # every compiled call, checks included


def test_a_flex_failure_on_an_old_gpu_names_the_gpu_and_the_way_out(t4, monkeypatch):
    runner = bench_paths.Runner(bench.tiny("colab"), torch.device("cuda"), torch.float16)

    def fails(task, length=None):
        raise RuntimeError("out of resource: shared memory, Required: 81920, Hardware limit: 65536")

    monkeypatch.setattr(runner, "check", fails)
    row = bench.execute(runner, bench.Task("alibi", "flex", bench.FORWARD, 64, 1))
    assert row["status"] == "skipped" and "out of resource" in row["reason"]
    assert "Tesla T4" in row["reason"] and "7.5" in row["reason"] and "L4 or A100" in row["reason"]


@pytest.mark.parametrize("scheme,path", [("t5", "sdpa"), ("alibi", "explicit"), ("shaw_values", "explicit_gather")])
def test_a_reference_made_block_by_block_equals_the_whole_one(scheme, path):
    whole = bench_paths.Runner(TINY, CPU, torch.float32, memory_limit=2**40)
    too_small = bench_paths.Runner(TINY, CPU, torch.float32, memory_limit=1)
    for pass_ in bench.PASSES:
        task = bench.Task(scheme, path, pass_, 128, 1)
        expected = whole.reference(task, 128)
        assert whole.reference_chunks[f"{scheme}/{pass_}/128/1"] == 128  # it fits: one block
        with pytest.raises(bench.SkipPath, match="even 64 queries at a time"):
            too_small.reference(task, 128)
        chunked = bench_paths.Runner(TINY, CPU, torch.float32, memory_limit=_limit_for_chunk(task, 64))
        got = chunked.reference(task, 128)
        assert chunked.reference_chunks[f"{scheme}/{pass_}/128/1"] == 64
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)  # sums in another order
        assert chunked.check(dataclasses.replace(task)) <= bench_paths.TOLERANCE[torch.float32]


def _limit_for_chunk(task, chunk: int, length: int = 128) -> int:
    """The memory limit under which the reference of `task` at `length` goes `chunk` queries at a time."""
    whole = bench.estimate_bytes(task.scheme, bench_paths.REFERENCE.get(task.scheme, "explicit"), task.pass_,
                                 task.batch, TINY.heads, length, TINY.head_dim, 4)
    return whole * chunk // length


def test_a_run_stopped_after_a_group_keeps_every_finished_group(tmp_path, monkeypatch):
    real, done = bench_run.run_group, []

    def stops_after_two(*args, **kwargs):
        if len(done) == 2:
            raise KeyboardInterrupt("stopped, as a time limit stops a command")
        done.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(bench_run, "run_group", stops_after_two)
    with pytest.raises(KeyboardInterrupt):
        bench.run(TINY, tmp_path, schemes=("alibi",))
    csv_path, json_path = bench.result_paths(tmp_path, "tiny")
    rows = bench.read_rows(csv_path.read_text())
    meta = json.loads(json_path.read_text())
    measured = [t for t in bench.plan(TINY) if t.scheme == "alibi" or (t.scheme, t.path) == bench.BASELINE]
    groups = bench_run._groups(measured)
    assert len(rows) == len(groups[0]) + len(groups[1]) and meta["complete"] is False  # two whole groups, said so
    assert not list(tmp_path.glob("*.part"))  # no file half-written


def test_the_allocator_is_held_steady_where_the_preset_says():
    assert bench.PRESETS["cpu"].steady_allocator and bench.PRESETS["kernel"].steady_allocator and not TINY.steady_allocator
    code = "from posenc.study.measure import steady_allocator; print(steady_allocator())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # its own process: mallopt is for good
    assert done.returncode == 0, done.stderr
    if sys.platform.startswith("linux"):
        assert done.stdout.strip() == "{'M_MMAP_MAX': 0, 'M_TRIM_THRESHOLD': 2147483647}"
