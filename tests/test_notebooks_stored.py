"""The chapters as they are stored: outputs of one fresh top-to-bottom run made by the project's command.

nbval (run on chapters/ by the same pytest command) re-executes every chapter and compares outputs,
but it silently accepts a cell whose stored execution_count is null, and it cannot tell whether the
stored outputs came from a fresh kernel. These tests check the stored files themselves.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NBCHECK = ROOT.parent / "shared" / "tools" / "nbcheck.py"
SETUP_TAG = "posenc-setup"


def _executor():
    """.ci/execute_notebooks.py as a module: its setup_source() reads the repository URL from _config.yml."""
    spec = importlib.util.spec_from_file_location("execute_notebooks", ROOT / ".ci" / "execute_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _fresh_run_cells(nb) -> list:
    """Code cells a fresh run executes: non-empty and not tagged skip-execution (outputs made elsewhere, on a GPU)."""
    return [c for c in nb.cells if c.cell_type == "code" and c.source.strip() and "skip-execution" not in _tags(c)]


@pytest.fixture(params=CHAPTERS, ids=[p.stem for p in CHAPTERS], scope="module")
def notebook(request):
    return request.param, nbformat.read(request.param, as_version=4)


def test_there_are_chapters():
    assert CHAPTERS, "no chapters/*.ipynb found"


def test_valid_nbformat(notebook):
    path, nb = notebook
    nbformat.validate(nb)
    assert nb.nbformat == 4


def test_executed_top_to_bottom_in_a_fresh_kernel(notebook):
    path, nb = notebook
    cells = _fresh_run_cells(nb)
    counts = [c.execution_count for c in cells]
    assert None not in counts, (
        f"{path.name}: {counts.count(None)} code cells have no stored execution count (never run, and nbval "
        f"would not compare them); store outputs with `.venv/bin/python .ci/execute_notebooks.py chapters/{path.name}`"
    )
    assert counts == list(range(1, len(cells) + 1)), (
        f"{path.name}: execution counts {counts} are not 1..{len(cells)}: outputs were not made by one fresh "
        f"top-to-bottom run; re-run `.venv/bin/python .ci/execute_notebooks.py chapters/{path.name}`"
    )


def test_gpu_made_cells_are_skipped_by_nbval(notebook):
    """A cell tagged skip-execution keeps outputs made elsewhere; nbval must not re-run it on the CPU."""
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "skip-execution" in _tags(cell):
            assert "nbval-skip" in _tags(cell), f"{path.name}: cell {index} is tagged skip-execution but not nbval-skip"
            assert cell.outputs, f"{path.name}: cell {index} is tagged skip-execution but stores no outputs"


def test_no_stored_errors(notebook):
    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "raises-exception" in _tags(cell):
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert not errors, f"{path.name}: cell {index} stores an error: {errors[0].ename}: {errors[0].evalue}"


def test_language_info_metadata(notebook):
    """Without language_info the book build warns 'No source code lexer found' (an error under -W)."""
    path, nb = notebook
    info = nb.metadata.get("language_info", {})
    assert info.get("name") == "python", f"{path.name}: metadata.language_info is missing or not python: {info}"
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3", f"{path.name}: kernelspec is not python3"


def test_first_cell_is_the_title(notebook):
    path, nb = notebook
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.lstrip().startswith("# "), f"{path.name}: first cell is not '# Title'"


def test_second_cell_is_the_setup_cell_from_config(notebook):
    """The setup cell is rewritten by the executor: the repository URL from _config.yml, the package's commit, the extra where needed."""
    path, nb = notebook
    tagged = [i for i, c in enumerate(nb.cells) if SETUP_TAG in _tags(c)]
    assert tagged == [1], f"{path.name}: cells tagged {SETUP_TAG!r} are {tagged}; it must be exactly the second cell"
    cell = nb.cells[1]
    assert cell.cell_type == "code", f"{path.name}: the {SETUP_TAG} cell must be a code cell"
    executor = _executor()
    commit = re.search(r"COMMIT = \"([0-9a-f]{40})\"", cell.source)
    assert commit, f"{path.name}: the setup cell installs no commit of the repository (Colab would run other code than the stored outputs')"
    expected = executor.setup_source(commit[1])
    assert cell.source == expected, (
        f"{path.name}: the setup cell differs from setup_source() (_config.yml changed since the outputs were "
        f"stored?); re-run `.venv/bin/python .ci/execute_notebooks.py chapters/{path.name}`"
    )


