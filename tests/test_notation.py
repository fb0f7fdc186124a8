"""The chapters follow book/notation.md where following it can be checked mechanically.

Each rule is a spelling that the notation page forbids and the spelling it asks for. A match
in a chapter's prose (markdown cells, math included) fails with the chapter, the spelling
found and the one to use.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))

# (pattern, what to write instead)
RULES = [
    (r"L_\{?\\(?:mathrm|rm)\{?\s*train|L_\{train\}|L_\\text\{train\}|L_\{\\text\{tr\}\}", r"L_{\text{train}}"),
    (r"L_\{?\\(?:mathrm|rm)\{?\s*test|L_\{test\}|L_\\text\{test\}", r"L_{\text{test}}"),
    (r"d_\{\\?(?:text\{|mathrm\{)?head|d_\{k\}|d_k\b", "d_h (a head's width)"),
    (r"\bH\s*\\times\s*W\b|\bH\s*\\cdot\s*W\b", r"n_{\text{rows}} \times n_{\text{cols}} (H is the number of heads)"),
    (r"\br\s*=\s*j\s*-\s*i\b|\br\s*=\s*n\s*-\s*m\b|\br\s*=\s*k\s*-\s*q\b", "r = i - j (the offset is query minus key)"),
    (r"\\begin\{pmatrix\}\s*\\cos\s*\\?\w*\s*&\s*\\sin", r"R(\theta) with -\sin in the first row (the notation page's rotation, not its transpose)"),
]


def prose(path: Path) -> str:
    nb = nbformat.read(path, as_version=4)
    return "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")


def test_rules_catch_what_they_forbid():
    forbidden = [r"$L_{train}$", r"$L_{\mathrm{train}}$", r"$d_{\text{head}}$", r"$H \times W$ grid", r"$r = j - i$", r"$\begin{pmatrix} \cos\theta & \sin\theta \\ -\sin\theta & \cos\theta \end{pmatrix}$"]
    allowed = r"$L_{\text{train}}$, $d_h$, $n_{\text{rows}} \times n_{\text{cols}}$, $r = i - j$, $\begin{pmatrix} \cos\theta & -\sin\theta \\ \sin\theta & \cos\theta \end{pmatrix}$"
    for text in forbidden:
        assert any(re.search(p, text) for p, _ in RULES), text
    assert not any(re.search(p, allowed) for p, _ in RULES)


def test_notation_page_states_each_rule():
    page = (ROOT / "book" / "notation.md").read_text()
    for symbol in (r"L_{\text{train}}", r"r = i - j", r"n_{\text{rows}} \times n_{\text{cols}}", r"R(\theta)", "$d_h$"):
        assert symbol in page, symbol


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_follows_the_notation(chapter):
    text = prose(chapter)
    found = [(m.group(0), use) for pattern, use in RULES for m in re.finditer(pattern, text)]
    assert not found, f"{chapter.name}: " + "; ".join(f"{got!r}, write {use}" for got, use in found)


def test_the_landing_page_names_every_registered_scheme():
    """book/intro.md lists posenc.SCHEMES by name: a scheme registered later must appear there too."""
    import posenc

    page = (ROOT / "book" / "intro.md").read_text()
    listed = re.search(r"The registry names \(`posenc.SCHEMES`: (.*?)\)", page, re.S)
    assert listed, "book/intro.md no longer lists the registry names"
    assert set(re.findall(r"`(\w+)`", listed.group(1))) == set(posenc.SCHEMES)
