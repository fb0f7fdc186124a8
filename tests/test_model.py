import pytest
import torch

import posenc


def copy_batches(vocab=12, length=16, batch=8):
    """Predict the token 4 positions back: order matters, content alone cannot do it."""

    def batches(step):
        gen = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, vocab, (batch, length), generator=gen)
        targets = torch.full_like(tokens, -100)
        targets[:, 4:] = tokens[:, :-4]
        return tokens, targets

    return batches


MODEL_ARGS = {"sliding_window": {"window": 4, "inner": "rope"}, "axial_rope": {"grid_width": 4}, "pixtral_rope": {"grid_width": 4}}


@pytest.mark.parametrize("name", list(posenc.SCHEMES))
def test_every_scheme_trains_a_step_and_keeps_shapes(name):
    torch.manual_seed(0)
    model = posenc.TinyTransformer(vocab_size=12, dim=32, num_heads=4, num_layers=2, scheme=name, scheme_args=MODEL_ARGS.get(name), max_len=16)
    losses = posenc.train(model, copy_batches(), steps=2)
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert model(torch.zeros(3, 16, dtype=torch.long)).shape == (3, 16, 12)


def test_learned_model_cannot_run_past_its_table_and_others_can():
    tokens = torch.zeros(1, 17, dtype=torch.long)
    with pytest.raises(ValueError, match="outside the learned table"):
        posenc.TinyTransformer(12, dim=16, num_heads=2, scheme="learned", max_len=16)(tokens)
    assert posenc.TinyTransformer(12, dim=16, num_heads=2, scheme="rope", max_len=16)(tokens).shape == (1, 17, 12)


def test_t5_bias_is_shared_across_layers_and_shaw_tables_are_not():
    t5 = posenc.TinyTransformer(12, dim=16, num_heads=2, num_layers=3, scheme="t5")
    assert t5.blocks[0].scheme is t5.blocks[2].scheme
    shaw = posenc.TinyTransformer(12, dim=16, num_heads=2, num_layers=3, scheme="shaw")
    assert shaw.blocks[0].scheme is not shaw.blocks[1].scheme
    assert shaw.blocks[0].scheme.head_dim == 8


def test_scheme_args_override_the_defaults():
    model = posenc.TinyTransformer(12, dim=16, num_heads=2, scheme="rope", scheme_args={"base": 500.0, "layout": "interleaved"})
    assert model.blocks[0].scheme.base == 500.0 and model.blocks[0].scheme.layout == "interleaved"


@pytest.mark.parametrize("name", ["learned", "rope"])
def test_training_learns_an_order_task_with_positions(name):
    torch.manual_seed(0)
    model = posenc.TinyTransformer(12, dim=32, num_heads=4, num_layers=2, scheme=name, max_len=16)
    losses = posenc.train(model, copy_batches(), steps=200)
    assert sum(losses[-10:]) / 10 < 0.1 < sum(losses[:10]) / 10


@pytest.mark.parametrize("call, words", [
    (lambda: posenc.TinyTransformer(12, dim=30, num_heads=4), "dim (30) must be a multiple of num_heads (4)"),
    (lambda: posenc.TinyTransformer(12, scheme="bert"), "name must be one of"),
    (lambda: posenc.TinyTransformer(0), "vocab_size must be a positive integer"),
    (lambda: posenc.TinyTransformer(12, dim=16, num_heads=2)(torch.zeros(2, 3)), "tokens must be an integer tensor"),
    (lambda: posenc.train(posenc.TinyTransformer(12, dim=16, num_heads=2), copy_batches(), steps=0), "steps must be a positive integer"),
])
def test_bad_arguments_are_named(call, words):
    with pytest.raises((ValueError, TypeError), match=words.replace("(", r"\(").replace(")", r"\)")):
        call()


def test_a_sliding_window_wraps_the_named_inner_scheme_in_every_layer():
    model = posenc.TinyTransformer(12, dim=16, num_heads=2, num_layers=2, scheme="sliding_window", scheme_args={"window": 3, "inner": "shaw", "inner_args": {"max_distance": 2}})
    first, second = (block.scheme for block in model.blocks)
    assert first.window == 3 and isinstance(first.inner, posenc.ShawRelative) and first.inner.max_distance == 2
    assert first.inner is not second.inner  # Shaw's tables stay per layer inside the window
    learned = posenc.TinyTransformer(12, dim=16, num_heads=2, scheme="sliding_window", scheme_args={"window": 3, "inner": "learned"}, max_len=8)
    with pytest.raises(ValueError, match="outside the learned table"):
        learned(torch.zeros(1, 9, dtype=torch.long))
