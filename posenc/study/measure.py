"""Peak memory of a callable: the bytes of the tensors it creates (any device), and
CUDA's allocator peak.

`peak_memory` counts, operator by operator, the storages of the tensors that the call
creates and frees each one when its storage dies. The count is the same on every device
and on every run, so a chapter can print it; it does not see scratch memory that a
single kernel allocates and frees inside itself. `cuda_peak_memory` asks CUDA's caching
allocator instead: it sees everything on the GPU, rounded up to the allocator's blocks.
`peak_rss` sees a process's resident growth, a lower bound. `COUNTERS` says which
counter bounds what: a goal that bounds memory from above is judged only with an exact
counter. `time_rounds` times several calls interleaved, round by round, with an L2 flush
before each timed call on a GPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


# counter -> what its figure is: only "exact" may certify a goal that bounds memory
# from above
COUNTERS = {
    # CUDA's caching allocator: every allocation on the device, rounded to its blocks
    "cuda_allocator": "exact",
    # bytes of the tensors created, operator by operator (not the scratch inside one
    # kernel)
    "tensors": "exact",
    # growth of the resident peak: memory the allocator already held and reuses is not
    # seen
    "process_rss": "lower bound",
}


class _StorageCounter(TorchDispatchMode):
    """Bytes held by the storages created under this mode: now (`live`) and at most
    (`peak`)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[
            int, int
        ] = {}  # id of a weak reference to a storage -> bytes counted for it
        self._refs: dict[
            int, weakref.ref
        ] = {}  # id(storage) -> its weak reference, while it lives

    def _freed(self, ref: weakref.ref) -> None:
        self.live -= self._sizes.pop(id(ref), 0)

    def _track(self, storage: torch.UntypedStorage, existing: dict[int, int]) -> None:
        ref = self._refs.get(id(storage))
        if (
            ref is None or ref() is not storage
        ):  # a storage not seen yet (an id can be reused after a free)
            ref = weakref.ref(storage, self._freed)
            self._refs[id(storage)] = ref
            # a storage made before the call (an input, seen again through a view)
            # counts only what it grows
            self._sizes[id(ref)] = existing.get(id(storage), 0)
        grown = (
            storage.nbytes() - self._sizes[id(ref)]
        )  # new storages, and storages resized in place
        if grown > 0:
            self._sizes[id(ref)] += grown
            self.live += grown
            self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # storages of the inputs, with their sizes before the operator runs
        existing = {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                st = t.untyped_storage()
                existing[id(st)] = st.nbytes()
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self._track(t.untyped_storage(), existing)
        return out


def peak_memory(fn: Callable, *args, **kwargs) -> int:
    """Largest number of bytes held at once by the tensors that fn(*args, **kwargs)
    creates.

    Tensors that exist before the call (its inputs) are not counted; its output is.
    Works on any device and gives the same count on each, run after run.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    counter = _StorageCounter()
    with counter:
        out = fn(*args, **kwargs)
    del out
    return counter.peak


def cuda_peak_memory(fn: Callable, *args, device=None, **kwargs) -> int:
    """Peak bytes CUDA's caching allocator held during fn(*args, **kwargs), above what
    it held before.

    Needs a GPU (raises RuntimeError otherwise). Call fn once before measuring if it
    triggers one-time allocations (a cuBLAS workspace, say).
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not torch.cuda.is_available():
        raise RuntimeError(
            "cuda_peak_memory needs a CUDA device; on the CPU use posenc.peak_memory"
        )
    device = torch.device("cuda") if device is None else torch.device(device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    out = fn(*args, **kwargs)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del out
    return peak


def kept_memory(fn: Callable, *args, device=None, **kwargs) -> int:
    """Bytes that fn(*args, **kwargs) allocates and keeps after returning (caches: a
    mask kept per shape), its output dropped.

    On a GPU CUDA's allocator (allocated after minus before); elsewhere the tensors
    created and still alive.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        out = fn(*args, **kwargs)
        del out
        torch.cuda.synchronize(device)
        return max(torch.cuda.memory_allocated(device) - before, 0)
    counter = _StorageCounter()
    with counter:
        out = fn(*args, **kwargs)
    del out
    return max(counter.live, 0)


def l2_flusher(device, nbytes: int | None = None) -> Callable[[], None] | None:
    """On a GPU, a function that writes `nbytes` (default: twice the L2 cache, 256 MiB
    where torch does not say) so no operand of the next call is still in L2; None on the
    CPU (its caches cannot be flushed from here)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if nbytes is None:
        l2 = (
            getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
            or 128 * 2**20
        )
        nbytes = 2 * l2
    if not isinstance(nbytes, int) or nbytes <= 0:
        raise ValueError(f"nbytes must be a positive int; got {nbytes!r}")
    buffer = torch.empty(max(nbytes // 4, 1), dtype=torch.int32, device=device)

    def flush() -> None:
        buffer.fill_(0)

    return flush


def summarize(times_ms: list[float]) -> tuple[float, float, float]:
    """Median and first and third quartiles (inclusive method) of repeated timings."""
    import statistics

    if len(times_ms) == 1:
        return times_ms[0], times_ms[0], times_ms[0]
    q25, median, q75 = statistics.quantiles(times_ms, n=4, method="inclusive")
    return median, q25, q75


def time_call(
    fn: Callable[[], object], device: torch.device, warmup: int, repeats: int
) -> list[float]:
    """Milliseconds of `repeats` calls after `warmup` calls: CUDA events on a GPU,
    perf_counter elsewhere."""
    import time

    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {field}")


def peak_rss(fn: Callable, *args, **kwargs) -> int:
    """Growth of the process's peak resident memory during fn(*args, **kwargs), in bytes
    (Linux).

    Unlike peak_memory it sees everything, compiled kernels and their scratch included,
    and it does not intercept operators (a TorchDispatchMode makes compiled code fall
    back to eager). Free heap memory is returned to the system (malloc_trim) and the
    peak reset through /proc/self/clear_refs first; what the allocator still keeps
    resident and the call reuses is not counted, so it is a lower bound. Raises OSError
    elsewhere.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    # hand freed heap pages back first, so memory the call reuses shows as growth (glibc
    # only)
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current resident size
    before = _status_bytes("VmRSS")
    out = fn(*args, **kwargs)
    peak = _status_bytes("VmHWM") - before
    del out
    return max(peak, 0)


# timing, re-exported here (it imports time_call from this module)
from .timing import (  # noqa: E402,F401
    Samples,
    minor_faults,
    steady_allocator,
    time_rounds,
)
