"""Every chapter run as a Colab learner runs it: the notebook alone, in an empty folder, on an installed posenc.

posenc is built into a wheel and installed (not editable) into a folder of its own, which comes first on
the kernel's path; the notebook is copied into an empty directory, so nothing of the repository is
reachable from it. The stored results the closing chapters plot are given through POSENC_RESULTS, the
folder read_result looks in besides the notebook's own results/ (on Colab it fetches them from the
repository at the installed commit instead: there is no network here). Outputs are not compared (nbval
does that in the repository); the chapter must run top to bottom, on the installed copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A non-editable copy of posenc, built from this checkout into a wheel and installed into its own folder."""
    work = tmp_path_factory.mktemp("posenc-installed")
    source = work / "source"  # a copy: building in the checkout would leave build/ behind in it
    shutil.copytree(ROOT / "posenc", source / "posenc", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(work / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    wheel = next((work / "wheel").glob("posenc-*.whl"))
    site = work / "site"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    shutil.rmtree(work / "wheel")
    return site


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_runs_outside_the_repository(chapter, installed, tmp_path, monkeypatch):
    shutil.copy(chapter, tmp_path / chapter.name)
    nb = nbformat.read(tmp_path / chapter.name, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(  # the chapter ran on the installed copy, not on the checkout
        "import posenc as _posenc, pathlib as _pathlib\n"
        f"assert _pathlib.Path(_posenc.__file__).is_relative_to({str(installed)!r}), _posenc.__file__"
    ))
    monkeypatch.setenv("PYTHONPATH", str(installed))
    monkeypatch.setenv("POSENC_RESULTS", str(ROOT / "chapters" / "results"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
