import pytest
import torch

import posenc
from posenc.score import relative
from posenc.study.measure import cuda_peak_memory, peak_memory

FLOAT = 4  # bytes of a float32


def test_peak_counts_what_is_alive_at_once():
    def two_then_one():
        a = torch.empty(1000)
        b = torch.empty(2000)  # a and b alive together: 3000 floats
        del a, b
        return torch.empty(500)

    assert peak_memory(two_then_one) == 3000 * FLOAT


def test_a_rebound_temporary_is_freed():
    def loop():
        x = torch.zeros(100)
        for _ in range(10):
            x = x + 1  # the old x dies once the new one is bound: never more than two alive
        return x

    assert peak_memory(loop) == 2 * 100 * FLOAT


def test_inputs_and_views_of_inputs_are_not_counted():
    x = torch.randn(300, 300)
    assert peak_memory(lambda: x.t()) == 0
    assert peak_memory(lambda: x[:150].reshape(-1)[:10]) == 0  # views all the way
    assert peak_memory(lambda: x[::2].reshape(-1)) == 150 * 300 * FLOAT  # strided rows cannot be flattened in place: a copy
    assert peak_memory(lambda: x @ x) == 300 * 300 * FLOAT
    assert peak_memory(torch.matmul, x, x) == 300 * 300 * FLOAT  # arguments are passed through


def test_a_view_of_a_new_tensor_is_counted_once():
    def view_chain():
        y = torch.ones(1000)
        return y[::2], y.view(10, 100), y

    assert peak_memory(view_chain) == 1000 * FLOAT


def test_storage_resized_in_place_counts_its_growth():
    def grow():
        y = torch.empty(0)
        y.resize_(1000)
        return y

    assert peak_memory(grow) == 1000 * FLOAT


def test_count_is_the_same_on_every_run_and_dtype_aware():
    f = lambda: torch.ones(64, 64, dtype=torch.float64).sum(0)  # noqa: E731
    counts = {peak_memory(f) for _ in range(3)}
    assert counts == {64 * 64 * 8 + 64 * 8}


@pytest.mark.parametrize("length", [64, 128])
def test_shaw_naive_holds_an_l_by_l_by_d_tensor_and_gather_only_the_scores(length):
    d, k = 16, 4
    q, table = torch.randn(1, 1, length, d), torch.randn(2 * k + 1, d)
    index = relative.shaw_relative_index(length, length, k)
    scores = length * length * FLOAT
    assert peak_memory(relative.shaw_key_scores, q, table, index, "naive") == (d + 1) * scores
    assert peak_memory(relative.shaw_key_scores, q, table, index, "gather") == scores + length * (2 * k + 1) * FLOAT


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="fn must be callable"):
        peak_memory(3)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            cuda_peak_memory(lambda: None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_allocator_peak_sees_at_least_the_counted_tensors():
    x = torch.randn(512, 512, device="cuda")
    f = lambda: x @ x  # noqa: E731
    f()  # one-time allocations (cuBLAS workspace) before measuring
    assert cuda_peak_memory(f) >= peak_memory(f) == 512 * 512 * FLOAT
