import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def emulated_cuda():
    """One emulated CUDA device for the test (tests/emulated_cuda.py): device tensors are CPU tensors underneath; torch is restored after."""
    import emulated_cuda as emulation

    with emulation.emulate():
        yield emulation
