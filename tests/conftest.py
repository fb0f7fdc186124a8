import os
import tempfile

import pytest
import torch

# torch.compile's on-disk cache, fresh for each test process and the kernels it starts: a stale cache left by another
# run (another CPU code path, another build) once made compiled FlexAttention return wrong numbers here
if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):  # unset or empty (empty would put the cache in the working directory)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="posenc-inductor-")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def emulated_cuda():
    """One emulated CUDA device for the test (tests/emulated_cuda.py): device tensors are CPU tensors underneath; torch is restored after."""
    import emulated_cuda as emulation

    with emulation.emulate():
        yield emulation
