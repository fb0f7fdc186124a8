"""An emulated CUDA device for the tests: torch reports one GPU whose tensors are CPU tensors underneath.

    import emulated_cuda
    emulated_cuda.install()              # or: with emulated_cuda.emulate(): ...  (pytest: the `emulated_cuda` fixture)
    x = torch.randn(3, device="cuda")    # tensor([...], device='cuda:0'), its values computed on the CPU
    emulated_cuda.uninstall()            # torch exactly as before

Code then takes its GPU paths on a CPU-only machine, with its real values, and meets
the errors a reader meets in Colab on a GPU: a module or an index tensor left on the
CPU ("Expected all tensors to be on the same device, ..."), `.numpy()` on a device
tensor, a CPU generator given to a draw on the device, code that assumes that device
draws follow the CPU's random stream.

Design
------
A device tensor is a `DeviceTensor`, a wrapper subclass (`_make_wrapper_subclass`)
holding the real CPU tensor in `.elem`. Python sees `device == cuda:0`; torch's C++
sees the `meta` device, because the autograd engine needs a device guard for every
tensor it differentiates, and a CPU-only build has one for meta and none for cuda.
Every aten operator that touches a device tensor reaches `_dispatch` (through a
TorchDispatchMode, or the subclass's own __torch_dispatch__ when no mode is active),
which checks devices as CUDA does, runs the operator on the CPU tensors and wraps the
results. The mode also sees the operators that *create* tensors: `device="cuda"`
makes them on the emulated device, and so does `device="meta"`, which is what torch's
C++ asks for when it makes a tensor "like" a device tensor (a scalar to combine with
it, zeros for a missing gradient, a buffer of a backward formula). A caller that
itself names the meta device (or passes a real meta tensor) still gets real meta
tensors: a TorchFunctionMode sees the Python-level call and lets meta through while
it runs.

The alternative, plain CPU tensors with an "on the device" flag per storage, fails on
exactly those C++-made tensors: they would be CPU tensors, and autograd would mix
"devices" that the emulation could not tell apart from a real mistake.

Python-level patches cover what C++ would ask the absent CUDA runtime (the current
device, for "cuda" without an index) or do outside the dispatcher: `Tensor.to`,
`.cuda`, `.new_tensor`, indexing with lists, `torch.tensor`, `torch.as_tensor`, the
`torch.cuda` API, and torch's grouping of tensors by device (optimizers, gradient
clipping). SDPA on device tensors and FlexAttention on either device are evaluated
densely: scores, score_mod and mask_mod on broadcast index grids, softmax, zeros for
a query that may see no key. torch.compile needs no patch: while a TorchDispatchMode
is active, dynamo compiles nothing and compiled callables run eagerly.

Emulated
--------
* torch.cuda: is_available, device_count, current_device, set_device, get_device_name,
  get_device_capability (9, 0), get_device_properties, is_bf16_supported, synchronize,
  Event (timed with time.perf_counter), empty_cache, memory_allocated,
  max_memory_allocated, reset_peak_memory_stats, memory_reserved, max_memory_reserved
  (bytes of the live device tensors' storages; "reserved" keeps their peak until
  empty_cache, as the caching allocator does), manual_seed(_all), seed(_all),
  initial_seed, get/set_rng_state(_all); each takes its device as an int, a str or a
  torch.device, and rejects any device but cuda:0.
* Tensors: factories with device="cuda", "cuda:0" or torch.device("cuda"), torch.tensor,
  torch.as_tensor, Tensor.to (a device, a dtype, another tensor), .cuda(), .cpu(),
  .new_*, nn.Module.to / .cuda (parameters keep their identity and stay nn.Parameter),
  every aten operator, views, in-place operators, indexing, autograd, optimizers (foreach
  and for-loop), clip_grad_norm_, deepcopy, .item() and .tolist(); `.numpy()` and
  np.asarray raise; untyped_storage() and data_ptr() are the values'.
* Device checks: a device tensor meeting a CPU tensor raises torch's message (a 0-dim
  CPU tensor is fine, as are CPU indices into a device tensor and copies across
  devices, as on CUDA); device indices into a CPU tensor raise.
* Random numbers on the device come from a generator of their own, seeded by
  torch.manual_seed and torch.cuda.manual_seed, whose stream differs from the CPU's
  for the same seed; device draws leave the CPU's stream alone.
* F.scaled_dot_product_attention, flex_attention and create_mask (so create_block_mask,
  whose BlockMask then holds device tensors).

Not emulated
------------
* torch.autocast("cuda") is accepted but casts nothing (autocast follows the C++
  device), so code under it runs in its tensors' own dtypes.
* A second device, streams, CUDA graphs, torch.Generator(device="cuda"), pinned memory,
  torch.accelerator, torch.asarray, torch.set_default_device("cuda") with torch.tensor,
  torch.save of device tensors, nested and sparse tensors.
* A device tensor's `.to("meta")` is the tensor itself; a torch.compile(flex_attention)
  made before install() holds torch's own FlexAttention, which fails under the mode
  (posenc's, kept in an lru_cache, is dropped at install() and uninstall()); while
  installed, compiled callables run eagerly on the CPU too.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
import weakref
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F
import torch.utils._foreach_utils as foreach_utils
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

CUDA = torch.device("cuda", 0)
NAME = "Emulated CUDA (CPU tensors)"
CAPABILITY = (9, 0)
TOTAL_MEMORY = 80 * 2**30
MULTI_PROCESSORS = 132
DEFAULT_SEED = 67280421310721  # CUDA's default seed before any manual_seed

aten = torch.ops.aten
# operators that take tensors on other devices as CUDA does: copies, and CPU indices into a device tensor
CROSS_DEVICE = {aten.copy_.default, aten._copy_from.default, aten._copy_from_and_resize.default, aten._foreach_copy_.default}
INDEXING = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default, aten._unsafe_index.Tensor}


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated device: `elem` holds its values (a CPU tensor); Python sees cuda:0, C++ sees meta."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype, layout=elem.layout, device="meta"
        )

    def __init__(self, elem: torch.Tensor):
        self.elem = elem
        _MEMORY.track(elem)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})

    # the traceable-subclass protocol: nn.Module._apply then swaps parameters in place (they keep their identity)
    def __tensor_flatten__(self):
        return ["elem"], None

    @staticmethod
    def __tensor_unflatten__(inner, context, outer_size, outer_stride):
        return DeviceTensor(inner["elem"])

    device = property(lambda self: CUDA)
    is_cuda = property(lambda self: True)
    is_meta = property(lambda self: False)

    def get_device(self) -> int:
        return 0

    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self.elem.untyped_storage()  # its bytes, shared by its views (C++ gives each wrapper a meta storage of its own)

    def numpy(self, *, force: bool = False):
        if force:
            return self.detach().cpu().numpy()
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first.")

    def __deepcopy__(self, memo):
        # torch's default would deep-copy `elem` behind a clone's back: here the values are copied once, on the device
        if id(self) not in memo:
            new = DeviceTensor(self.elem.clone())
            new.__dict__.update(copy.deepcopy({k: v for k, v in vars(self).items() if k != "elem"}, memo))  # _is_param
            new.requires_grad_(self.requires_grad)
            if self.grad is not None:
                new.grad = copy.deepcopy(self.grad, memo)
            memo[id(self)] = new
        return memo[id(self)]

    def tolist(self):
        return self.elem.tolist()

    def __getitem__(self, index):
        return torch.Tensor.__getitem__(self, _as_indices(index))

    def __setitem__(self, index, value):
        torch.Tensor.__setitem__(self, _as_indices(index), value)

    def __format__(self, spec: str) -> str:
        return self.item().__format__(spec) if self.dim() == 0 else object.__format__(self, spec)

    def __repr__(self, *, tensor_contents=None) -> str:
        # torch prints a subclass as "DeviceTensor(...)": print "tensor(...)", continuation lines re-indented to match
        text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        parameter = text.startswith("Parameter(")
        text = text.removeprefix("Parameter(").removesuffix(")") if parameter else text
        own = f"{type(self).__name__}("
        text = "tensor(" + text[len(own) :].replace("\n" + " " * len(own), "\n" + " " * len("tensor("))
        return "Parameter containing:\n" + text if parameter else text


def _as_indices(index):
    """Lists, ranges and arrays in an index as CPU tensors: torch makes them "like" the indexed tensor, here meta, without values."""
    if isinstance(index, list) and any(isinstance(i, (list, tuple, slice, torch.Tensor)) or i is None or i is Ellipsis for i in index):
        index = tuple(index)  # torch reads such a list as a tuple of indices
    parts = index if isinstance(index, tuple) else (index,)
    parts = tuple(torch.as_tensor(p) if isinstance(p, (list, range, np.ndarray)) else p for p in parts)
    return parts if isinstance(index, tuple) else parts[0]


def _wrap(t):
    return DeviceTensor(t) if isinstance(t, torch.Tensor) else t


def _unwrap(t):
    return t.elem if isinstance(t, DeviceTensor) else t


def _is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def _check_index(device) -> None:
    if device.index not in (None, 0):
        raise RuntimeError("CUDA error: invalid device ordinal")


# ---------------------------------------------------------------------------------------------------------------------
# The dispatcher: every aten operator that involves the device


def _dispatch(func, args, kwargs):
    tensors = [t for t in pytree.arg_tree_leaves(*args, **kwargs) if isinstance(t, torch.Tensor)]
    on_device = any(isinstance(t, DeviceTensor) for t in tensors)
    device = kwargs.get("device")
    device = None if device is None else torch.device(device)
    creates_here = device is not None and (device.type == "cuda" or (device.type == "meta" and not _MetaRequests.requested))
    if not (on_device or creates_here):
        return func(*args, **kwargs)
    args, kwargs = pytree.tree_map(_unwrap, (args, kwargs))
    if device is not None and not creates_here:  # leaving the device: .cpu(), .to("cpu"), a real meta tensor
        return func(*args, **kwargs)
    if creates_here:
        _check_index(device)
        kwargs["device"] = torch.device("cpu")
    _check_devices(func, args, tensors)
    if torch.Tag.nondeterministic_seeded in func.tags:
        generator = kwargs.get("generator")
        if generator is not None:
            raise RuntimeError(f"Expected a 'cuda' device type for generator but found '{generator.device.type}'")
        with _RANDOM.as_default():
            out = func(*args, **kwargs)
    else:
        out = func(*args, **kwargs)
    if torch.Tag.inplace_view in func.tags or func is aten.resize_.default:
        _follow_metadata(args[0], tensors[0])
    # an in-place or out= operator returns its argument itself
    given = {id(_unwrap(t)): t for t in tensors}
    return pytree.tree_map(lambda t: given[id(t)] if id(t) in given else _wrap(t), out)


def _follow_metadata(elem: torch.Tensor, wrapper: torch.Tensor) -> None:
    """An in-place view (unsqueeze_, t_, ...) or resize_ changed elem's shape: the wrapper's meta shape follows."""
    with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
        torch.Tensor.as_strided_(wrapper, elem.size(), elem.stride(), elem.storage_offset())


def _check_devices(func, args, tensors) -> None:
    """Raise as CUDA does when a device tensor meets a CPU tensor (0-dim CPU tensors are fine, as are copies)."""
    if func in CROSS_DEVICE:
        return
    if func in INDEXING:
        indexed, indices = args[0], args[1]
        if not isinstance(_find(tensors, indexed), DeviceTensor):
            if any(isinstance(_find(tensors, i), DeviceTensor) for i in indices if i is not None):
                raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor ({indexed.device})")
        else:  # CPU indices into a device tensor are fine
            index_ids = {id(i) for i in indices if i is not None and i.device.type == "cpu"}
            tensors = [t for t in tensors if id(_unwrap(t)) not in index_ids]
    devices = []
    for t in tensors:
        device = CUDA if isinstance(t, DeviceTensor) else t.device
        if device not in devices and (device != torch.device("cpu") or t.dim() > 0):
            devices.append(device)
    if len(devices) > 1:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, {devices[0]} and {devices[1]}!")


def _find(tensors, elem):
    """The argument (device tensor or not) whose values are `elem`."""
    return next((t for t in tensors if _unwrap(t) is elem), elem)


class _DeviceMode(TorchDispatchMode):
    """Sends every operator to _dispatch, so that factories with device="cuda" reach it too."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


