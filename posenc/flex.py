"""FlexAttention's helpers for the flex backends of posenc.attention (core._flex).

* `compiled_flex_attention`: FlexAttention compiled once per process;
* `flex_kernel_options`: smaller blocks on GPUs with little shared memory;
* `call_fitting`: a compiled call retried with smaller blocks where its kernel asks
  for more shared memory than the GPU has;
* `cpu_compiles_flex`: whether torch's inductor can compile it for this CPU;
* `LSE`: the keyword that makes it return its log-sum-exp (for sink logits).
"""

from __future__ import annotations

import os
import sys
from functools import lru_cache

import torch


def _lse_request() -> dict:
    """The keyword that makes FlexAttention return its log-sum-exp: return_aux
    (torch >= 2.9) or return_lse."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest
    except ImportError:
        return {"return_lse": True}
    return {"return_aux": AuxRequest(lse=True)}


LSE = _lse_request()


@lru_cache(maxsize=None)
def compiled_flex_attention():
    """FlexAttention compiled once per process (dynamic=False: one kernel per shape, as
    fast as it gets)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


# FlexAttention's blocks for GPUs whose shared memory per block (opt-in) is below
# 128 KiB: inductor's defaults for compute capability 8.x assume an A100's 164 KiB, and
# Triton's own for older GPUs can exceed a T4's 64 KiB ("out of resource: shared
# memory"); these fit in 48 KiB for head widths up to 128 in float32, at some cost in
# speed
SMALL_SHARED_MEMORY = 128 * 1024
FLEX_BLOCKS_SMALL = {
    "BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4,
    "BLOCK_M1": 16, "BLOCK_N1": 16, "BLOCK_M2": 16, "BLOCK_N2": 16,
}  # fmt: skip
FLEX_BLOCKS_MEDIUM = {  # 96 KiB and more (an A10, L4 or RTX 30/40: 99 KiB)
    "BLOCK_M": 64, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4,
    "BLOCK_M1": 32, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 32,
}  # fmt: skip


def flex_kernel_options(device: torch.device) -> dict | None:
    """kernel_options for compiled FlexAttention on `device`: smaller blocks where
    shared memory is small.

    None (inductor's own choice) on the CPU and on GPUs with 128 KiB or more of shared
    memory per block (an A100, H100); FLEX_BLOCKS_MEDIUM from 96 KiB; FLEX_BLOCKS_SMALL
    below (a T4's 64 KiB). torch reports the size as shared_memory_per_block_optin;
    where it does not, a compute capability below 8.0 counts as small.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    shared = getattr(props, "shared_memory_per_block_optin", None)
    if shared is None:
        shared = 64 * 1024 if getattr(props, "major", 9) < 8 else SMALL_SHARED_MEMORY
    if shared >= SMALL_SHARED_MEMORY:
        return None
    return dict(FLEX_BLOCKS_MEDIUM if shared >= 96 * 1024 else FLEX_BLOCKS_SMALL)


# where inductor's blocks need more shared memory than the GPU has (T5's gathered bias
# on an H200 in bfloat16 at d_h = 64 asked 240 KiB of its 227 with blocks of 128 x 128),
# these, in this order: the blocks an A100 gets by default, then the smaller ones
FLEX_BLOCKS_LARGE = {
    "BLOCK_M": 128, "BLOCK_N": 64, "num_stages": 3, "num_warps": 4,
    "BLOCK_M1": 64, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 64,
}  # fmt: skip
FLEX_BLOCKS_LADDER = (None, FLEX_BLOCKS_LARGE, FLEX_BLOCKS_MEDIUM, FLEX_BLOCKS_SMALL)
_fitted: dict = {}


def out_of_shared_memory(error: BaseException) -> bool:
    """Whether `error` is a kernel's compile asking more shared memory than the GPU has
    (Triton's OutOfResources, as inductor reports it)."""
    text = f"{type(error).__name__}: {error}"
    return "OutOfResources" in text or "out of resource" in text


def call_fitting(run, device: torch.device, key, *args, **kwargs):
    """`run(*args, **kwargs)` (a compiled FlexAttention) with the kernel_options of
    flex_kernel_options(device), and on a GPU whose shared memory they overflow,
    with each smaller set of FLEX_BLOCKS_LADDER in turn; the set that fitted is kept
    for `key` (what decides the kernel: the score_mod, dtype and head width)."""
    first = _fitted.get(key, flex_kernel_options(device))
    ladder = FLEX_BLOCKS_LADDER[FLEX_BLOCKS_LADDER.index(first) :]
    failed = None
    for options in ladder if torch.device(device).type == "cuda" else (first,):
        try:
            out = run(
                *args,
                **kwargs,
                **({} if options is None else {"kernel_options": options}),
            )
        except Exception as error:
            if not out_of_shared_memory(error):
                raise
            failed = error
            continue
        _fitted[key] = options
        return out
    raise RuntimeError(
        f"compiled FlexAttention for {key} needs more shared memory than this GPU has "
        f"with every block size posenc tries (FLEX_BLOCKS_LADDER): {failed}"
    ) from failed


def cpu_compiles_flex() -> bool:
    """Whether torch's inductor can compile FlexAttention for this CPU: its own test
    (torch/_inductor/kernel/flex/flex_cpu.py)."""
    return (
        torch.cpu._is_avx2_supported()
        and os.environ.get("ATEN_CPU_CAPABILITY") != "default"
        and sys.platform != "darwin"
    )
