"""The extrapolation study's weight cache: every trained model's weights, kept outside
the repository, so that an ablation evaluates them again without training.

`WeightCache` keeps the state dicts of a run's models (the trained model and, for the
RoPE run, each fine-tuned extension) in root/<preset>/<key>/<run>-<seed>/<label>.pt.
The key is a digest of the preset's configuration, the torch version and posenc's
source (runinfo.source_sha256): a change to any of them makes new entries instead of
reusing stale ones. A run's entry counts once its marker file is written, after every
file of it, so a run killed while saving leaves nothing that is read.

The command (`python -m posenc.study.extrapolation`) keeps its cache in $POSENC_WEIGHTS,
else in $XDG_CACHE_HOME/posenc/extrapolation (~/.cache/posenc/extrapolation); a folder
inside the book's repository is refused, so that no weights are committed by mistake.
Loading a state dict gives back the tensors that were saved: an evaluation from the
cache is the evaluation of the trained model, bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict
from pathlib import Path

import torch

from .extrapolation_presets import Preset
from .runinfo import source_sha256

ENV = "POSENC_WEIGHTS"
REPOSITORY = Path(__file__).resolve().parents[2]
MARKER = "complete.json"


def default_root() -> Path:
    """$POSENC_WEIGHTS, else $XDG_CACHE_HOME (or ~/.cache) / posenc / extrapolation."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "posenc" / "extrapolation"


def _inside_repository(path: Path) -> bool:
    if not (REPOSITORY / "pyproject.toml").is_file():
        return False  # posenc installed elsewhere: no repository to protect
    try:
        path.resolve().relative_to(REPOSITORY)
    except ValueError:
        return False
    return True


class WeightCache:
    """Saved model weights of a study's runs, under `root` (default_root() if None).

    Raises:
        ValueError: `root` lies inside the book's repository.
    """

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = default_root() if root is None else Path(root).expanduser()
        if _inside_repository(self.root):
            raise ValueError(
                f"the weight cache must lie outside the repository, got {self.root} "
                f"(inside {REPOSITORY}); set ${ENV} or pass another folder"
            )
        self._source: str | None = None

    def key(self, preset: Preset) -> str:
        """What the weights depend on: the preset (its run-side fields: not `jobs`),
        the torch version and posenc's source."""
        if self._source is None:
            self._source = source_sha256()
        config = {k: v for k, v in asdict(preset).items() if k != "jobs"}
        text = json.dumps(
            [config, torch.__version__, self._source], sort_keys=True, default=str
        )
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def folder(self, preset: Preset, run: str, seed: int) -> Path:
        name = f"{run.replace(':', '_')}-{seed}"
        return self.root / preset.name / self.key(preset) / name

    def save(self, preset: Preset, run: str, seed: int, models: dict) -> Path:
        """Write each model's state dict (label -> module), then the marker."""
        folder = self.folder(preset, run, seed)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for label, model in models.items():
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            torch.save(state, folder / f"{label}.pt")
        marker = {"run": run, "seed": seed, "labels": sorted(models)}
        (folder / MARKER).write_text(json.dumps(marker) + "\n")
        return folder

    def load(self, preset: Preset, run: str, seed: int) -> dict | None:
        """Label -> state dict of a run's models, or None where the run has no
        complete entry."""
        folder = self.folder(preset, run, seed)
        if not (folder / MARKER).is_file():
            return None
        labels = json.loads((folder / MARKER).read_text())["labels"]
        return {
            label: torch.load(folder / f"{label}.pt", weights_only=True)
            for label in labels
        }
