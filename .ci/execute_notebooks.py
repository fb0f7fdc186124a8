#!/usr/bin/env python3
"""Run chapter notebooks top to bottom in a fresh kernel and store their outputs.

This is the project's own command for producing the outputs that are committed
and compared by nbval:

    .venv/bin/python .ci/execute_notebooks.py                 # every chapter
    .venv/bin/python .ci/execute_notebooks.py chapters/rope.ipynb

Before running, each notebook's setup cell (tagged `posenc-setup`) is rewritten
from `_config.yml`, so the repository URL lives in one place, and pinned to the commit
whose package makes the outputs (uncommitted changes under posenc/, pyproject.toml or
chapters/results/ are refused). Cells tagged
`skip-execution` keep the outputs they have (made on a GPU). No per-cell
timestamps are recorded, so a re-run changes only what really changed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import yaml
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SETUP_TAG = "posenc-setup"


def package_commit() -> str:
    """The commit whose posenc the stored outputs are made with: the last one that changed the package or its results.

    Colab installs posenc at this commit (and posenc.study.results reads chapters/results/ there),
    so a later push cannot change what a reader runs against the stored prose. Uncommitted changes
    there would make that a lie: they are refused.
    """
    package = ["posenc", "pyproject.toml", "chapters/results"]
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *package], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    if dirty.strip():
        raise SystemExit(f"commit the package first: the stored outputs must come from a commit Colab can install\n{dirty}")
    return subprocess.run(["git", "log", "-1", "--format=%H", "--", *package], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def setup_source(commit: str, config_path: Path = ROOT / "_config.yml") -> str:
    """The setup cell every chapter starts with: install posenc where it is missing (Colab), at `commit`.

    Every chapter installs the `reference` extra (the transformers release the cross-checks
    were written against): a reader who goes on in the same runtime finds posenc installed by
    an earlier chapter, so the first one must bring what every later one needs. Written as
    ruff formats it, each line within the book's 88 characters.
    """
    repo = yaml.safe_load(config_path.read_text())["repository"]
    return (
        "# Setup: where posenc is not installed (on Colab, say), install it from the book's\n"
        "# repository at the commit whose package made the stored outputs, with the transformers\n"
        "# release its cross-checks were written against (restart the runtime first if another\n"
        "# transformers was already imported there).\n"
        "import importlib\n"
        "import importlib.util\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        f'REPOSITORY = "git+{repo["url"]}"\n'
        f'COMMIT = "{commit}"\n'
        'if importlib.util.find_spec("posenc") is None:\n'
        '    spec = f"posenc[reference] @ {REPOSITORY}@{COMMIT}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)\n'
        "    importlib.invalidate_caches()"
    )


def sync_setup_cell(nb, source: str) -> None:
    cells = [c for c in nb.cells if SETUP_TAG in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1 or nb.cells.index(cells[0]) != 1:
        raise SystemExit(f"the second cell of every chapter must be the one code cell tagged {SETUP_TAG!r}")
    cells[0].source = source


def execute(path: Path, commit: str) -> None:
    nb = nbformat.read(path, as_version=4)
    sync_setup_cell(nb, setup_source(commit))
    for cell in nb.cells:
        if cell.cell_type == "code" and "skip-execution" not in cell.metadata.get("tags", []):
            cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)
    client = NotebookClient(
        nb,
        timeout=900,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    )
    client.execute()
    nbformat.write(nb, path)


def main(argv: list[str]) -> int:
    # the same environment the tests compare under (tests/conftest.py): torch's CPU results can
    # differ in the last digits between one and two threads
    os.environ.setdefault("PYTHONHASHSEED", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    paths = [Path(a) for a in argv] or sorted((ROOT / "chapters").glob("*.ipynb"))
    commit = package_commit()
    for path in paths:
        print(f"executing {path}", flush=True)
        execute(path, commit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
