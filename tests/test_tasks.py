"""posenc.tasks: the synthetic lag-copy task the chapters train on."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc.study.tasks import IGNORE_INDEX, lag_copy, lag_copy_batches


@settings(max_examples=50, deadline=None)
@given(
    step=st.integers(0, 2**22 - 1),
    seed=st.integers(0, 1023),
    vocab=st.integers(2, 50),
    batch=st.integers(1, 5),
    lag=st.integers(1, 8),
    extra=st.integers(1, 20),
)
def test_targets_are_the_inputs_lag_positions_back(step, seed, vocab, batch, lag, extra):
    length = lag + extra
    inputs, targets = lag_copy(step, vocab_size=vocab, length=length, batch_size=batch, lag=lag, seed=seed)
    assert inputs.shape == targets.shape == (batch, length)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.min() >= 0 and inputs.max() < vocab
    assert torch.equal(targets[:, lag:], inputs[:, :-lag])
    assert (targets[:, :lag] == IGNORE_INDEX).all()


def test_pure_and_seeded():
    a = lag_copy(3, seed=7)
    b = lag_copy(3, seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(lag_copy(4, seed=7)[0], a[0])   # another step, another batch
    assert not torch.equal(lag_copy(3, seed=8)[0], a[0])   # another seed, another batch


def test_every_seed_and_step_pair_gets_its_own_generator_seed():
    # torch's CPU generator ignores the bits of a seed above the 32nd: the extreme pairs must still differ
    last_step = 2**22 - 1
    batches = [lag_copy(step, seed=seed)[0] for seed in (0, 1, 1023) for step in (0, 1, last_step)]
    assert all(not torch.equal(a, b) for i, a in enumerate(batches) for b in batches[i + 1 :])


def test_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    lag_copy(0)
    assert torch.equal(torch.get_rng_state(), before)


def test_batches_callable_matches_the_function_and_checks_early():
    batches = lag_copy_batches(vocab_size=5, length=12, batch_size=3, lag=2, seed=1)
    for step in (0, 9):
        expected = lag_copy(step, vocab_size=5, length=12, batch_size=3, lag=2, seed=1)
        assert all(torch.equal(x, y) for x, y in zip(batches(step), expected))
    with pytest.raises(ValueError, match="length must exceed lag"):
        lag_copy_batches(length=4, lag=4)


def test_device_argument():
    inputs, targets = lag_copy(0, device="cpu")
    assert inputs.device.type == targets.device.type == "cpu"
    inputs2, _ = lag_copy(0, device=torch.device("cpu"))
    assert torch.equal(inputs, inputs2)


def test_usable_with_posenc_train():
    torch.manual_seed(0)
    model = posenc.TinyTransformer(vocab_size=6, dim=16, num_heads=2, num_layers=1, scheme="learned", max_len=16)
    losses = posenc.train(model, lag_copy_batches(vocab_size=6, length=16, batch_size=4), steps=3)
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("kwargs, error, words", [
    ({"step": -1}, ValueError, "step must be an integer in"),
    ({"step": 2**22}, ValueError, "step must be an integer in"),
    ({"step": 1.0}, TypeError, "step must be a non-negative integer"),
    ({"step": True}, TypeError, "step must be a non-negative integer"),
    ({"seed": -3}, ValueError, "seed must be an integer in"),
    ({"seed": 1024}, ValueError, "seed must be an integer in"),
    ({"seed": "0"}, TypeError, "seed must be a non-negative integer"),
    ({"vocab_size": 1}, ValueError, "vocab_size must be at least 2"),
    ({"vocab_size": 0}, ValueError, "vocab_size must be a positive integer"),
    ({"vocab_size": 4.0}, TypeError, "vocab_size must be a positive integer"),
    ({"length": 0}, ValueError, "length must be a positive integer"),
    ({"length": 4, "lag": 4}, ValueError, "length must exceed lag"),
    ({"lag": 0}, ValueError, "lag must be a positive integer"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive integer"),
    ({"batch_size": None}, TypeError, "batch_size must be a positive integer"),
    ({"device": 3}, TypeError, "device must be None, a string or a torch.device"),
    ({"device": "no-such-device"}, ValueError, "device must name a torch device"),
])
def test_bad_arguments_name_the_argument(kwargs, error, words):
    args = {"step": 0, **kwargs}
    with pytest.raises(error, match=words):
        lag_copy(**args)
