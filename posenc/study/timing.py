"""Timing calls interleaved, and an allocator held steady for memory-bound calls.

`time_rounds` takes one sample of each call per round, the order rotating, a sample
being calls back to back (CUDA events around each on a GPU, after an L2 flush;
perf_counter elsewhere, with the page faults and the processor's share);
`steady_allocator` keeps glibc's allocator from handing memory back, so that an
allocating call's time does not depend on the process's history. posenc.study.measure
re-exports both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


@dataclasses.dataclass
class Samples:
    """What `time_rounds` measured for one call: one sample per round, each the mean of
    `calls` calls.

    `ms`: milliseconds per call (CUDA events on a GPU, perf_counter elsewhere);
    `host_ms`: the host's wall time per call while it issued them (on a GPU the time
    Python and the launches took, which the queue hides when the kernels take longer;
    elsewhere the same as `ms`); `faults`: minor page faults per call (None where the OS
    does not count them); `cpu_share`: the process's CPU time over the wall time of each
    sample (below 1: the process waited for the processor, on the CPU only).
    """

    ms: list[float]
    host_ms: list[float]
    faults: list[float | None]
    cpu_share: list[float | None]
    calls: int

    def __len__(self) -> int:
        return len(self.ms)


def minor_faults() -> int | None:
    """Minor page faults of this process so far (getrusage), or None where the OS does
    not say."""
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, OSError, AttributeError):
        return None


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX = -1, -3, -4


def steady_allocator() -> dict | None:
    """Hold glibc's allocator in a steady state: never give freed memory back, never
    mmap.

    By default glibc serves a large allocation with mmap, and hands freed memory back
    above a trim threshold that moves with the sizes freed before: whether a call reuses
    heap pages or faults in fresh zeroed ones then depends on the process's history, and
    a memory-bound call's time with it (2-3x for RoPE at these sizes). With mmap off and
    no trimming, a call that allocates what an earlier call freed reuses its pages, so
    after a warm-up it faults no more. Returns the settings made (for the run's
    metadata), or None where this is not glibc.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    settings = {
        "M_MMAP_MAX": (_M_MMAP_MAX, 0),
        "M_TRIM_THRESHOLD": (_M_TRIM_THRESHOLD, 2**31 - 1),
    }
    done = {
        name: value
        for name, (param, value) in settings.items()
        if mallopt(param, value) == 1
    }
    return done or None


def time_rounds(
    fns: dict,
    device,
    warmup: int,
    rounds: int,
    flush: Callable[[], None] | None = None,
    *,
    min_sample_ms: float = 0.0,
    min_calls: int = 1,
    max_calls: int = 1000,
) -> tuple[dict[str, Samples], dict[str, BaseException]]:
    """Time each named call interleaved: every round takes one sample of each, the order
    rotating by one per round.

    Each call is first called `warmup` times. A sample is `calls` calls back to back, at
    least `min_calls`, and enough that a sample lasts about `min_sample_ms` (from one
    call timed after the warm-up). On a GPU every call is timed between two CUDA events
    recorded around it, after `flush` (see l2_flusher) and with no synchronisation
    before it: the host issues the calls of a sample and waits once at its end, so while
    the kernels take longer than the host needs to launch them the GPU never waits for
    Python, and each interval holds the kernels alone. Where a sample has more than one
    call its first is left out (it starts on an idle GPU). Elsewhere perf_counter around
    the whole sample. A call that raises is dropped from the later rounds: returns
    (samples by name, the exception by name for those).
    """
    import math
    import time

    from .measure import time_call

    if not isinstance(fns, dict) or not all(callable(f) for f in fns.values()):
        raise TypeError("fns must be a dict of name -> callable")
    if (
        not isinstance(rounds, int)
        or rounds < 1
        or not isinstance(warmup, int)
        or warmup < 0
    ):
        raise ValueError(
            f"rounds must be an int >= 1 and warmup an int >= 0; got {rounds!r} and "
            f"{warmup!r}"
        )
    if not isinstance(min_calls, int) or not 1 <= min_calls <= max_calls:
        raise ValueError(
            f"min_calls must be an int in [1, max_calls]; got {min_calls!r}"
        )
    device = torch.device(device)
    cuda = device.type == "cuda"
    calls, failed = {}, {}
    for name, fn in fns.items():
        try:
            for _ in range(warmup):
                fn()
            n = min_calls
            if min_sample_ms > 0:
                one = time_call(fn, device, 0, 1)[0]
                n = max(n, min(max_calls, math.ceil(min_sample_ms / max(one, 1e-6))))
            calls[name] = n
        # recorded by the caller as the path's reason
        except Exception as exc:  # noqa: BLE001
            failed[name] = exc
    samples = {name: Samples([], [], [], [], calls[name]) for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)] if names else []:
            if name in failed:
                continue
            fn, n, s = fns[name], calls[name], samples[name]
            try:
                f0, c0, t0 = minor_faults(), time.process_time(), time.perf_counter()
                if cuda:
                    events = [
                        (
                            torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True),
                        )
                        for _ in range(n)
                    ]
                    for start, end in events:
                        if flush is not None:
                            flush()
                        start.record()
                        fn()
                        end.record()
                    t1 = time.perf_counter()
                    events[-1][1].synchronize()
                    kept = events[1:] if n > 1 else events
                    s.ms.append(sum(a.elapsed_time(b) for a, b in kept) / len(kept))
                    s.cpu_share.append(None)
                else:
                    for _ in range(n):
                        fn()
                    t1 = time.perf_counter()
                    s.ms.append((t1 - t0) * 1e3 / n)
                    s.cpu_share.append((time.process_time() - c0) / max(t1 - t0, 1e-9))
                f1 = minor_faults()
                s.host_ms.append((t1 - t0) * 1e3 / n)
                s.faults.append(None if f0 is None or f1 is None else (f1 - f0) / n)
            except Exception as exc:  # noqa: BLE001
                failed[name] = exc
    return {n: t for n, t in samples.items() if n not in failed}, failed
