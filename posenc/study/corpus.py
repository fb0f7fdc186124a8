"""Real text with no download: the Python standard library's own .py sources, as bytes.

Every .py file of the running interpreter's standard library (site-packages, caches and
generated text excepted: `generated`) is read in sorted order and goes to train or
validation as a whole (a hash of its relative path decides), so no file straddles the
split and the split does not depend on which other files exist. `composition` says what
the text is (bytes per top-level package and split). The size and a SHA-256 of the
content identify the corpus in every result: another Python version has another standard
library, hence another hash.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from .._checks import positive_int

VOCAB_SIZE = 256  # bytes


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor  # uint8 bytes
    valid: torch.Tensor
    train_files: int
    valid_files: int
    sha256: str
    root: str

    @property
    def size(self) -> int:
        return len(self.train) + len(self.valid)

    def describe(self) -> dict:
        return {
            "corpus_root": self.root,
            "corpus_bytes": self.size,
            "corpus_train_bytes": len(self.train),
            "corpus_valid_bytes": len(self.valid),
            "corpus_train_files": self.train_files,
            "corpus_valid_files": self.valid_files,
            "corpus_sha256": self.sha256,
        }


# generated text, not code: pydoc's topic help (750 kB of English prose in one dict)
# would be a quarter of validation
GENERATED = frozenset({"pydoc_data/topics.py"})
# generated tables: the character-mapping codecs of `encodings` (about 70 files, 1.2 MB)
# are one template filled with
# 256-entry tables, so a validation codec is a near-copy of the training ones
CODEC_TABLE = b"Python Character Mapping Codec"


def generated(path: Path, relative_path: str) -> bool:
    """Generated text left out of the corpus: a GENERATED path, or a character-mapping
    codec table (by its docstring).
    """
    if relative_path in GENERATED:
        return True
    with path.open("rb") as f:
        return CODEC_TABLE in f.read(200)


def stdlib_files(root: Path | None = None) -> list[Path]:
    """Every .py file of the standard library (not site-packages, not caches, not
    `generated`), sorted by relative path.
    """
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else Path(root)
    if not root.is_dir():
        raise ValueError(f"root must be a directory of Python sources, got {root}")
    skip = {"site-packages", "dist-packages", "__pycache__"}
    files = (
        p
        for p in root.rglob("*.py")
        if not skip & set(p.relative_to(root).parts)
        and not generated(p, p.relative_to(root).as_posix())
    )
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def in_validation(relative_path: str, valid_percent: int) -> bool:
    """A stable split by file: the first byte of the path's SHA-256 decides."""
    return (
        hashlib.sha256(relative_path.encode()).digest()[0] * 100 < valid_percent * 256
    )


def top_level(relative_path: str) -> str:
    """The top-level package of a file ("json/decoder.py" -> "json"), or the module
    itself ("os.py" -> "os").
    """
    first = relative_path.split("/", 1)[0]
    return first.removesuffix(".py")


def composition(root: Path | None = None, valid_percent: int = 10) -> list[dict]:
    """Bytes and files per top-level package and split, largest first: what the corpus
    is made of.
    """
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else Path(root)
    table: dict[str, dict] = {}
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        row = table.setdefault(
            top_level(rel),
            {
                "package": top_level(rel),
                "train_bytes": 0,
                "valid_bytes": 0,
                "train_files": 0,
                "valid_files": 0,
            },
        )
        split = "valid" if in_validation(rel, valid_percent) else "train"
        row[f"{split}_bytes"] += len(path.read_bytes().rstrip(b"\n")) + 1
        row[f"{split}_files"] += 1
    return sorted(
        table.values(),
        key=lambda r: (-(r["train_bytes"] + r["valid_bytes"]), r["package"]),
    )


MIN_VALID_SHARE = 0.01  # of max_bytes, at least, in a cut corpus's validation split


def load_corpus(
    max_bytes: int | None = None, valid_percent: int = 10, root: Path | None = None
) -> Corpus:
    """Read every file in order (or until `max_bytes` of text, with at least
    MIN_VALID_SHARE of them held out, for quick tests), split by file; each file ends
    with a newline.
    """
    if max_bytes is not None:
        positive_int("max_bytes", max_bytes)
    if not 0 < positive_int("valid_percent", valid_percent) < 100:
        raise ValueError(f"valid_percent must be in [1, 99], got {valid_percent}")
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else Path(root)
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    total, valid, digest = 0, 0, hashlib.sha256()
    for path in stdlib_files(root):
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes().rstrip(b"\n") + b"\n"
        held_out = in_validation(rel, valid_percent)
        parts[held_out].append(data)
        digest.update(rel.encode() + b"\0" + data)
        total += len(data)
        valid += len(data) if held_out else 0
        # a cut corpus reads on until its validation split is not a sliver (on a
        # Python without the test suite the first megabyte held out 97 bytes)
        if max_bytes is not None and total >= max_bytes:
            if valid >= MIN_VALID_SHARE * max_bytes:
                break
    if not parts[False] or not parts[True]:
        raise ValueError(
            f"the corpus under {root} is too small to split (train "
            f"{len(parts[False])} files, validation {len(parts[True])})"
        )

    def as_tensor(chunks: list[bytes]) -> torch.Tensor:
        return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()

    return Corpus(
        as_tensor(parts[False]),
        as_tensor(parts[True]),
        len(parts[False]),
        len(parts[True]),
        digest.hexdigest(),
        str(root),
    )


def sample_windows(
    data: torch.Tensor, length: int, batch_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (inputs, targets) windows of `length` bytes, targets shifted by one, as
    int64.
    """
    positive_int("length", length)
    positive_int("batch_size", batch_size)
    if len(data) <= length + 1:
        raise ValueError(
            f"data of {len(data)} bytes is too short for windows of length {length}"
        )
    starts = torch.randint(
        0, len(data) - length - 1, (batch_size,), generator=generator
    )
    windows = torch.stack([data[s : s + length + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]
