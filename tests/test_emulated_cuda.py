"""The emulated CUDA device (tests/emulated_cuda.py): what it reports, the errors it raises as CUDA does, and that posenc's GPU paths agree with the CPU on it."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask

import emulated_cuda as emulation
import posenc
from posenc.study.measure import peak_memory
from scheme_cases import SCHEME_ARGS

TOL = {"atol": 1e-5, "rtol": 1e-5}
SAME_DEVICE = "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"
TO_NUMPY = "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."


def qkv(batch=2, heads=4, q_len=9, k_len=9, head_dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, n, head_dim, generator=gen) for n in (q_len, k_len, k_len)]


def on_device(*tensors):
    return [t.to("cuda") for t in tensors]


@pytest.mark.parametrize("device", [None, 0, "cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0)])
def test_torch_reports_one_cuda_device(emulated_cuda, device):
    cuda = torch.cuda
    assert cuda.is_available() and cuda.device_count() == 1 and cuda.current_device() == 0
    assert cuda.get_device_name(device) == emulation.NAME == cuda.get_device_properties(device).name
    assert cuda.get_device_capability(device) == (9, 0)
    props = cuda.get_device_properties(device)
    assert (props.major, props.minor) == (9, 0) and props.total_memory > 0 and props.multi_processor_count > 0
    assert cuda.is_bf16_supported() and cuda.is_bf16_supported(including_emulation=False)
    cuda.set_device(0 if device is None else device)
    cuda.synchronize(device)
    cuda.empty_cache()
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        cuda.get_device_properties(1)
    with pytest.raises(ValueError, match="Expected a cuda device"):
        cuda.memory_allocated("cpu")


def test_events_time_in_milliseconds(emulated_cuda):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    sum(range(10_000))
    end.record()
    end.synchronize()
    assert 0.0 < start.elapsed_time(end) < 1000.0
    with pytest.raises(RuntimeError, match="recorded"):
        start.elapsed_time(torch.cuda.Event(enable_timing=True))


def test_device_tensors_look_like_cuda_tensors(emulated_cuda):
    made = [
        torch.randn(2, 3, device="cuda"),
        torch.zeros(2, 3, device="cuda:0"),
        torch.ones(2, 3, device=torch.device("cuda")),
        torch.tensor([[1.0, 2.0, 3.0]] * 2, device="cuda"),
        torch.as_tensor(np.ones((2, 3), dtype=np.float32), device="cuda"),
        torch.ones(2, 3).to("cuda"),
        torch.ones(2, 3).to(torch.device("cuda"), torch.float32),
        torch.ones(2, 3).cuda(),
        torch.ones(2, 3).to(torch.ones(1, device="cuda")),
        torch.ones(2, 3, device="cuda") * 2 + 1,
    ]
    for t in made:
        assert t.device == torch.device("cuda", 0) and t.is_cuda and t.get_device() == 0 and t.shape == (2, 3) and t.dtype == torch.float32
    x = torch.tensor([1.5, 2.5], device="cuda")
    assert repr(x) == "tensor([1.5000, 2.5000], device='cuda:0')"
    assert repr(x.requires_grad_() * 2) == "tensor([3., 5.], device='cuda:0', grad_fn=<MulBackward0>)"
    assert x.to("cuda") is x and x.cuda() is x and torch.as_tensor(x) is x and x.to(x) is x
    assert type(x.cpu()) is torch.Tensor and x.cpu().device.type == "cpu" and type(x.to("cpu")) is torch.Tensor
    assert x.tolist() == [1.5, 2.5] and x.sum().item() == 4.0 and f"{x.sum():.1f}" == "4.0"
    assert x.new_tensor([1, 2]).device == x.device and x.new_zeros(3).device == x.device and torch.zeros_like(x).device == x.device
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.ones(1, device="cuda:1")


def test_numpy_raises_on_the_device_and_works_after_cpu(emulated_cuda):
    x = torch.arange(3.0, device="cuda")
    with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
        x.numpy()
    with pytest.raises(TypeError, match="Use Tensor.cpu"):
        np.asarray(x)
    assert str(pytest.raises(TypeError, x.numpy).value) == TO_NUMPY
    np.testing.assert_array_equal(x.cpu().numpy(), [0.0, 1.0, 2.0])


def test_a_caller_asking_for_meta_gets_meta(emulated_cuda):
    t = torch.empty(4096, 4096, device="meta")
    assert type(t) is torch.Tensor and t.is_meta and t.nbytes == 4096 * 4096 * 4
    assert torch.zeros(3, device=torch.device("meta")).is_meta and (t[:2] + 1).is_meta


def test_mixing_devices_raises_as_cuda_does(emulated_cuda):
    x = torch.ones(3, device="cuda")
    with pytest.raises(RuntimeError) as raised:
        x * torch.ones(3)
    assert str(raised.value) == SAME_DEVICE
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3) + x
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([x, torch.ones(3)])
    assert torch.equal((x * torch.tensor(2.0)).cpu(), torch.full((3,), 2.0))  # a 0-dim CPU tensor is fine
    assert torch.equal(torch.where(x > 0, x, torch.tensor(0.0)).cpu(), torch.ones(3))
    assert torch.equal(x[torch.tensor([0, 2])].cpu(), torch.ones(2))  # CPU indices into a device tensor are fine
    x[torch.tensor([1])] = 5.0
    assert x.tolist() == [1.0, 5.0, 1.0]
    x.copy_(torch.arange(3.0))  # copies go across devices
    assert x.tolist() == [0.0, 1.0, 2.0]
    assert x[[2, 0]].tolist() == [2.0, 0.0] and x[range(2)].tolist() == [0.0, 1.0] and x[np.array([1])].tolist() == [1.0]
    assert x[[True, False, True]].tolist() == [0.0, 2.0]
    with pytest.raises(RuntimeError, match=r"indices should be either on cpu or on the same device as the indexed tensor \(cpu\)"):
        torch.arange(3.0)[torch.tensor([0], device="cuda")]


def test_a_module_left_on_the_cpu_raises(emulated_cuda):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.nn.Linear(2, 2)(torch.randn(1, 2, device="cuda"))


@pytest.mark.parametrize("make", [lambda: posenc.ALiBi(2), lambda: posenc.Rope(16), lambda: posenc.make_scheme("t5", num_heads=2),
                                  lambda: posenc.SlidingWindow(3, inner=posenc.XPos(16))], ids=["alibi", "rope", "t5", "window_xpos"])
def test_a_scheme_left_on_the_cpu_is_named_by_posenc(emulated_cuda, make):
    """posenc's one device rule: a scheme's tables sit on the queries' device, else posenc (not torch) says which and how to fix it."""
    q, k, v = on_device(*qkv(heads=2))
    for call in (lambda s: posenc.attention(q, k, v, s), lambda s: posenc.KVCache(s).append(k, v, torch.arange(k.shape[2]))):
        with pytest.raises(ValueError, match=r"on cpu, but the queries are on cuda:0: .*scheme\.to\(q\.device\)"):
            call(make())
    assert posenc.attention(q, k, v, make().to("cuda")).device == q.device


