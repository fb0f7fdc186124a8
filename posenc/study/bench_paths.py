"""The measured paths of posenc.study.benchmark: each built through posenc, checked against its reference, then timed.

Every attention path goes through `posenc.attention` (the package is what is measured):
``explicit``, ``sdpa``, ``flex_uncompiled`` and ``flex`` (compiled) are its backends, and
``sdpa_causal`` is the baseline, plain causal attention through `posenc.attention` (SDPA
with is_causal=True), on a GPU on the fastest SDPA backend at each shape and pass. RoPE is
timed as `posenc.Rope.transform_qk` on queries and keys (cached cos/sin), the same compiled,
and Hugging Face's eager `apply_rotary_pos_emb` with cos/sin made once per forward as Llama
makes them.
Compiled calls are timed and measured with nothing intercepting them (no dispatch mode).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from ..core import attention
from ..qk.rope import Rope
from ..scheme import NoPE, Scheme
from ..score import ALiBi, ShawRelative, SlidingWindow, T5Bias
from .measure import (
    cuda_peak_memory,
    kept_memory,
    l2_flusher,
    peak_memory,
    peak_rss,
    summarize,
    time_call,
)

FORWARD, BACKWARD = "forward", "forward+backward"
BACKENDS = {
    "cudnn": "CUDNN_ATTENTION",
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
}  # causal SDPA backends on a GPU
PASSES = (FORWARD, BACKWARD)
COMPILED = ("flex", "posenc_compiled")
OPERATION_SCHEMES = ("copy", "rope")  # measured outside attention
REFERENCE = {
    "shaw_values": "explicit_naive",
    "rope": "posenc",
    "copy": "clone",
}  # the path each is checked against; else explicit
# float32: atol = rtol; half precision: the norm-wise relative error ||got - reference|| / ||reference||
TOLERANCE = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


class SkipPath(Exception):
    """A path that cannot run here; the message is the reason recorded."""


def measured_scheme(name: str, preset, method: str = "gather") -> Scheme:
    """The scheme measured under `name`, with learned tables drawn from a fixed seed (large enough to matter in checks)."""
    torch.manual_seed(0)
    build = {
        "nope": lambda: NoPE(),
        "alibi": lambda: ALiBi(preset.heads),
        "t5": lambda: T5Bias(
            preset.heads,
            preset.t5_buckets,
            preset.t5_max_distance,
            bidirectional=False,
            init_std=0.5,
        ),
        "shaw": lambda: ShawRelative(
            preset.head_dim, preset.shaw_max_distance, values=False, init_std=0.5
        ),
        "shaw_values": lambda: ShawRelative(
            preset.head_dim,
            preset.shaw_max_distance,
            values=True,
            method=method,
            init_std=0.5,
        ),
        "sliding_window": lambda: SlidingWindow(preset.window),
    }
    if name not in build:
        raise ValueError(f"no attention scheme is measured under {name!r}")
    return build[name]()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


class Runner:
    """Runs tasks on one device: builds each path, checks it against its reference, times it, measures its memory."""

    def __init__(
        self,
        preset,
        device: torch.device,
        dtype: torch.dtype,
        log: Callable[[str], None] | None = None,
    ):
        self.preset, self.device, self.dtype, self.log = preset, device, dtype, log
        self.start = time.perf_counter()
        self._inputs, self._schemes, self._references, self._compiled = {}, {}, {}, {}
        self._hf = self._flush = None
        self.first_call_s: dict[str, float] = {}
        self.backends: dict[
            tuple, str
        ] = {}  # (length, batch, pass, dtype) -> the baseline's SDPA backend there
        self.current_backend = "default"

    def inputs(
        self, length: int, batch: int, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, ...]:
        """q, k, v and the output gradient for a shape, the same for every path (seeded by the shape)."""
        dtype = dtype or self.dtype
        key = (length, batch, dtype)
        if key not in self._inputs:
            gen = torch.Generator().manual_seed(1000 + 7 * batch + length)
            shape = (batch, self.preset.heads, length, self.preset.head_dim)
            if len(self._inputs) >= 2:  # the shape measured and the one checked
                self._inputs.pop(next(iter(self._inputs)))
            self._inputs[key] = tuple(
                torch.randn(shape, generator=gen).to(self.device, dtype)
                for _ in range(4)
            )
        return self._inputs[key]

    def scheme(self, name: str, path: str) -> Scheme:
        method = "naive" if path == "explicit_naive" else "gather"
        if (name, method) not in self._schemes:
            self._schemes[(name, method)] = measured_scheme(
                name, self.preset, method
            ).to(self.device)
        return self._schemes[(name, method)]

    def flush(self) -> Callable[[], None] | None:
        """The L2 flush run before each timed call on a GPU (posenc.study.measure.l2_flusher); None on the CPU."""
        if self._flush is None and self.device.type == "cuda":
            self._flush = l2_flusher(self.device, self.preset.l2_flush_bytes)
        return self._flush

    # ----------------------------------------------------------------- the baseline

    def choose_backend(self, task) -> str:
        """The fastest causal SDPA backend at this task's shape and pass, on a GPU (cuDNN, flash, efficient); 'default' elsewhere."""
        if self.device.type != "cuda":
            return "default"
        key = (task.seq_len, task.batch, task.pass_, task.dtype)
        if key not in self.backends:
            timings = {}
            for name in BACKENDS:
                self.backends[key] = name
                fn, _ = self.step(
                    dataclasses.replace(task, scheme="nope", path="sdpa_causal"),
                    task.seq_len,
                )
                try:
                    timings[name] = summarize(time_call(fn, self.device, 1, 3))[0]
                except (
                    RuntimeError
                ):  # this backend cannot run this shape, dtype or device
                    continue
            self.backends[key] = min(timings, key=timings.get) if timings else "default"
        return self.backends[key]

    def baseline_fn(self, backend: str) -> Callable:
        """Plain causal attention through posenc.attention (SDPA with is_causal=True), on `backend` where it names one."""
        scheme = self.scheme("nope", "sdpa")
        if backend not in BACKENDS:
            return lambda q, k, v: attention(q, k, v, scheme, backend="sdpa")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, BACKENDS[backend])

        def fn(q, k, v):
            with sdpa_kernel(chosen):
                return attention(q, k, v, scheme, backend="sdpa")

        return fn

    # ----------------------------------------------------------------- building a path

    def attention_fn(self, scheme_name: str, path: str) -> Callable:
        """fn(q, k, v) -> output of the path (batch, heads, L, head_dim), through posenc.attention."""
        if path == "sdpa_causal":
            return self.baseline_fn(self.current_backend)
        scheme = self.scheme(scheme_name, path)
        backend = "explicit" if path.startswith("explicit") else path
        return lambda q, k, v: attention(q, k, v, scheme, backend=backend)

    def step(
        self, task, length: int
    ) -> tuple[Callable[[], object], Callable[[], list[torch.Tensor]]]:
        """The measured call for a task at `length`, and a function returning what its check compares."""
        q, k, v, grad_out = self.inputs(length, task.batch, task.dtype)
        if task.scheme == "copy":
            qk = torch.stack((q, k))
            return (lambda: qk.clone()), (lambda: [qk.clone()])
        if task.scheme == "rope":
            fn = self.rope_fn(task.path, length, q)
            return (lambda: fn(q, k)), (lambda: list(fn(q, k)))
        if task.path == "sdpa_causal":
            self.current_backend = self.backends.get(
                (length, task.batch, task.pass_, task.dtype), "default"
            )
        fn = self.attention_fn(task.scheme, task.path)
        if task.pass_ == FORWARD:

            def forward():
                with torch.no_grad():
                    return fn(q, k, v)

            return forward, lambda: [forward()]
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        params = (
            []
            if task.path == "sdpa_causal"
            else [
                p
                for p in self.scheme(task.scheme, task.path).parameters()
                if p.requires_grad
            ]
        )

        def forward_backward():
            for t in leaves + params:
                t.grad = None
            out = fn(*leaves)
            out.backward(grad_out)
            return out

        def results():
            out = forward_backward()
            return [out.detach()] + [t.grad for t in leaves + params]

        return forward_backward, results

    def rope_fn(self, path: str, length: int, like: torch.Tensor) -> Callable:
        rope = Rope(self.preset.head_dim, numerics="transformers").to(self.device)
        positions = range(length)
        if path == "posenc":
            return lambda q, k: (
                rope.transform_qk(q, positions),
                rope.transform_qk(k, positions),
            )
        if path == "posenc_compiled":
            key = ("rope", like.dtype)
            if key not in self._compiled:
                self._compiled[key] = torch.compile(
                    lambda q, k, cos, sin: (
                        rope_rotate(q, cos, sin),
                        rope_rotate(k, cos, sin),
                    ),
                    backend=self.preset.compile_backend,
                    dynamic=False,
                )
            compiled, (cos, sin) = self._compiled[key], rope.cos_sin(positions, like)
            return lambda q, k: compiled(q, k, cos, sin)
        if path == "hf_eager":
            apply_rotary_pos_emb = self.hf_apply_rotary_pos_emb()
            cos, sin = rope.cos_sin(
                positions, like
            )  # Llama's cos/sin: float32 angles from the same float32 inv_freq, cast
            cos, sin = torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None]
            return lambda q, k: apply_rotary_pos_emb(q, k, cos, sin)
        raise ValueError(f"unknown RoPE path {path!r}")

    def hf_apply_rotary_pos_emb(self):
        if self._hf is None:
            try:
                from transformers.models.llama.modeling_llama import (
                    apply_rotary_pos_emb,
                )
            except ImportError as exc:
                raise SkipPath(
                    f"transformers is not installed here ({exc.__class__.__name__}: {exc})"
                ) from None
            self._hf = apply_rotary_pos_emb
        return self._hf

    # ----------------------------------------------------------------- checks

    def reference(self, task, length: int) -> list[torch.Tensor]:
        ref_path = REFERENCE.get(task.scheme, "explicit")
        key = (task.scheme, ref_path, task.pass_, length, task.batch, task.dtype)
        if key not in self._references:
            self._references = {
                k: v
                for k, v in self._references.items()
                if k[3:] == (length, task.batch, task.dtype)
            }
            _, results = self.step(dataclasses.replace(task, path=ref_path), length)
            self._references[key] = [t.detach().clone() for t in results()]
        return self._references[key]

    def check(self, task, check_len: int) -> float:
        """Compare the path with its reference (outputs, and gradients backward) at check_len; the max abs error."""
        reference = self.reference(task, check_len)
        _, results = self.step(task, check_len)
        t0 = time.perf_counter()
        got = results()
        self.first_call_s[
            f"{task.scheme}/{task.path}/{task.pass_}/{task.dtype_name}/{check_len}"
        ] = round(time.perf_counter() - t0, 3)
        if len(got) != len(reference):
            raise SkipPath(
                f"check failed: {len(got)} results against {len(reference)} from the reference"
            )
        dtype = task.dtype or self.dtype
        tol, error = TOLERANCE[dtype], 0.0
        for g, r in zip(got, reference):
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
                agrees = float(torch.linalg.vector_norm(g - r)) <= tol * float(
                    torch.linalg.vector_norm(r)
                )
            if not agrees:
                raise SkipPath(
                    f"check failed: differs from the reference by up to {error:.3g} (tolerance {tol:g})"
                )
        return error

    def kept(self, task) -> int | None:
        """Bytes a path keeps per shape after its first call (a dense mask or bias for SDPA), measured with fresh caches.

        None for FlexAttention (compiled: a fresh scheme would compile again; its block mask is small; uncompiled:
        a dispatch mode cannot count it) and for the operations outside attention."""
        if (
            task.scheme in OPERATION_SCHEMES
            or task.path in COMPILED
            or task.path.startswith("flex")
        ):
            return None
        from .. import kernel

        q, k, v, _ = self.inputs(task.seq_len, task.batch, task.dtype)
        fresh = (
            self.baseline_fn(self.current_backend)
            if task.path == "sdpa_causal"
            else None
        )
        if fresh is None:
            scheme = measured_scheme(
                task.scheme,
                self.preset,
                "naive" if task.path == "explicit_naive" else "gather",
            ).to(self.device)
            backend = "explicit" if task.path.startswith("explicit") else task.path
            fresh = lambda q, k, v: attention(q, k, v, scheme, backend=backend)  # noqa: E731
        saved = dict(kernel._MASKS)
        kernel._MASKS.clear()  # the masks kept across schemes: as before this path's first call at this shape
        try:
            with torch.no_grad():
                return kept_memory(fresh, q, k, v, device=self.device)
        finally:
            kernel._MASKS.clear()
            kernel._MASKS.update(saved)

    def memory(self, task, fn: Callable[[], object]) -> tuple[int | None, str]:
        """Peak bytes of one call and how they were counted: CUDA's allocator, the process's resident peak, or tensors created."""
        if self.device.type == "cuda":
            return cuda_peak_memory(fn, device=self.device), "cuda_allocator"
        if task.path in COMPILED or task.path.startswith("flex"):
            try:  # compiled code and FlexAttention's operator are invisible to (and disturbed by) a dispatch mode
                return peak_rss(fn), "process_rss"
            except OSError:
                return None, "none"
        return peak_memory(fn), "tensors"


def rope_rotate(x, cos, sin):
    """The rotation Rope.transform_qk runs, as one function for torch.compile (half layout)."""
    from ..qk.rope import rotate_pairs

    return rotate_pairs(x, cos, sin, "half")
