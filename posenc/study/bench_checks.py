"""Checks and memory of the benchmark's paths: what posenc.study.bench_paths.Runner
delegates.

Every path is compared with its reference at the very shape it is timed at (outputs, and
the gradients of q, k, v and of the scheme's tables for the forward+backward pass).
Where the explicit reference would not fit in the run's memory limit, it is computed a
block of queries at a time: queries [s, e) against keys [0, e) are posenc's default
layout, so a block gives exactly what the whole call gives for those queries (a causal
query sees no later key), and the gradients add up over the blocks. Memory is counted as
posenc.study.measure says, each figure with its counter.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from ..core import attention
from .bench_paths import (
    BACKENDS,
    COMPILED,
    FORWARD,
    MIN_CHUNK,
    OPERATION_SCHEMES,
    REFERENCE,
    TOLERANCE,
    SkipPath,
    _backend_of,
    measured_scheme,
)
from .measure import cuda_peak_memory, kept_memory, peak_memory, peak_rss


def reference_chunk(runner, task, length: int, ref_path: str) -> int:
    """Queries per block of the explicit reference: all where it fits the limit."""
    from .bench_plan import elt, estimate_bytes

    whole = estimate_bytes(
        task.scheme,
        ref_path,
        task.pass_,
        task.batch,
        runner.preset.heads,
        length,
        runner.preset.head_dim,
        elt(task.dtype or runner.dtype),
    )
    chunk, limit = length, runner.memory_limit
    while limit is not None and whole * chunk / length > limit and chunk > MIN_CHUNK:
        chunk = max(MIN_CHUNK, chunk // 2)
    if limit is not None and whole * chunk / length > limit:
        raise SkipPath(
            f"the explicit reference needs about {whole * chunk / length / 2**30:.1f} "
            f"GiB even {chunk} queries at a time, over the limit of "
            f"{limit / 2**30:.1f} GiB: the path cannot be checked here"
        )
    return chunk


def reference(runner, task, length: int) -> list[torch.Tensor]:
    """The results a path is compared with, made once per scheme, pass and shape."""
    ref_path = REFERENCE.get(task.scheme, "explicit")
    key = (task.scheme, ref_path, task.pass_, length, task.batch, task.dtype)
    if key not in runner._references:
        runner._references = {
            k: v
            for k, v in runner._references.items()
            if k[3:] == (length, task.batch, task.dtype)
        }
        if task.scheme in OPERATION_SCHEMES:
            ref_task = dataclasses.replace(task, path=ref_path)
            found = runner.step(ref_task, length)[1]()
        else:
            found = attention_reference(runner, task, length, ref_path)
        runner._references[key] = [t.detach().clone() for t in found]
    return runner._references[key]


def attention_reference(runner, task, length: int, ref_path: str) -> list[torch.Tensor]:
    """The explicit path's results, computed `reference_chunk` queries at a time."""
    chunk = reference_chunk(runner, task, length, ref_path)
    runner.reference_chunks[f"{task.scheme}/{task.pass_}/{length}/{task.batch}"] = chunk
    scheme = runner.scheme(task.scheme, ref_path)
    q, k, v, grad_out = runner.inputs(length, task.batch, task.dtype)
    blocks = [(s, min(s + chunk, length)) for s in range(0, length, chunk)]

    def run(q, k, v, s, e):
        return attention(
            q[:, :, s:e], k[:, :, :e], v[:, :, :e], scheme, backend="explicit"
        )

    if task.pass_ == FORWARD:
        with torch.no_grad():
            return [torch.cat([run(q, k, v, s, e) for s, e in blocks], dim=2)]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    params = [p for p in scheme.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    outs = []
    for s, e in blocks:
        out = run(*leaves, s, e)
        out.backward(grad_out[:, :, s:e])
        outs.append(out.detach())
    found = [torch.cat(outs, dim=2)] + [t.grad for t in leaves + params]
    for p in params:
        p.grad = None
    return found


def check(runner, task, check_len: int | None = None) -> float:
    """Compare the path with its reference (outputs, and gradients backward) at
    check_len (default: the task's length); returns the max abs error, raises SkipPath
    if they differ.

    float32: elementwise with atol = rtol = TOLERANCE; half precision: the norm of the
    difference relative to the reference's (a bias's gradient sums many rounded terms).
    """
    check_len = task.seq_len if check_len is None else check_len
    expected = reference(runner, task, check_len)
    _, results, _ = runner.step(task, check_len)
    t0 = time.perf_counter()
    got = results()
    key = f"{task.scheme}/{task.path}/{task.pass_}/{task.dtype_name}/{check_len}"
    runner.first_call_s[key] = round(time.perf_counter() - t0, 3)
    if len(got) != len(expected):
        raise SkipPath(
            f"check failed: {len(got)} results against {len(expected)} from the "
            "reference"
        )
    dtype = task.dtype or runner.dtype
    tol, error = TOLERANCE[dtype], 0.0
    for g, r in zip(got, expected):
        if g is None:
            raise SkipPath(
                "check failed: the path gives no gradient where the reference does"
            )
        g, r = g.float(), r.float()
        error = max(error, float((g - r).abs().max()))
        if task.scheme == "copy":
            agrees = torch.equal(g, r)
        elif dtype == torch.float32:
            agrees = bool(torch.isclose(g, r, atol=tol, rtol=tol).all())
        else:
            difference = float(torch.linalg.vector_norm(g - r))
            agrees = difference <= tol * float(torch.linalg.vector_norm(r))
        if not agrees:
            raise SkipPath(
                f"check failed: differs from the reference by up to {error:.3g} "
                f"(tolerance {tol:g})"
            )
    return error


def kept(runner, task) -> int | None:
    """Bytes a path keeps per shape after its first call (a dense mask or bias for
    SDPA), measured with fresh caches.

    None for FlexAttention (compiled: a fresh scheme would compile again; its block mask
    is small; uncompiled: a dispatch mode cannot count it) and for the operations
    outside attention.
    """
    if (
        task.scheme in OPERATION_SCHEMES
        or task.path in COMPILED
        or task.path.startswith("flex")
    ):
        return None
    from .. import kernel

    q, k, v, _ = runner.inputs(task.seq_len, task.batch, task.dtype)
    if task.path == "sdpa_causal" or task.path in BACKENDS:
        fresh = runner.baseline_fn(task.path)
    else:
        method = "naive" if task.path == "explicit_naive" else "gather"
        scheme = measured_scheme(task.scheme, runner.preset, method).to(runner.device)
        backend = _backend_of(task.path)

        def fresh(q, k, v):
            return attention(q, k, v, scheme, backend=backend)

    saved = dict(kernel._MASKS)
    # the masks kept across schemes: as before this path's first call at this shape
    kernel._MASKS.clear()
    try:
        with torch.no_grad():
            return kept_memory(fresh, q, k, v, device=runner.device)
    finally:
        kernel._MASKS.clear()
        kernel._MASKS.update(saved)


def memory(
    runner, task, fn: Callable[[], object], reset: Callable[[], None] | None = None
) -> tuple[int | None, str]:
    """Peak bytes of one call and how they were counted: CUDA's allocator, the process's
    resident peak, or the tensors created.

    `reset` first drops what the last call left (its gradients), which the call would
    free inside the measurement and so hide part of its own peak.
    """
    if reset is not None:
        reset()
    if runner.device.type == "cuda":
        return cuda_peak_memory(fn, device=runner.device), "cuda_allocator"
    if task.path in COMPILED or task.path.startswith("flex"):
        # compiled code and FlexAttention's operator are invisible to (and disturbed by)
        # a dispatch mode
        try:
            return peak_rss(fn), "process_rss"
        except OSError:
            return None, "none"
    return peak_memory(fn), "tensors"