def test_modules_move_with_their_parameters_and_buffers(emulated_cuda):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    weight = model[0].weight
    model.to("cuda")
    assert model[0].weight is weight and isinstance(weight, torch.nn.Parameter) and weight.device.type == "cuda"
    assert model[1].running_mean.device.type == "cuda"
    model.to(torch.bfloat16)
    assert model[0].weight is weight and weight.dtype == torch.bfloat16 and isinstance(weight, torch.nn.Parameter)
    text = repr(weight)
    assert text.startswith("Parameter containing:\ntensor([[") and "device='cuda:0'," in text and text.endswith("dtype=torch.bfloat16, requires_grad=True)")
    twin = copy.deepcopy(model)
    assert isinstance(twin[0].weight, torch.nn.Parameter) and torch.equal(twin[0].weight.cpu(), weight.cpu())
    assert posenc.Rope(16).cuda().inv_freq.dtype == torch.float32  # posenc's float32 buffers follow the device


def test_device_draws_have_their_own_stream(emulated_cuda):
    def device_draws():
        x = torch.ones(1000, device="cuda")
        return [
            torch.randn(3, device="cuda"), torch.rand(3, device="cuda"), torch.randint(0, 100, (3,), device="cuda"),
            torch.randperm(10, device="cuda"), F.dropout(x, 0.5), torch.empty(3, device="cuda").normal_(),
            torch.empty(3, device="cuda").uniform_(), torch.multinomial(x[:10] / 10, 3),
        ]

    torch.manual_seed(0)
    cpu = torch.randn(3)
    torch.manual_seed(0)
    first = device_draws()
    assert torch.equal(torch.randn(3), cpu)  # the device draws did not advance the CPU stream
    assert not torch.equal(first[0].cpu(), cpu)  # and the same seed gives a different stream on the device
    torch.manual_seed(0)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(first, device_draws()))
    torch.cuda.manual_seed(0)
    assert torch.equal(torch.randn(3, device="cuda").cpu(), first[0].cpu()) and torch.cuda.initial_seed() == 0
    state = torch.cuda.get_rng_state()
    again = torch.randn(3, device="cuda")
    torch.cuda.set_rng_state(state, "cuda")
    assert torch.equal(torch.randn(3, device="cuda").cpu(), again.cpu())
    with pytest.raises(RuntimeError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
        torch.randn(3, device="cuda", generator=torch.Generator())


def test_memory_counts_live_device_bytes(emulated_cuda):
    before = torch.cuda.memory_allocated()
    x = torch.empty(2**18, device="cuda")  # 1 MiB
    assert torch.cuda.memory_allocated() - before == 2**20
    view = x[: 2**10]  # a view shares its storage
    assert torch.cuda.memory_allocated() - before == 2**20
    del x
    assert torch.cuda.memory_allocated() - before == 2**20
    del view
    assert torch.cuda.memory_allocated() == before
    torch.cuda.reset_peak_memory_stats("cuda")
    y = torch.empty(2**18, device="cuda")
    del y
    assert torch.cuda.max_memory_allocated() - before == 2**20 and torch.cuda.memory_reserved() >= before + 2**20
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() == before


def test_storages_are_the_values_storages(emulated_cuda):
    """posenc's peak_memory counts storages: a device tensor's is that of its values, shared by its views."""
    x = torch.ones(256, device="cuda")
    assert x[:16].untyped_storage().nbytes() == x.untyped_storage().nbytes() == 1024
    assert x[8:].data_ptr() == x.data_ptr() + 32
    work = lambda device: (torch.ones(64, 64, device=device) @ torch.ones(64, 64, device=device)).sum()  # noqa: E731
    assert peak_memory(work, "cuda") == peak_memory(work, "cpu") > 0


def test_a_training_step_on_the_device_matches_the_cpu(emulated_cuda):
    def train(model, device, **adamw):
        opt = torch.optim.AdamW(model.parameters(), lr=0.01, **adamw)
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            tokens = torch.randint(0, 10, (4, 6), generator=gen).to(device)
            logits = model(tokens)
            loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        return loss.item(), [p.detach().cpu() for p in model.parameters()]

    model = torch.nn.Sequential(torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 10))
    for adamw in ({}, {"foreach": True}, {"foreach": False}):
        cpu_loss, cpu_params = train(copy.deepcopy(model), "cpu", **adamw)
        device_model = copy.deepcopy(model).to("cuda")
        loss, params = train(device_model, "cuda", **adamw)
        assert loss == pytest.approx(cpu_loss, rel=1e-5)
        assert all(torch.allclose(a, b, **TOL) for a, b in zip(params, cpu_params))
        assert all(p.grad is None and p.device.type == "cuda" for p in device_model.parameters())