def test_setup_cell_installs_a_commit_of_this_history(notebook):
    """Colab installs posenc at the commit whose package made the stored outputs: it must be one of HEAD's ancestors."""
    path, nb = notebook
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    commit = re.search(r"COMMIT = \"([0-9a-f]{40})\"", nb.cells[1].source)[1]
    ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT, capture_output=True)
    assert ancestor.returncode == 0, f"{path.name}: the setup cell installs {commit}, which is not a commit of this branch's history"


def test_transformers_pin_is_one_version():
    """posenc.reference names the release the cross-checks need; pyproject's extra and requirements.txt install that one."""
    from posenc.reference import TRANSFORMERS_VERSION

    pin = f"transformers=={TRANSFORMERS_VERSION}"
    assert f'reference = ["{pin}"]' in (ROOT / "pyproject.toml").read_text()
    assert pin in (ROOT / "requirements.txt").read_text().splitlines()


def test_no_execution_timestamps(notebook):
    path, nb = notebook
    stamped = [i for i, c in enumerate(nb.cells) if "execution" in c.get("metadata", {})]
    assert not stamped, f"{path.name}: cells {stamped} carry execution timestamps in their metadata"


def test_nbcheck_reports_no_errors():
    if not NBCHECK.is_file():
        pytest.skip(f"{NBCHECK} is absent: the shared checker lives in ../shared/tools beside the repository")
    if not CHAPTERS:
        pytest.skip("no chapters yet")
    proc = subprocess.run([sys.executable, str(NBCHECK), "chapters"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"nbcheck.py chapters reports errors:\n{proc.stdout}\n{proc.stderr}"


def test_figures_fit_the_column(notebook):
    """A stored PNG wider than the site's column is shrunk in the browser until its text is unreadable."""
    import base64
    import struct

    from posenc.plotting import COLUMN_PX

    path, nb = notebook
    for index, cell in enumerate(nb.cells):
        for output in cell.get("outputs", []):
            png = output.get("data", {}).get("image/png")
            if png:
                width, height = struct.unpack(">II", base64.b64decode(png)[16:24])
                assert width <= COLUMN_PX, f"{path.name}, cell {index}: a figure {width} px wide (the column holds {COLUMN_PX}): use posenc.plotting.figure"


def _exercise_section(nb) -> tuple[str, list]:
    """The prose of the chapter's "Exercises" section and its code cells, up to the next heading of the same or a higher level."""
    heading = re.compile(r"^(#+) (?:\d+\. )?Exercises\b", re.M)
    start = next((i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and heading.search(c.source)), None)
    if start is None:
        return "", []
    found = heading.search(nb.cells[start].source)
    level = len(found.group(1))
    text, cells = [nb.cells[start].source[found.start():]], []
    for cell in nb.cells[start + 1 :]:
        if cell.cell_type == "markdown" and re.search(rf"^#{{1,{level}}} ", cell.source, re.M):
            break
        (text.append(cell.source) if cell.cell_type == "markdown" else cells.append(cell))
    return "\n".join(text), cells


def test_exercises_teach_and_their_solutions_stay_folded(notebook):
    """Two or three exercises; every solution cell is folded whole (code and output), so its printed answer shows only when asked."""
    path, nb = notebook
    text, solutions = _exercise_section(nb)
    if path.stem in ("extrapolation", "positions_beyond_a_sequence") and not text:
        pytest.skip(f"{path.name} has no exercises yet")
    assert text, f"{path.name} has no Exercises section"
    questions = len(re.findall(r"\*\*(?:Exercise )?\d\.\*\*|^\d\. ", text, re.M))
    assert 2 <= questions <= 3, f"{path.name}: {questions} exercises, want two or three"
    assert solutions, f"{path.name}: exercises without solution cells"
    for cell in solutions:
        assert "hide-cell" in _tags(cell) and "hide-input" not in _tags(cell), (
            f"{path.name}: solution cell {cell.source[:60]!r} must be tagged hide-cell (its output is the answer), has {sorted(_tags(cell))}"
        )
        assert "assert" in cell.source, f"{path.name}: solution cell {cell.source[:60]!r} does not assert its answer"