class _MetaRequests(TorchFunctionMode):
    """While a Python-level call names the meta device or passes a real meta tensor, meta means meta (see the module docstring)."""

    requested = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _MetaRequests.requested or not any(map(_is_meta, (*args, *kwargs.values()))):
            return func(*args, **kwargs)
        _MetaRequests.requested = True
        try:
            return func(*args, **kwargs)
        finally:
            _MetaRequests.requested = False


def _is_meta(arg) -> bool:
    if isinstance(arg, (list, tuple)):
        return any(map(_is_meta, arg))
    if isinstance(arg, str):
        return arg.startswith("meta")
    if isinstance(arg, torch.device):
        return arg.type == "meta"
    if not isinstance(arg, torch.Tensor) or isinstance(arg, DeviceTensor):
        return False
    # a tensor under vmap wraps its values (perhaps a device tensor, meta to C++) and says is_meta for them
    return arg.is_meta and not torch._C._functorch.is_functorch_wrapped_tensor(arg)


# ---------------------------------------------------------------------------------------------------------------------
# Memory and random numbers


class _Memory:
    """Bytes of the live storages of device tensors: a storage counts once, however many tensors view it."""

    def __init__(self):
        self.storages: dict[int, list[int]] = {}  # storage id -> [bytes, tensors holding it]
        self.allocated = self.peak = self.reserved = 0

    def track(self, elem: torch.Tensor) -> None:
        storage = elem.untyped_storage()
        key = storage._cdata
        if key in self.storages:
            self.storages[key][1] += 1
        else:
            self.storages[key] = [storage.nbytes(), 1]
            self.allocated += storage.nbytes()
            self.peak, self.reserved = max(self.peak, self.allocated), max(self.reserved, self.allocated)
        weakref.finalize(elem, self.release, key)

    def release(self, key: int) -> None:
        entry = self.storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            del self.storages[key]
            self.allocated -= entry[0]


