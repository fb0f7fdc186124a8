"""Code fits the book's content column: 88 characters, in the package (which chapters print) and in every
chapter's code cells, formatted by ruff as pyproject.toml configures it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 88
RUFF = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")


def long_lines(text: str) -> list[tuple[int, int]]:
    return [(n, len(line)) for n, line in enumerate(text.splitlines(), 1) if len(line) > WIDTH]


@pytest.mark.parametrize("path", sorted((ROOT / "posenc").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_package_lines_fit_the_column(path):
    assert not long_lines(path.read_text()), f"{path.relative_to(ROOT)}: lines (number, length) over {WIDTH}"


@pytest.mark.parametrize("path", sorted((ROOT / "posenc").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_package_modules_stay_readable(path):
    """A module a reader can take in: at most 400 lines (split by idea beyond that)."""
    lines = len(path.read_text().splitlines())
    assert lines <= 400, f"{path.relative_to(ROOT)} has {lines} lines"


@pytest.mark.parametrize("path", sorted((ROOT / "chapters").glob("*.ipynb")), ids=lambda p: p.stem)
def test_chapter_code_cells_fit_the_column(path):
    nb = nbformat.read(path, as_version=4)
    found = {i: long_lines(c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    found = {i: lines for i, lines in found.items() if lines}
    assert not found, f"{path.name}: code cells with lines over {WIDTH} (cell: [(line, length)]): {found}"


@pytest.mark.skipif(not Path(RUFF).exists(), reason="ruff is not installed (requirements.txt pins it)")
def test_ruff_format_leaves_the_package_and_the_chapters_as_they_are():
    checked = subprocess.run([RUFF, "format", "--check", "posenc", "chapters"], cwd=ROOT, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
