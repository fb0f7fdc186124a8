"""Stored results of the closing chapters (chapters/results/), found where a reader has them."""

from __future__ import annotations

import importlib.metadata
import json
import os
import urllib.request
from pathlib import Path


def _installed_commit_url(name: str) -> str | None:
    """Where the file is in the repository, at the commit posenc was pip-installed from (None: not installed from git)."""
    try:
        origin = json.loads(importlib.metadata.distribution("posenc").read_text("direct_url.json") or "null")
        repo = origin["url"].removeprefix("https://github.com/").removesuffix(".git")
        return f"https://raw.githubusercontent.com/{repo}/{origin['vcs_info']['commit_id']}/chapters/results/{name}"
    except (importlib.metadata.PackageNotFoundError, TypeError, KeyError, ValueError):
        return None


def read_result(name: str, folder: str | Path = "results", required: bool = False) -> str | None:
    """The text of a stored result file, from the first place that has it.

    1. `folder` (a chapter runs in chapters/, so "results" is chapters/results/ in a clone);
    2. the folder named by the environment variable POSENC_RESULTS, if set;
    3. on Colab, where only the notebook was opened and posenc was pip-installed from the
       book's repository: the repository itself, at the very commit posenc was installed
       from, so results and code match.
    Where none has it: None, or with `required=True` a FileNotFoundError that says where
    it looked and what to do.
    """
    places = [Path(folder)] + ([Path(os.environ["POSENC_RESULTS"])] if os.environ.get("POSENC_RESULTS") else [])
    for place in places:
        if (place / name).is_file():
            return (place / name).read_text()
    url, why = _installed_commit_url(name), "posenc was not installed from the book's git repository"
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
        f"the stored result {name!r} is not available: looked in {looked}; {why}. Open the chapter from a clone of the "
        "book's repository (it reads chapters/results/), set POSENC_RESULTS to a folder holding the file, or install "
        "posenc from the repository (the chapter's first cell does) and allow network access; to make the file "
        "yourself run the entry point the chapter names (python -m posenc.study.benchmark or posenc.study.extrapolation)"
    )