_MEMORY = _Memory()


class _Random:
    """The device's generator: a CPU generator's state, swapped in around every random operator on the device."""

    def __init__(self):
        self.manual_seed(DEFAULT_SEED)

    def manual_seed(self, seed) -> None:
        self.initial = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
        # a different stream from the CPU's for the same seed, as CUDA's Philox differs from the CPU's Mersenne Twister
        self.state = torch.Generator().manual_seed(self.initial ^ 0x5DEECE66D_C0FFEE).get_state()

    @contextlib.contextmanager
    def as_default(self):
        cpu = torch.default_generator.get_state()
        torch.default_generator.set_state(self.state)
        try:
            yield
        finally:
            self.state = torch.default_generator.get_state()
            torch.default_generator.set_state(cpu)


_RANDOM = _Random()


# ---------------------------------------------------------------------------------------------------------------------
# The torch.cuda API


def _check_cuda_argument(device=None) -> None:
    """A device argument of torch.cuda (None, int, str, torch.device) must name cuda:0, the one device there is."""
    if isinstance(device, int):
        device = torch.device("cuda", device)
    device = CUDA if device is None else torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {device}")
    _check_index(device)


@dataclass(frozen=True)
class DeviceProperties:
    """What torch.cuda.get_device_properties tells of the emulated device."""

    name: str = NAME
    major: int = CAPABILITY[0]
    minor: int = CAPABILITY[1]
    total_memory: int = TOTAL_MEMORY
    multi_processor_count: int = MULTI_PROCESSORS
    is_integrated: bool = False
    is_multi_gpu_board: bool = False