def test_autograd_through_views_in_place_and_no_grad(emulated_cuda):
    a = torch.zeros(4, device="cuda", requires_grad=True)
    b = a * 1
    b[1:3].add_(torch.ones(2, device="cuda"))
    (b * torch.arange(4.0, device="cuda")).sum().backward()
    assert a.grad.device.type == "cuda" and a.grad.tolist() == [0.0, 1.0, 2.0, 3.0]
    with torch.no_grad():
        c = a * 2
    assert not c.requires_grad
    d = torch.ones(3, 2, device="cuda")
    d.t_().unsqueeze_(0)
    assert d.shape == (1, 2, 3) and (d + 0).shape == (1, 2, 3)


def test_compiled_functions_run_eagerly_on_the_device(emulated_cuda):
    double = torch.compile(lambda x: x * 2)
    assert double(torch.ones(2, device="cuda")).device.type == "cuda"

    @torch.compile(dynamic=False)
    def add_one(x):
        return x + 1

    assert add_one(torch.ones(2, device="cuda")).tolist() == [2.0, 2.0]
    module = torch.compile(torch.nn.Linear(2, 3)).to("cuda")
    assert module(torch.ones(1, 2, device="cuda")).device.type == "cuda"


def test_sdpa_is_dense_and_agrees_with_the_cpu(emulated_cuda):
    q, k, v = qkv(heads=4, q_len=5, k_len=7)
    k2, v2 = k[:, :2], v[:, :2]
    bool_mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    cases = [{}, {"is_causal": True}, {"scale": 0.3}, {"attn_mask": bool_mask}, {"attn_mask": torch.randn(2, 1, 5, 7)}]
    for kwargs in cases:
        expected = emulation._ORIGINAL["sdpa"](q, k, v, **kwargs)
        got = F.scaled_dot_product_attention(*on_device(q, k, v), **{n: on_device(a)[0] if torch.is_tensor(a) else a for n, a in kwargs.items()})
        assert got.device.type == "cuda" and torch.allclose(got.cpu(), expected, **TOL), kwargs
    gqa = F.scaled_dot_product_attention(*on_device(q, k2, v2), enable_gqa=True)
    assert torch.allclose(gqa.cpu(), emulation._ORIGINAL["sdpa"](q, k2, v2, enable_gqa=True), **TOL)
    nothing = torch.zeros(5, 7, dtype=torch.bool, device="cuda")
    assert torch.equal(F.scaled_dot_product_attention(*on_device(q, k, v), attn_mask=nothing).cpu(), torch.zeros(2, 4, 5, 16))
    assert F.scaled_dot_product_attention(*on_device(q, k, v), dropout_p=0.5).device.type == "cuda"


