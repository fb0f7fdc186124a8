"""Every chapter runs where a reader runs it, not only where its outputs were stored.

nbval (the same pytest command, on chapters/) compares each chapter with its stored outputs on this
machine's best CPU code path with one thread. Here each chapter runs twice more:

* on the emulated CUDA device (tests/emulated_cuda.py), top to bottom: a module, buffer or index
  left on the CPU, a `.numpy()` of a device tensor or an assert that holds for the CPU's random
  stream only fails here; outputs are not compared (a GPU's kernels round otherwise);
* under nbval on another CPU code path (`ATEN_CPU_CAPABILITY` below this machine's) with two
  threads: the stored outputs must hold only what every correct machine prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chapter_runs import Config, run_chapter

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def other_capability() -> str:
    """A CPU code path other than this machine's best: AVX2 below AVX-512, the plain one below AVX2."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    return "avx2" if best.startswith("avx512") else "default"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_on_the_emulated_cuda_device(path, tmp_path):
    # the closing chapters run their GPU sections at tiny shapes here (posenc.study.presets.TINY_ENV), writing to tmp_path
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "POSENC_TINY": "1", "POSENC_RESULTS": str(tmp_path / "results")}
    run_chapter(path, Config(emulated=True, env=env))


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_matches_its_stored_outputs_on_another_cpu_code_path(path, tmp_path):
    # what is compiled on another code path goes to a cache of its own, never shared with this process's (a cache
    # that earlier runs on several code paths had filled made compiled FlexAttention give wrong numbers; conftest.py)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": other_capability(), "OMP_NUM_THREADS": "2", "PYTHONHASHSEED": "0",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--nbval", "--nbval-current-env", str(path)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )
    assert proc.returncode == 0, f"{path.name} under ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']}, 2 threads:\n{proc.stdout[-6000:]}"