class Event:
    """torch.cuda.Event: record() notes time.perf_counter(), elapsed_time() gives milliseconds."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing, self.recorded_at = enable_timing, None

    def record(self, stream=None) -> None:
        self.recorded_at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.recorded_at - self.recorded_at) * 1000.0


def _get_rng_state(device="cuda") -> torch.Tensor:
    _check_cuda_argument(device)
    return _RANDOM.state.clone()


def _set_rng_state(new_state: torch.Tensor, device="cuda") -> None:
    _check_cuda_argument(device)
    torch.Generator().set_state(new_state)  # rejects a malformed state here, not at the next draw
    _RANDOM.state = new_state.clone()


def _reset_peak(device=None) -> None:
    _check_cuda_argument(device)
    _MEMORY.peak = _MEMORY.allocated


def _empty_cache() -> None:
    _MEMORY.reserved = _MEMORY.allocated


def _seed() -> None:
    _RANDOM.manual_seed(torch.Generator().seed())


def _query(answer):
    """A torch.cuda query about a device: checks the device argument, then answers."""

    def query(device=None):
        _check_cuda_argument(device)
        return answer()

    return query


CUDA_API = {
    "is_available": lambda: True,
    "is_initialized": lambda: True,
    "_lazy_init": lambda: None,  # the C++ argument parser calls it for every cuda device argument
    "device_count": lambda: 1,
    "current_device": lambda: 0,
    "set_device": _query(lambda: None),
    "get_device_name": _query(lambda: NAME),
    "get_device_capability": _query(lambda: CAPABILITY),
    "get_device_properties": _query(DeviceProperties),
    "is_bf16_supported": lambda including_emulation=True: True,
    "synchronize": _query(lambda: None),
    "Event": Event,
    "empty_cache": _empty_cache,
    "memory_allocated": _query(lambda: _MEMORY.allocated),
    "max_memory_allocated": _query(lambda: _MEMORY.peak),
    "memory_reserved": _query(lambda: _MEMORY.reserved),
    "max_memory_reserved": _query(lambda: max(_MEMORY.reserved, _MEMORY.peak)),
    "reset_peak_memory_stats": _reset_peak,
    "manual_seed": _RANDOM.manual_seed,
    "manual_seed_all": _RANDOM.manual_seed,  # what torch.manual_seed calls
    "seed": _seed,
    "seed_all": _seed,
    "initial_seed": lambda: _RANDOM.initial,
    "get_rng_state": _get_rng_state,
    "set_rng_state": _set_rng_state,
    "get_rng_state_all": lambda: [_get_rng_state()],
    "set_rng_state_all": lambda new_states: _set_rng_state(new_states[0]),
}


# ---------------------------------------------------------------------------------------------------------------------
# Above the dispatcher: where C++ would ask the CUDA runtime for the current device


def _indexed(arg):
    """"cuda" and torch.device("cuda") as cuda:0 (C++ asks the CUDA runtime which device an index-less one is)."""
    if isinstance(arg, (str, torch.device)) and str(arg) == "cuda":
        return CUDA
    return arg


def _to(self, *args, **kwargs):
    args, kwargs = tuple(map(_indexed, args)), {k: _indexed(v) for k, v in kwargs.items()}
    if isinstance(self, DeviceTensor):
        options = dict(kwargs)
        copy = options.pop("copy", False)
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **options)
        # already there (a device tensor's C++ device, which `to(other)` reads, is meta): the tensor itself, as on CUDA
        if device is not None and device.type == "cuda":
            _check_index(device)
        if not copy and (device is None or device.type != "cpu") and dtype in (None, self.dtype) and memory_format in (None, torch.preserve_format):
            return self
    return _ORIGINAL["to"](self, *args, **kwargs)


def _cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    device = torch.device("cuda", device) if isinstance(device, int) else _indexed(CUDA if device is None else device)
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"Invalid device, must be cuda device, got {device}")
    return _to(self, device, non_blocking=non_blocking, memory_format=memory_format)


def _tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    if device is None and isinstance(data, DeviceTensor):
        device = CUDA
    if not _is_cuda(device):
        return _ORIGINAL["tensor"](data, dtype=dtype, device=device, requires_grad=requires_grad, pin_memory=pin_memory)
    _check_index(torch.device(device))
    host = _ORIGINAL["tensor"](data.detach().cpu() if isinstance(data, DeviceTensor) else data, dtype=dtype)
    return host.to(CUDA).requires_grad_(requires_grad)


def _as_tensor(data, dtype=None, device=None):
    if device is None and isinstance(data, DeviceTensor):
        device = CUDA
    if not _is_cuda(device):
        return _ORIGINAL["as_tensor"](data, dtype=dtype, device=device)
    _check_index(torch.device(device))
    host = data if isinstance(data, torch.Tensor) else _ORIGINAL["as_tensor"](data, dtype=dtype)
    return _to(host, device=CUDA, dtype=dtype)


def _new_tensor(self, data, *, dtype=None, device=None, requires_grad=False, **kwargs):
    device = self.device if device is None else device
    if not _is_cuda(device):
        return _ORIGINAL["new_tensor"](self, data, dtype=dtype, device=device, requires_grad=requires_grad, **kwargs)
    return _tensor(data, dtype=self.dtype if dtype is None else dtype, device=device, requires_grad=requires_grad)


def _group_tensors_by_device_and_dtype(tensorlistlist, with_indices=False):
    """torch groups by the C++ device (meta for device tensors): report cuda:0, as optimizers and clip_grad_norm_ expect."""
    grouped = _ORIGINAL["group"](tensorlistlist, with_indices)
    return {
        (CUDA if isinstance(next(t for t in lists[0] if t is not None), DeviceTensor) else device, dtype): (lists, indices)
        for (device, dtype), (lists, indices) in grouped.items()
    }


# ---------------------------------------------------------------------------------------------------------------------
# Attention, dense on the device


def _on_device(*trees) -> bool:
    return any(isinstance(t, DeviceTensor) for t in pytree.tree_leaves(trees))


def _grids(batch: int, heads: int, q_len: int, kv_len: int, device=CUDA) -> tuple[torch.Tensor, ...]:
    """b, h, q_idx, kv_idx shaped (B,1,1,1), (1,H,1,1), (1,1,Q,1), (1,1,1,KV), to broadcast to (B, H, Q, KV)."""
    return tuple(torch.arange(n, device=device).view([n if d == dim else 1 for d in range(4)]) for dim, n in enumerate((batch, heads, q_len, kv_len)))


def _attend(scores: torch.Tensor, allowed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax weights over the allowed keys and their logsumexp: zeros (lse -inf) for a query that may see no key."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    sees_none = scores.isneginf().all(dim=-1, keepdim=True)
    return torch.softmax(scores, dim=-1).masked_fill(sees_none, 0.0), scores.logsumexp(dim=-1)


def _repeat_heads(query, key, value, enable_gqa: bool):
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        groups = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
    return key, value


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if not _on_device(query, key, value, attn_mask):
        return _ORIGINAL["sdpa"](query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    key, value = _repeat_heads(query, key, value, enable_gqa)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query.float() @ key.float().transpose(-2, -1)) * scale
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=CUDA).tril() if is_causal else None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        allowed = attn_mask if allowed is None else allowed & attn_mask
    elif attn_mask is not None:
        scores = scores + attn_mask.float()
    weights, _ = _attend(scores, allowed)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    return (weights @ value.float()).to(query.dtype)


def _flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None):
    """FlexAttention, dense, on either device: torch's own eager FlexAttention runs through torch.compile, which compiles
    nothing while a TorchDispatchMode is active, so it would fail on the CPU as well."""
    batch, heads, q_len, _ = query.shape
    key, value = _repeat_heads(query, key, value, enable_gqa)
    kv_len = key.shape[-2]
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = (query.float() @ key.float().transpose(-2, -1)) * scale
    grids = _grids(batch, heads, q_len, kv_len, query.device)
    if score_mod is not None:
        scores = score_mod(scores, *grids)
    allowed = None if block_mask is None else _dense_block_mask(block_mask, grids, query.device, q_len, kv_len)
    weights, lse = _attend(scores, allowed)
    out = (weights @ value.float()).to(query.dtype)
    if return_aux is not None:
        return out, flex.AuxOutput(lse=lse if return_aux.lse else None, max_scores=scores.amax(dim=-1) if return_aux.max_scores else None)
    return (out, lse) if return_lse else out


def _dense_block_mask(block_mask, grids, device, q_len: int, kv_len: int) -> torch.Tensor:
    """What a BlockMask lets through, token by token: mask_mod inside its partial blocks, everything inside its full blocks."""
    if block_mask.kv_num_blocks.device != device:
        raise RuntimeError(f"Expect q/k/v and block_mask to be on the same device but got {device} and {block_mask.kv_num_blocks.device}.")
    if block_mask.seq_lengths != (q_len, kv_len):
        raise ValueError(f"block_mask was created for block_mask.shape={block_mask.shape} but got q_len={q_len} and kv_len={kv_len}.")
    q_block, kv_block = block_mask.BLOCK_SIZE

    def tokens(num_blocks, indices):
        blocks = flex._ordered_to_dense(num_blocks, indices, indices.shape[-1]).bool()
        return blocks.repeat_interleave(q_block, dim=-2).repeat_interleave(kv_block, dim=-1)[..., :q_len, :kv_len]

    allowed = tokens(block_mask.kv_num_blocks, block_mask.kv_indices) & block_mask.mask_mod(*grids)
    if block_mask.full_kv_num_blocks is not None:
        allowed = allowed | tokens(block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    return allowed


def _create_mask(mod_fn, B, H, Q_LEN, KV_LEN, device=None):
    """flex's create_mask (and so create_block_mask) on the device: the mod evaluated once on broadcast index grids."""
    if not _is_cuda(device):
        return _ORIGINAL["create_mask"](mod_fn, B, H, Q_LEN, KV_LEN, device)
    _check_index(torch.device(device))
    shape = (B or 1, H or 1, Q_LEN, KV_LEN)
    grids = _grids(*shape)
    if flex._get_mod_type(mod_fn) == flex._ModificationType.SCORE_MOD:
        return ~mod_fn(torch.zeros(shape, device=CUDA), *grids).isneginf()
    return mod_fn(*grids).expand(shape)


