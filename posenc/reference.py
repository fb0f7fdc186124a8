"""The transformers release the chapters' cross-checks were written against, imported
only where it is that release.

The cross-checks call transformers' own functions, some of them private, which move
between releases; pyproject's `reference` extra and requirements.txt pin the same
version (a test checks it).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

TRANSFORMERS_VERSION = "5.23.0"


def transformers_for_cross_checks() -> ModuleType | None:
    """transformers where the pinned release is installed; else None, after printing why
    the cross-checks are skipped."""
    try:
        # transformers imports tqdm, which warns in a notebook without ipywidgets
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformers = importlib.import_module("transformers")
    except ImportError:
        print(
            "transformers is not installed; the cross-checks need "
            f"{TRANSFORMERS_VERSION} and are skipped "
            f"(pip install transformers=={TRANSFORMERS_VERSION} runs them)"
        )
        return None
    if transformers.__version__ != TRANSFORMERS_VERSION:
        print(
            f"found transformers {transformers.__version__}; the cross-checks need "
            f"{TRANSFORMERS_VERSION} and are skipped"
        )
        return None
    print(f"found transformers {TRANSFORMERS_VERSION}: the cross-checks run")
    return transformers
