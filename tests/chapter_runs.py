"""Run a chapter top to bottom somewhere else than where its outputs were stored, and see what changes.

A chapter must run on every correct machine: another CPU code path (`ATEN_CPU_CAPABILITY`),
another thread count, a GPU (here the emulated CUDA device of tests/emulated_cuda.py), and
another draw of its random initialisations. `run_chapter` executes one chapter under such a
configuration with nbclient (outputs are not compared: the asserts in its cells are the test);
the command line runs a chapter under several and prints, cell by cell, the text outputs that
differ between them, which is how the margins of the chapters' asserts on trained numbers are
measured:

    .venv/bin/python tests/chapter_runs.py chapters/learned.ipynb --seed-offsets 0 1 2 --emulated --capability avx2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

TESTS = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Config:
    """Where a chapter runs: the emulated CUDA device or the CPU, a CPU capability, a thread count, a seed offset."""

    emulated: bool = False
    capability: str | None = None  # ATEN_CPU_CAPABILITY: "default", "avx2", "avx512"; None: the machine's best
    threads: int = 1
    seed_offset: int = 0  # added to every torch.manual_seed: other initialisations, the same data
    env: dict = field(default_factory=dict, compare=False)

    def name(self) -> str:
        parts = ["cuda (emulated)" if self.emulated else "cpu", self.capability or "best", f"{self.threads} thread(s)"]
        return ", ".join(parts + ([f"seed +{self.seed_offset}"] if self.seed_offset else []))


def _prologue(config: Config) -> str:
    lines = [f"# run on {config.name()}"]  # always one cell, so cell numbers agree between configurations
    if config.emulated:
        lines += [f"import sys; sys.path.insert(0, {str(TESTS)!r})", "import emulated_cuda", "emulated_cuda.install()"]
    if config.seed_offset:
        lines += [
            "import torch",
            "_seed = torch.manual_seed",
            f"torch.manual_seed = lambda seed: _seed(seed + {config.seed_offset})  # other initialisations, the same data",
        ]
    return "\n".join(lines)


def run_chapter(path: Path, config: Config = Config(), timeout: int = 900, epilogue: str | None = None, keep_going: bool = False):
    """Execute the chapter at `path` under `config`; returns the executed notebook.

    A failing cell raises CellExecutionError, unless `keep_going` (then its error is in its outputs).
    `epilogue`, a cell of code run last, can print the quantities the chapter's asserts bound.
    """
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell(_prologue(config)))  # after the title and the setup cell
    if epilogue:
        nb.cells.append(nbformat.v4.new_code_cell(epilogue))
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": str(config.threads), "MPLBACKEND": "agg", **config.env}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if config.capability:
        env["ATEN_CPU_CAPABILITY"] = config.capability
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            record_timing=False, allow_errors=keep_going)
    client.execute(env=env)
    return nb


def _texts(cell) -> str:
    out = []
    for o in cell.get("outputs", []):
        if o.output_type == "stream":
            out.append(o.text)
        elif "data" in o and "text/plain" in o.data and not o.data["text/plain"].startswith("<Figure"):
            out.append(o.data["text/plain"])
        elif o.output_type == "error":
            out.append(f"{o.ename}: {o.evalue}")
    return "".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapter", type=Path)
    parser.add_argument("--seed-offsets", type=int, nargs="*", default=[0])
    parser.add_argument("--emulated", action="store_true", help="also run on the emulated CUDA device (seed offset 0)")
    parser.add_argument("--capability", nargs="*", default=[], help="also run under these ATEN_CPU_CAPABILITY values")
    parser.add_argument("--threads", type=int, nargs="*", default=[], help="also run with these thread counts")
    parser.add_argument("--json", type=Path, help="write every configuration's cell outputs here")
    parser.add_argument("--epilogue", type=Path, help="a file of code run as a last cell: print what the asserts bound")
    parser.add_argument("--keep-going", action="store_true", help="run every cell even after one fails (errors are printed as outputs)")
    args = parser.parse_args(argv)
    configs = [Config(seed_offset=s) for s in args.seed_offsets]
    configs += [Config(emulated=True)] if args.emulated else []
    configs += [Config(capability=c) for c in args.capability] + [Config(threads=t) for t in args.threads]
    epilogue = args.epilogue.read_text() if args.epilogue else None
    outputs = {}
    for config in configs:
        print(f"running {args.chapter.name} on {config.name()}", file=sys.stderr, flush=True)
        try:
            nb = run_chapter(args.chapter, config, epilogue=epilogue, keep_going=args.keep_going)
            failed = None
        except CellExecutionError as error:
            nb, failed = None, "\n".join(str(error).strip().splitlines()[-25:])
        outputs[config.name()] = {"failed": failed, "cells": [] if nb is None else [_texts(c) if c.cell_type == "code" else "" for c in nb.cells]}
    if args.json:
        args.json.write_text(json.dumps(outputs, indent=1))
    failed = {name: run["failed"] for name, run in outputs.items() if run["failed"]}
    for name, error in failed.items():
        print(f"FAILED on {name}: {error}")
    ran = {name: run["cells"] for name, run in outputs.items() if name not in failed}
    for index in range(min(map(len, ran.values()), default=0)):
        if len({cells[index] for cells in ran.values()}) > 1:
            print(f"\n=== cell {index} differs")
            for name, cells in ran.items():
                print(f"--- {name}\n{cells[index].rstrip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