# ---------------------------------------------------------------------------------------------------------------------
# install / uninstall


_ORIGINAL = {
    "to": torch._C.TensorBase.to,
    "new_tensor": torch._C.TensorBase.new_tensor,
    "tensor": torch.tensor,
    "as_tensor": torch.as_tensor,
    "group": torch._C._group_tensors_by_device_and_dtype,
    "sdpa": F.scaled_dot_product_attention,
    "create_mask": flex.create_mask,
}
PATCHES = [
    *((torch.cuda, name, value) for name, value in CUDA_API.items()),
    (torch.Tensor, "to", _to),
    (torch.Tensor, "cuda", _cuda),
    (torch.Tensor, "new_tensor", _new_tensor),
    (torch, "tensor", _tensor),
    (torch, "as_tensor", _as_tensor),
    (torch._C, "_group_tensors_by_device_and_dtype", _group_tensors_by_device_and_dtype),
    (F, "scaled_dot_product_attention", _scaled_dot_product_attention),
    (flex, "flex_attention", _flex_attention),
    (flex, "create_mask", _create_mask),
]
_MISSING = object()
_saved: list[tuple[object, str, object]] = []  # (owner, name, what its own __dict__ held, or _MISSING)
_modes: list = []


def installed() -> bool:
    return bool(_modes)


