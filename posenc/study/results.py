"""Results of the closing chapters: one folder that the entry points write to and
`read_result` reads from.

`results_dir()` is that folder: $POSENC_RESULTS where set; in a checkout of the book's
repository (posenc imported from it, as in a clone or an editable install) its
chapters/results/, where the stored runs are; elsewhere (posenc pip-installed, Colab's
/content) ./posenc_results under the working directory. `command_line()` gives the
command that writes there, for the place it runs.
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import os
import shlex
import sys
import urllib.request
from pathlib import Path

ENV = "POSENC_RESULTS"
# under the working directory, where posenc is not imported from a checkout
USER_DIR = "posenc_results"
ENTRY_POINTS = {
    "benchmark": "posenc.study.benchmark",
    "extrapolation": "posenc.study.extrapolation",
}


def _checkout_results() -> Path | None:
    """chapters/results/ of the repository posenc is imported from, if it is a checkout
    of the book.
    """
    root = Path(__file__).resolve().parents[2]
    return (
        root / "chapters" / "results"
        if (root / "chapters").is_dir() and (root / "pyproject.toml").is_file()
        else None
    )


def results_dir() -> Path:
    """The one folder results are written to and read from: $POSENC_RESULTS, the
    checkout's chapters/results, or ./posenc_results.
    """
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    return _checkout_results() or Path.cwd() / USER_DIR


def command_line(
    entry: str, preset: str, *, notebook: bool = False, extra: tuple[str, ...] = ()
) -> str:
    """The command that runs `entry` ("benchmark" or "extrapolation") with `preset` and
    writes where `read_result` reads.

    The folder is given relative to the working directory where it lies below it (so the
    printed command is the same on every machine with the same layout); `notebook=True`
    prefixes "!" for a notebook cell.
    """
    if entry not in ENTRY_POINTS:
        raise ValueError(
            f"entry must be one of {', '.join(map(repr, ENTRY_POINTS))}; got {entry!r}"
        )
    if not isinstance(preset, str) or not preset:
        raise TypeError(f"preset must be a non-empty str; got {preset!r}")
    if not isinstance(extra, tuple) or not all(isinstance(e, str) for e in extra):
        raise TypeError("extra must be a tuple of str")
    folder = results_dir().resolve()
    try:
        shown = os.path.relpath(folder, Path.cwd().resolve())
        shown = folder.as_posix() if shown.startswith("..") else Path(shown).as_posix()
    except ValueError:  # another drive (Windows)
        shown = folder.as_posix()
    words = [
        "python",
        "-m",
        ENTRY_POINTS[entry],
        "--preset",
        preset,
        "--out",
        shown,
        *extra,
    ]
    return ("!" if notebook else "") + " ".join(shlex.quote(w) for w in words)


def _installed_commit_url(name: str) -> str | None:
    """Where the file is in the repository, at the commit posenc was pip-installed from
    (None: not installed from git).
    """
    try:
        origin = json.loads(
            importlib.metadata.distribution("posenc").read_text("direct_url.json")
            or "null"
        )
        repo = origin["url"].removeprefix("https://github.com/").removesuffix(".git")
        commit = origin["vcs_info"]["commit_id"]
        return (
            f"https://raw.githubusercontent.com/{repo}/{commit}/chapters/results/{name}"
        )
    except (importlib.metadata.PackageNotFoundError, TypeError, KeyError, ValueError):
        return None


def read_result(
    name: str, folder: str | Path | None = None, required: bool = False
) -> str | None:
    """The text of a result file, from the first place that has it.

    1. `folder`, if given; 2. `results_dir()`: $POSENC_RESULTS, the checkout's
    chapters/results, or ./posenc_results (where the entry points write by default: a
    run made here is found here); 3. the checkout's chapters/results (the stored runs),
    if there is a checkout; 4. on Colab, where only the notebook was opened and posenc
    was pip-installed from the book's repository: the repository itself, at the very
    commit posenc was installed from, so results and code match. Where none has it:
    None, or with `required=True` a FileNotFoundError that says where it looked and what
    to do.
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a file name (no folder); got {name!r}")
    if folder is not None and not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"folder must be a path or None; got {type(folder).__name__}")
    places = list(
        dict.fromkeys(
            [
                *([Path(folder)] if folder is not None else []),
                results_dir(),
                *filter(None, [_checkout_results()]),
            ]
        )
    )
    for place in places:
        if (place / name).is_file():
            return (place / name).read_text()
    url, why = (
        _installed_commit_url(name),
        "posenc was not installed from the book's git repository",
    )
    if url is not None:
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return response.read().decode()
        except OSError as exc:  # no network, or no such file at that commit
            why = f"fetching {url} failed ({exc})"
    if not required:
        return None
    looked = ", ".join(str(p / name) for p in places)
    raise FileNotFoundError(
        f"the stored result {name!r} is not available: looked in {looked}; {why}. "
        "Open the chapter from a clone of the "
        "book's repository (it reads chapters/results/), set POSENC_RESULTS to a "
        "folder holding the file, or install "
        "posenc from the repository (the chapter's first cell does) and allow network "
        "access; to make the file "
        "yourself run the entry point the chapter names (python -m "
        "posenc.study.benchmark or posenc.study.extrapolation)"
    )


def progress(done: int, total: int, text: str) -> None:
    width = 30
    filled = round(width * done / total) if total else width
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text:<40}",
        end="" if done < total else "\n",
        file=sys.stderr,
        flush=True,
    )


def append_rows(path: Path, columns: list[str], rows: list[dict]) -> None:
    """Append rows to a CSV (the header first where the file is new), missing fields
    empty.
    """
    new = not path.exists()
    with path.open("a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        if new:
            writer.writeheader()
        writer.writerows({k: r.get(k, "") for k in columns} for r in rows)


def sort_rows(path: Path, key) -> None:
    """Sort a CSV's rows in place by `key` (stable: rows with equal keys keep their
    order).
    """
    if not path.exists():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns, rows = reader.fieldnames, list(reader)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(sorted(rows, key=key))  # stable: a run's rows keep their order
