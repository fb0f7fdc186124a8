"""Remake chapters/results/positions_beyond_a_sequence_seeds.csv: the chapter's trained
numbers under other draws and other machines.

The chapter positions_beyond_a_sequence trains small models (sections 6.2, 6.3 and 7.4)
and asserts only what held in every run of this table, which it reads and shows. This
script reruns the chapter top to bottom (tests/chapter_runs.py) under eight seed offsets
(every torch.manual_seed of the chapter offset by 0..7: other initial weights, the same
data), and the first draw again on the AVX2 CPU code path, with 2 threads and on the
emulated CUDA device; it collects the numbers the chapter's cells computed and writes
them, one row per number, with a JSON file that records how they were made:

    OMP_NUM_THREADS=1 .venv/bin/python tests/positions_beyond_seeds.py [--resume]

A run whose cells fail is reported and left out of the table. While the runs go on, the
rows are kept in a file of the temporary directory (the chapter's own cells read the
stored table, which is replaced only at the end); --resume keeps the runs that file
already holds and makes only the others.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))

from chapter_runs import Config, run_chapter  # noqa: E402

CHAPTER = ROOT / "chapters" / "positions_beyond_a_sequence.ipynb"
OUT = ROOT / "chapters" / "results" / "positions_beyond_a_sequence_seeds"
PARTIAL = Path(tempfile.gettempdir()) / "positions_beyond_a_sequence_seeds.partial.csv"
MARK = "POSITIONS_BEYOND_SEEDS "
CONFIGS = [Config(seed_offset=s) for s in range(8)] + [
    Config(capability="avx2"),
    # threads that wait passively: on a busy machine, spinning threads slow a run by
    # an order of magnitude (the numbers do not change)
    Config(threads=2, env={"OMP_WAIT_POLICY": "PASSIVE"}),
    Config(emulated=True),
]

# the last cell of each run: the chapter's trained tables, as (table, row, column, value)
EPILOGUE = f"""
import json as _json
_rows = []
for _name, _row in extrapolation.iterrows():
    _rows += [("extrapolation", _name, _column, float(_v)) for _column, _v in _row.items()]
for _name, _by_row in row_accuracy.items():
    _rows += [
        ("rows of 16 x 16", _name, str(_y), float(_v))
        for _y, _v in enumerate(_by_row.tolist())
        if _y > 0
    ]
for _name, _row in fixes_table.iterrows():
    _rows += [("fixes", _name, _column, float(_v)) for _column, _v in _row.items()]
_rows += [("retrieval", "accuracy", _name, float(_v)) for _name, _v in retrieval.items()]
print({MARK!r} + _json.dumps(_rows))
"""


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()

    dirty = git("status", "--porcelain", "--", "posenc", str(CHAPTER))
    return git("rev-parse", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def _write_csv(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["run", "table", "row", "column", "value"])
        writer.writerows((*row[:4], f"{float(row[4]):.6f}") for row in rows)


def _write(rows, failed) -> dict:
    import torch

    _write_csv(OUT.with_suffix(".csv"), rows)
    made = {row[0] for row in rows}
    meta = {
        "chapter": str(CHAPTER.relative_to(ROOT)),
        "made": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "how": (
            "from a clone of the repository: OMP_NUM_THREADS=1 python "
            "tests/positions_beyond_seeds.py, which reruns the chapter top to bottom "
            "under each run's configuration (tests/chapter_runs.py) and collects the "
            "numbers its cells computed"
        ),
        "runs": [c.name() for c in CONFIGS if c.name() in made],
        "failed": failed,
        "seed offsets": "added to every torch.manual_seed of the chapter: other "
        "initial weights, the same data",
        "emulated": "the emulated CUDA device of tests/emulated_cuda.py runs CPU "
        "kernels; a real GPU has not been measured",
        "commit": _commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": _cpu(),
    }
    OUT.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resume", action="store_true", help="keep the stored runs")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    rows, failed = [], {}
    if args.resume and PARTIAL.is_file():
        with open(PARTIAL, newline="") as f:
            rows = [tuple(row) for row in list(csv.reader(f))[1:]]
    for config in CONFIGS:
        if any(row[0] == config.name() for row in rows):
            continue
        print(f"running on {config.name()}", file=sys.stderr, flush=True)
        try:
            nb = run_chapter(
                CHAPTER, config, timeout=args.timeout, epilogue=EPILOGUE, keep_going=True
            )
        except Exception as error:  # a kernel that died or a cell that timed out
            failed[config.name()] = [f"{type(error).__name__}: {error}"[:500]]
            continue
        errors = [
            f"cell {i}: {o.ename}: {o.evalue}"
            for i, cell in enumerate(nb.cells[:-1])
            for o in cell.get("outputs", [])
            if o.output_type == "error"
        ]
        last = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []))
        if errors or MARK not in last:
            failed[config.name()] = errors or ["no numbers printed"]
            continue
        found = json.loads(last.split(MARK, 1)[1])
        rows += [(config.name(), *row) for row in found]
        _write_csv(PARTIAL, rows)
    meta = _write(rows, failed)
    for name, errors in failed.items():
        print(f"FAILED on {name}:", *errors, sep="\n  ")
    print(f"{len(rows)} numbers from {len(meta['runs'])} runs -> {OUT}.csv")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