def install() -> None:
    """Make torch report one CUDA device whose tensors are CPU tensors (a no-op when already installed)."""
    if installed():
        return
    for owner, name, value in PATCHES:
        _saved.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, value)
    foreach_utils._foreach_supported_types.append(DeviceTensor)  # optimizers and clip_grad_norm_ take their foreach paths
    _clear_compiled_caches()
    _modes.extend([_MetaRequests(), _DeviceMode()])
    for mode in _modes:
        mode.__enter__()


def uninstall() -> None:
    """Restore every patched attribute and leave the modes (a no-op when not installed)."""
    if not installed():
        return
    for mode in reversed(_modes):
        mode.__exit__(None, None, None)
    _modes.clear()
    foreach_utils._foreach_supported_types.remove(DeviceTensor)
    while _saved:
        owner, name, value = _saved.pop()
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _clear_compiled_caches()


def _clear_compiled_caches() -> None:
    """What was compiled or cached under the emulation must not outlive it (and back).

    posenc keeps torch.compile(flex_attention) in an lru_cache and block masks in posenc.kernel's table cache;
    torch._dynamo keeps the code it compiled. Each is made again at its next use, from the torch of the moment.
    """
    core, kernel = sys.modules.get("posenc.core"), sys.modules.get("posenc.kernel")
    if core is not None:
        core.compiled_flex_attention.cache_clear()
    if kernel is not None:
        kernel._MASKS.clear()
    torch._dynamo.reset()


@contextlib.contextmanager
def emulate():
    """install() for the block, uninstall() after it (unless it was installed already)."""
    was_installed = installed()
    install()
    try:
        yield sys.modules[__name__]
    finally:
        if not was_installed:
            uninstall()