def test_block_masks_are_made_on_the_device(emulated_cuda):
    def window(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < 200)

    expected = create_block_mask(window, None, None, 300, 300, device="cpu")
    blocks = create_block_mask(window, None, None, 300, 300, device="cuda")
    assert blocks.kv_num_blocks.device.type == "cuda" and blocks.shape == expected.shape and blocks.mask_mod is window
    assert blocks.sparsity() == pytest.approx(expected.sparsity()) and str(blocks) == str(expected)
    assert torch.equal(blocks.to_dense().cpu(), expected.to_dense())
    q, k, v = qkv(batch=1, heads=1, q_len=300, k_len=300)
    with pytest.raises(RuntimeError, match="same device"):
        torch.nn.attention.flex_attention.flex_attention(*on_device(q, k, v), block_mask=expected)


CASES = [
    ("nope", dict), ("rope", dict), ("alibi", dict), ("t5", dict), ("shaw", dict), ("xpos", dict), ("mrope", dict),
    ("sliding_window", dict), ("sliding_window", lambda: {"window": 4, "inner": posenc.ALiBi(4), "num_sinks": 1}),
]


@pytest.mark.parametrize("name, extra", CASES, ids=[f"{n}{'' if e is dict else '+alibi'}" for n, e in CASES])
@pytest.mark.parametrize("call", ["default", "mask", "positions"])
def test_every_backend_on_the_device_agrees_with_the_cpu(emulated_cuda, name, extra, call):
    """Each backend on the device (compiled flex running densely) against the CPU's explicit backend."""
    q, k, v = qkv()
    kwargs = {
        "default": {},
        "mask": {"mask": torch.rand(2, 1, 9, 9, generator=torch.Generator().manual_seed(2)) > 0.4},  # some queries see no key
        "positions": {"q_positions": torch.tensor([0, 1, 2, 5, 6, 7, 10, 11, 12]), "k_positions": torch.tensor([0, 1, 2, 5, 6, 7, 10, 11, 12])},
    }[call]
    scheme = posenc.make_scheme(name, **{**SCHEME_ARGS[name](16, 4), **extra()})
    with torch.no_grad():
        expected = posenc.attention(q, k, v, scheme, backend="explicit", **kwargs)
        scheme.to("cuda")
        device_kwargs = {n: t.to("cuda") for n, t in kwargs.items()}
        for backend in posenc.BACKENDS:
            got = posenc.attention(*on_device(q, k, v), scheme, backend=backend, **device_kwargs)
            assert got.device.type == "cuda" and torch.allclose(got.cpu(), expected, **TOL), backend


