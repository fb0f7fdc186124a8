"""posenc.flex.call_fitting: a compiled FlexAttention call whose kernel overflows the GPU's shared memory is retried
with smaller blocks (what an H200 needed for T5's gathered bias), any other error is raised as it is."""

import pytest
import torch

from posenc import flex

OVERFLOW = RuntimeError("No valid triton configs. OutOfMemoryError: out of resource: triton_tem_fused_flex_attention_0 "
                        "Required: 245760 Hardware limit:232448 Reducing block sizes or `num_stages` may help.")
CUDA = torch.device("cuda")


@pytest.fixture
def big_gpu(monkeypatch):
    """A GPU whose inductor blocks posenc leaves alone (an H100, H200), and no fitted blocks kept."""
    monkeypatch.setattr(flex, "flex_kernel_options", lambda device: None)
    monkeypatch.setattr(flex, "_fitted", {})


def kernel(fits):
    """A stand-in for compiled FlexAttention: overflows unless `fits(kernel_options)`; records each try."""
    tries = []

    def run(x, *, scale, kernel_options=None):
        tries.append(kernel_options)
        if not fits(kernel_options):
            raise OVERFLOW
        return x * scale
    return run, tries


def test_smaller_blocks_are_tried_in_order_and_the_fitting_ones_kept(big_gpu):
    run, tries = kernel(lambda options: options is not None and options["BLOCK_N"] <= 32)
    assert flex.call_fitting(run, CUDA, "t5", 2.0, scale=3.0) == 6.0
    assert tries == [None, flex.FLEX_BLOCKS_LARGE, flex.FLEX_BLOCKS_MEDIUM]
    tries.clear()
    assert flex.call_fitting(run, CUDA, "t5", 1.0, scale=1.0) == 1.0
    assert tries == [flex.FLEX_BLOCKS_MEDIUM]  # kept for the key: no compile is tried twice
    assert flex.call_fitting(run, CUDA, "nope", 1.0, scale=1.0) == 1.0 and tries[1] is None  # another key starts over


def test_a_kernel_that_fits_is_called_once_with_inductors_own_blocks(big_gpu):
    run, tries = kernel(lambda options: True)
    assert flex.call_fitting(run, CUDA, "alibi", 1.0, scale=2.0) == 2.0 and tries == [None]


def test_other_errors_are_not_retried(big_gpu):
    def run(x, kernel_options=None):
        raise ValueError("a shape FlexAttention refuses")
    with pytest.raises(ValueError, match="refuses"):
        flex.call_fitting(run, CUDA, "t5", 1.0)


def test_when_nothing_fits_the_error_says_so(big_gpu):
    run, tries = kernel(lambda options: False)
    with pytest.raises(RuntimeError, match="more shared memory than this GPU has.*FLEX_BLOCKS_LADDER") as caught:
        flex.call_fitting(run, CUDA, "t5", 1.0, scale=1.0)
    assert tries == list(flex.FLEX_BLOCKS_LADDER) and caught.value.__cause__ is OVERFLOW


def test_the_cpu_gets_one_try_without_options(big_gpu):
    run, tries = kernel(lambda options: options is None)
    assert flex.call_fitting(run, torch.device("cpu"), "t5", 1.0, scale=1.0) == 1.0 and tries == [None]


def test_the_overflow_is_recognised_as_inductor_and_triton_word_it():
    assert flex.out_of_shared_memory(OVERFLOW)
    assert flex.out_of_shared_memory(type("OutOfResources", (Exception,), {})("shared memory"))
    assert not flex.out_of_shared_memory(RuntimeError("CUDA out of memory"))
