"""The time a benchmark plan takes: its compiles and calls counted, priced under a
stated CostModel.

`budget` counts the compiles and calls of a preset's plan (posenc.study.presets.plan)
and turns them into seconds under a `CostModel` (per-compile seconds, achieved FLOP/s
and bandwidth, per-call overhead): assumptions, never measurements, chosen per device by
`cost_model_for`; a run without a stated time budget gets BUDGET_MARGIN times the
estimate.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import torch

from .bench_paths import BACKWARD
from .bench_plan import elt, estimate_bytes, nominal_flops, plan
from .presets import OPERATION_PATHS, Preset, get_preset


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Assumptions behind a time estimate; each is stated, none measured here.

    Correct them from a run's first_call_s and compile_s_run.
    """

    name: str
    compile_forward_s: (
        float  # one torch.compile of FlexAttention (or RoPE), forward, one shape
    )
    compile_backward_s: (
        float  # the same with its backward (forward and backward graphs)
    )
    tflops: float  # FLOP/s (in 1e12) the attention kernels achieve
    bandwidth_gbs: (
        float  # bytes/s (in 1e9) an elementwise or materialising path achieves
    )
    call_overhead_ms: float  # launch and Python overhead of one call
    fixed_s: float  # imports, device start, block fractions, the matmul reference


BUDGET_MARGIN = 1.5  # a preset without a time budget gets this many times its estimate
COST_MODELS = {
    "t4": CostModel(
        "t4",
        compile_forward_s=12.0,
        compile_backward_s=30.0,
        tflops=20.0,
        bandwidth_gbs=220.0,
        call_overhead_ms=0.1,
        fixed_s=20.0,
    ),
    "l4": CostModel(
        "l4",
        compile_forward_s=10.0,
        compile_backward_s=25.0,
        tflops=60.0,
        bandwidth_gbs=250.0,
        call_overhead_ms=0.05,
        fixed_s=20.0,
    ),
    "a100": CostModel(
        "a100",
        compile_forward_s=8.0,
        compile_backward_s=20.0,
        tflops=150.0,
        bandwidth_gbs=1300.0,
        call_overhead_ms=0.05,
        fixed_s=15.0,
    ),
    "h100": CostModel(
        "h100",
        compile_forward_s=6.0,
        compile_backward_s=15.0,
        tflops=300.0,
        bandwidth_gbs=2500.0,
        call_overhead_ms=0.05,
        fixed_s=15.0,
    ),
    "cpu": CostModel(
        "cpu",
        compile_forward_s=15.0,
        compile_backward_s=40.0,
        tflops=0.05,
        bandwidth_gbs=10.0,
        call_overhead_ms=0.05,
        fixed_s=5.0,
    ),
}
COMPILES = (
    "flex",
    "posenc_compiled",
)  # what compiles once per shape and pass (flex_direct reuses flex's)


def cost_model_for(capability: tuple[int, int] | None) -> str:
    """The CostModel for a device: None (a CPU) "cpu"; a GPU by its compute capability.

    9.0 and up: "h100" (Hopper and later); 8.0: "a100"; 8.6 to 8.9 (A10, L4, RTX 30/40):
    "l4"; below 8.0 (a T4, 7.5): "t4".
    """
    if capability is None:
        return "cpu"
    major, minor = capability
    if major >= 9:
        return "h100"
    if major == 8:
        return "a100" if minor == 0 else "l4"
    return "t4"


def budget(
    preset: str | Preset,
    device_memory: int | None = None,
    dtype: torch.dtype = torch.float32,
    model: str | CostModel | None = None,
) -> dict:
    """Compiles and calls of a preset's plan, and the seconds they take under `model`.

    `model` defaults to "t4" for a GPU preset (the smallest GPU it is sized for) and
    "cpu"; a run passes its device's (cost_model_for). Per measurement that runs: its
    check (one call of the path, one of its reference per scheme, pass and shape),
    `warmup` calls, one call to size the samples where they are sized, `repeats` timed
    rounds of `min_calls` calls or more, one call for peak memory and one with fresh
    caches for the kept bytes. A compiled path compiles once per shape and pass
    (dynamic=False), at its check. A call takes overhead + max(FLOPs / FLOP/s, bytes /
    bandwidth), its bytes the memory estimate of `estimate_bytes`; on a GPU each timed
    call is preceded by an L2 flush (its bytes).
    """
    preset = get_preset(preset)
    if model is None:
        model = "t4" if preset.device == "cuda" else "cpu"
    model = COST_MODELS[model] if not isinstance(model, CostModel) else model
    tasks = [t for t in plan(preset, device_memory, dtype) if t.skip is None]
    compiles = Counter(t.pass_ for t in tasks if t.path in COMPILES)
    calls = compile_s = run_s = 0.0
    flush = (preset.l2_flush_bytes or 2 * 50 * 2**20) if preset.device == "cuda" else 0
    references = set()
    for t in tasks:
        dt = t.dtype or dtype
        operation = t.scheme in OPERATION_PATHS
        flops = (
            0
            if operation
            else nominal_flops(
                t.pass_, t.batch, preset.heads, t.seq_len, preset.head_dim
            )
        )
        traffic = estimate_bytes(
            t.scheme,
            t.path,
            t.pass_,
            t.batch,
            preset.heads,
            t.seq_len,
            preset.head_dim,
            elt(dt),
        )
        one = model.call_overhead_ms / 1e3 + max(
            flops / (model.tflops * 1e12), traffic / (model.bandwidth_gbs * 1e9)
        )
        rounds = (preset.op_repeats or preset.repeats) if operation else preset.repeats
        sample_ms = preset.op_sample_ms if operation else preset.min_sample_ms
        per_sample = max(preset.min_calls, math.ceil(sample_ms / 1e3 / one))
        n = 1 + preset.warmup + (1 if sample_ms else 0) + rounds * per_sample + 2
        references.add((t.scheme, t.pass_, t.seq_len, t.batch, t.dtype))
        calls += n
        run_s += n * one + rounds * per_sample * flush / (model.bandwidth_gbs * 1e9)
        if t.path in COMPILES:
            compile_s += (
                model.compile_backward_s
                if t.pass_ == BACKWARD
                else model.compile_forward_s
            )
    calls += len(references)
    estimate = round(
        model.fixed_s
        + compile_s
        + run_s
        + 2 * len(references) * model.call_overhead_ms / 1e3,
        1,
    )
    return {
        "preset": preset.name,
        "model": dataclasses.asdict(model),
        "measurements": len(tasks),
        "compiles": sum(compiles.values()),
        "compiles_by_pass": dict(compiles),
        "calls": int(calls),
        "compile_s": round(compile_s, 1),
        "run_s": round(run_s, 1),
        "estimate_s": estimate,
        "time_budget_s": time_budget(preset, estimate),
    }


def time_budget(preset: Preset, estimate_s: float) -> float:
    """The preset's own budget where it states one, else BUDGET_MARGIN times the
    estimate."""
    return (
        float(preset.time_budget_s)
        if preset.time_budget_s is not None
        else round(BUDGET_MARGIN * estimate_s, 0)
    )
