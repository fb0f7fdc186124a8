"""The measured paths of posenc.study.benchmark: each built through posenc, checked
against its reference, then timed.

Every attention path goes through `posenc.attention` (the package is what is measured):
``explicit``, ``sdpa``, ``flex_uncompiled`` and ``flex`` (compiled) are its backends,
and ``sdpa_causal`` is the baseline, plain causal attention through `posenc.attention`
(SDPA with is_causal=True); on a GPU ``sdpa_cudnn``, ``sdpa_flash`` and
``sdpa_efficient`` are the same call forced onto one fused backend each, and the fastest
of them is the baseline of its shape and pass. ``flex_direct`` calls the very kernel of
``flex`` (posenc's compiled FlexAttention, with the score_mod and block mask posenc
builds) without `posenc.attention`: the difference is posenc's host overhead. RoPE is
timed as `posenc.Rope.transform_qk` on queries and keys (cached cos/sin), the same
compiled, and Hugging Face's eager `apply_rotary_pos_emb` with cos/sin made once per
forward as Llama makes them, beside a copy of the same bytes into a buffer made once
(``preallocated``) and a ``clone``. Each path is checked at the shape it is timed at;
where the explicit reference would not fit in memory there, it is computed a block of
queries at a time (the same numbers). Compiled calls are timed and measured with nothing
intercepting them (no dispatch mode).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from ..core import attention
from ..qk.rope import Rope
from ..scheme import NoPE, Scheme
from ..score import ALiBi, ShawRelative, SlidingWindow, T5Bias
from ..score.t5 import t5_relative_bucket
from .measure import (
    l2_flusher,
)

FORWARD, BACKWARD = "forward", "forward+backward"
# SDPA's fused backends on a GPU, by path (torch.nn.attention.SDPBackend's names)
BACKENDS = {
    "sdpa_cudnn": "CUDNN_ATTENTION",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
}
PASSES = (FORWARD, BACKWARD)
COMPILED = ("flex", "flex_direct", "posenc_compiled")  # paths that run compiled code
OPERATION_SCHEMES = ("copy", "rope")  # measured outside attention
REFERENCE = {
    "shaw_values": "explicit_naive",
    "rope": "posenc",
    "copy": "clone",
}  # the path each is checked against; else explicit
# float32: atol = rtol; half precision: the norm-wise relative error ||got - reference||
# / ||reference||
TOLERANCE = {torch.float32: 2e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
MIN_CHUNK = 64  # queries per block of a reference computed block by block, at least


class SkipPath(Exception):
    """A path that cannot run here; the message is the reason recorded."""


class ComputedT5(T5Bias):
    """T5's bias with the bucket computed from the distance for every score (its former
    score_mod).

    The benchmark times it beside `T5Bias` to show what reading the bucket from a table
    saves.
    """

    def score_mod(self, score, b, h, q_pos, k_pos):
        bucket = t5_relative_bucket(
            k_pos - q_pos, self.bidirectional, self.num_buckets, self.max_distance
        )
        return score + self.table[bucket, h]


def measured_scheme(name: str, preset, method: str = "gather") -> Scheme:
    """The scheme measured under `name`, with learned tables drawn from a fixed seed
    (large enough to matter in checks)."""
    torch.manual_seed(0)
    t5 = dict(
        num_heads=preset.heads,
        num_buckets=preset.t5_buckets,
        max_distance=preset.t5_max_distance,
        bidirectional=False,
        init_std=0.5,
    )
    build = {
        "nope": lambda: NoPE(),
        "alibi": lambda: ALiBi(preset.heads),
        "t5": lambda: T5Bias(**t5),
        "t5_computed": lambda: ComputedT5(**t5),
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


def _backend_of(path: str) -> str:
    """The posenc.attention backend a path runs on."""
    if path.startswith("explicit"):
        return "explicit"
    if path in BACKENDS or path == "sdpa_causal":
        return "sdpa"
    return path


class Runner:
    """Runs tasks on one device: builds each path, checks it against its reference,
    times it, measures its memory.

    `memory_limit` (bytes) bounds the explicit reference of a check: above it the
    reference is computed a block of queries at a time.
    """

    def __init__(
        self,
        preset,
        device: torch.device,
        dtype: torch.dtype,
        log: Callable[[str], None] | None = None,
        memory_limit: int | None = None,
    ):
        self.preset, self.device, self.dtype, self.log = preset, device, dtype, log
        self.memory_limit = (
            memory_limit if memory_limit is not None else preset.max_bytes
        )
        self.start = time.perf_counter()
        self._inputs, self._schemes, self._references, self._compiled = {}, {}, {}, {}
        self._hf = self._flush = None
        self.first_call_s: dict[str, float] = {}
        # set by bench_run.run: the run's number, every sample, the block fractions
        self.run_index, self.samples, self.fractions = 1, {}, None
        self.reference_chunks: dict[str, int] = {}  # a check's key -> queries per block

    def inputs(
        self, length: int, batch: int, dtype: torch.dtype | None = None
    ) -> tuple[torch.Tensor, ...]:
        """q, k, v and the output gradient for a shape, the same for every path (seeded
        by the shape)."""
        dtype = dtype or self.dtype
        key = (length, batch, dtype)
        if key not in self._inputs:
            gen = torch.Generator().manual_seed(1000 + 7 * batch + length)
            shape = (batch, self.preset.heads, length, self.preset.head_dim)
            if len(self._inputs) >= 2:  # the shape measured and one more
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
        """The L2 flush run before each timed call on a GPU
        (posenc.study.measure.l2_flusher); None on the CPU."""
        if self._flush is None and self.device.type == "cuda":
            self._flush = l2_flusher(self.device, self.preset.l2_flush_bytes)
        return self._flush

    # ----------------------------------------------------------------- the baselines

    def baseline_fn(self, path: str = "sdpa_causal") -> Callable:
        """Plain causal attention through posenc.attention (SDPA with is_causal=True),
        on one fused backend where `path` names one."""
        scheme = self.scheme("nope", "sdpa")
        if path not in BACKENDS:
            return lambda q, k, v: attention(q, k, v, scheme, backend="sdpa")
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = getattr(SDPBackend, BACKENDS[path])

        def fn(q, k, v):
            with sdpa_kernel(chosen):
                return attention(q, k, v, scheme, backend="sdpa")

        return fn

    # ----------------------------------------------------------------- building a path

    def attention_fn(self, scheme_name: str, path: str) -> Callable:
        """fn(q, k, v) -> output of the path (batch, heads, L, head_dim), through
        posenc.attention."""
        if path == "sdpa_causal" or path in BACKENDS:
            return self.baseline_fn(path)
        if path == "flex_direct":
            return self.direct_fn(scheme_name)
        scheme = self.scheme(scheme_name, path)
        backend = _backend_of(path)
        return lambda q, k, v: attention(q, k, v, scheme, backend=backend)

    def direct_fn(self, scheme_name: str) -> Callable:
        """The kernel posenc.attention(backend="flex") runs, called directly.

        posenc's compiled FlexAttention with the scheme's score_mod and the block mask
        posenc builds for the shape: what is left of a flex call without posenc. The
        block mask is made once per shape; the score_mod once per call, as posenc makes
        it, since a learned table's gather (T5's) belongs to the graph each backward
        pass walks.
        """
        from ..flex import call_fitting, compiled_flex_attention
        from ..kernel import block_mask, index_score_mod
        from ..positions import Positions

        scheme, made = self.scheme(scheme_name, "flex"), {}
        if scheme.hook not in ("none", "score"):
            raise SkipPath(
                f"{scheme_name} acts outside the scores: no direct flex call"
            )

        def fn(q, k, v):
            key = (q.shape, q.device)
            if key not in made:
                positions = Positions.resolve(
                    None, None, q.shape[2], k.shape[2], q.shape[0], q.device
                )
                made[key] = (
                    positions,
                    dict(
                        block_mask=block_mask(scheme, positions, True, q, k, None),
                        scale=1.0 / math.sqrt(q.shape[-1]),
                    ),
                )
            positions, fixed = made[key]
            score_mod = index_score_mod(scheme, positions, q)
            fitting = (scheme.name, str(q.device), q.dtype, q.shape[-1], k.shape[-1])
            return call_fitting(
                compiled_flex_attention(),
                q.device,
                fitting,
                q,
                k,
                v,
                score_mod=score_mod,
                **fixed,
            )

        return fn

    def step(
        self, task, length: int
    ) -> tuple[
        Callable[[], object], Callable[[], list[torch.Tensor]], Callable[[], None]
    ]:
        """The measured call for a task at `length`, a function returning what its check
        compares, and one that drops what a call leaves behind (the last call's
        gradients)."""
        q, k, v, grad_out = self.inputs(length, task.batch, task.dtype)
        nothing = lambda: None  # noqa: E731
        if task.scheme == "copy":
            qk = torch.stack((q, k))  # the bytes RoPE reads, and writes once rotated
            if task.path == "preallocated":
                out = torch.empty_like(qk)
                return (
                    (lambda: out.copy_(qk)),
                    (lambda: [out.copy_(qk).clone()]),
                    nothing,
                )
            return (lambda: qk.clone()), (lambda: [qk.clone()]), nothing
        if task.scheme == "rope":
            fn = self.rope_fn(task.path, length, q)
            return (lambda: fn(q, k)), (lambda: list(fn(q, k))), nothing
        fn = self.attention_fn(task.scheme, task.path)
        if task.pass_ == FORWARD:

            def forward():
                with torch.no_grad():
                    return fn(q, k, v)

            return forward, lambda: [forward()], nothing
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        params = (
            []
            if task.scheme == "nope"
            else [
                p
                for p in self.scheme(task.scheme, task.path).parameters()
                if p.requires_grad
            ]
        )

        def reset():
            for t in leaves + params:
                t.grad = None

        def forward_backward():
            reset()
            out = fn(*leaves)
            out.backward(grad_out)
            return out

        def results():
            out = forward_backward()
            return [out.detach()] + [t.grad for t in leaves + params]

        return forward_backward, results, reset

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
                    f"transformers is not installed here ({exc.__class__.__name__}: "
                    f"{exc})"
                ) from None
            self._hf = apply_rotary_pos_emb
        return self._hf

    # ------------------------------------ checks and memory (posenc.study.bench_checks)

    def reference(self, task, length: int) -> list[torch.Tensor]:
        """The reference results a path is compared with (bench_checks.reference)."""
        from .bench_checks import reference

        return reference(self, task, length)

    def check(self, task, check_len: int | None = None) -> float:
        """The path against its reference (bench_checks.check); the max abs error."""
        from .bench_checks import check

        return check(self, task, check_len)

    def kept(self, task) -> int | None:
        """Bytes a path keeps per shape (bench_checks.kept)."""
        from .bench_checks import kept

        return kept(self, task)

    def memory(self, task, fn, reset=None) -> tuple[int | None, str]:
        """Peak bytes of one call and their counter (bench_checks.memory)."""
        from .bench_checks import memory

        return memory(self, task, fn, reset)


def rope_rotate(x, cos, sin):
    """The rotation Rope.transform_qk runs, as one function for torch.compile (half
    layout)."""
    from ..qk.rope import rotate_pairs

    return rotate_pairs(x, cos, sin, "half")