def test_flex_attention_still_runs_on_the_cpu(emulated_cuda):
    """torch's eager FlexAttention compiles a wrapper, which a dispatch mode prevents: under the emulation it is dense on the CPU too."""
    q, k, v = qkv()
    scheme = posenc.SlidingWindow(3, posenc.ALiBi(4))
    with torch.no_grad():
        expected = posenc.attention(q, k, v, scheme, backend="explicit")
        for backend in ("flex", "flex_uncompiled"):
            assert torch.allclose(posenc.attention(q, k, v, scheme, backend=backend), expected, **TOL)


@pytest.mark.parametrize("backend", posenc.BACKENDS)
def test_kv_cache_decoding_on_the_device_agrees_with_the_cpu(emulated_cuda, backend):
    q, k, v = qkv(q_len=10, k_len=10)
    cpu_cache = posenc.KVCache(posenc.SlidingWindow(4, posenc.Rope(16), num_sinks=1))
    device_cache = posenc.KVCache(posenc.SlidingWindow(4, posenc.Rope(16), num_sinks=1).cuda())
    with torch.no_grad():
        for start, end in ((0, 3), (3, 4), (4, 5), (5, 10)):
            step = slice(start, end)
            expected = cpu_cache.step(q[:, :, step], k[:, :, step], v[:, :, step], range(start, end))
            got = device_cache.step(*on_device(q[:, :, step], k[:, :, step], v[:, :, step]), range(start, end), backend=backend)
            assert got.device.type == "cuda" and torch.allclose(got.cpu(), expected, **TOL)
    assert device_cache.keys.device.type == "cuda" and len(device_cache) == len(cpu_cache)


def test_uninstall_restores_torch_exactly():
    patched = [(owner, name, vars(owner).get(name, "missing")) for owner, name, _ in emulation.PATCHES]
    dispatch_modes = torch.utils._python_dispatch._get_current_dispatch_mode_stack()
    function_modes = torch.overrides._get_current_function_mode_stack()
    assert not torch.cuda.is_available()
    with emulation.emulate():
        assert torch.cuda.is_available() and torch.randn(2, device="cuda").is_cuda
        with emulation.emulate():  # nested: the outer one uninstalls
            pass
        assert emulation.installed()
    assert not emulation.installed() and not torch.cuda.is_available()
    assert all(vars(owner).get(name, "missing") is value for owner, name, value in patched)
    assert torch.utils._python_dispatch._get_current_dispatch_mode_stack() == dispatch_modes
    assert torch.overrides._get_current_function_mode_stack() == function_modes
    assert emulation.DeviceTensor not in torch.utils._foreach_utils._foreach_supported_types
    with pytest.raises(RuntimeError):
        torch.randn(2, device="cuda")
