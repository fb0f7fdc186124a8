"""Stored results of the closing chapters (chapters/results/), found where a reader has them."""

from __future__ import annotations

import importlib.metadata
import json
import urllib.request
from pathlib import Path


def read_result(name: str, folder: str | Path = "results") -> str | None:
    """The text of a stored result file, or None where there is none.

    In a clone the file is read from `folder` (a chapter runs in chapters/, so
    "results" is chapters/results/). On Colab, where only the notebook was
    opened, posenc was pip-installed from the book's repository: the file is
    fetched from the very commit it was installed from, so results and code match.
    """
    local = Path(folder) / name
    if local.exists():
        return local.read_text()
    try:
        origin = json.loads(importlib.metadata.distribution("posenc").read_text("direct_url.json"))
        repo = origin["url"].removeprefix("https://github.com/").removesuffix(".git")
        url = f"https://raw.githubusercontent.com/{repo}/{origin['vcs_info']['commit_id']}/chapters/results/{name}"
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.read().decode()
    except (ImportError, OSError, TypeError, KeyError, ValueError):  # not installed from git, no network, or no such file
        return None
