"""Every chapter top to bottom as plain Python: the chapters stage of posenc.study.gpu.

A chapter's notebook is read as JSON with the standard library (no nbformat), its code
cells joined into one script (shell and magic lines left out; `display` printing where
IPython is missing; figures closed when shown), and run in a process of its own with a
time cap, the chapter's folder as working directory, its results read from and written
to a folder of its own (never the checkout's chapters/results). DIR/chapters.json gains
each chapter's status (passed, failed with the failing cell and the error's last lines,
timed out, or skipped for lack of time) as soon as it ends.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .gpu import write_json

CHAPTERS_DIR = Path(__file__).resolve().parents[2] / "chapters"
# cheapest first; the closing two last, at tiny size
ORDER = (
    "why_position",
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "t5",
    "shaw",
    "sliding_window",
    "rope_scaling",
    "yarn",
    "positions_beyond_a_sequence",
    "todays_models",
    "benchmark",
    "extrapolation",
)
CLOSING = ("benchmark", "extrapolation")
CHAPTER_CAP_S = 120.0  # one chapter's time, at most
MIN_CHAPTER_S = 10.0

PROLOGUE = """\
# written by posenc.study.gpu_chapters: the chapter's code cells, run as plain Python
import os as _os, sys as _sys, threading as _threading, time as _time
_parent = _os.getppid()
def _watch():
    while True:
        _time.sleep(1.0)
        if _os.getppid() != _parent:
            _os._exit(3)
_threading.Thread(target=_watch, daemon=True).start()
try:
    from IPython.display import display
except ImportError:  # no IPython here: display prints, as a notebook shows the object
    def display(*objects, **kwargs):
        for _object in objects:
            print(_object)
import builtins as _builtins
_builtins.display = display
import matplotlib as _matplotlib
_matplotlib.use("Agg")
import matplotlib.pyplot as _plt
_plt.show = lambda *args, **kwargs: _plt.close("all")
"""


def chapter_script(notebook: Path) -> tuple[str, list[int]]:
    """The chapter's code cells as one script, and the cell (index in the notebook) of
    each of its lines (0 for the prologue)."""
    cells = json.loads(notebook.read_text())["cells"]
    lines, owner = PROLOGUE.splitlines(), [0] * len(PROLOGUE.splitlines())
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = cell["source"]
        source = "".join(source) if isinstance(source, list) else source
        code = [f"# --- cell {index}"]
        for line in source.splitlines():
            if re.match(r"\s*[!%]", line):  # a shell or magic line: not Python
                line = re.sub(r"[!%].*", "pass  # (shell or magic line left out)", line)
            elif re.match(r"\s*from IPython\.display import display\s*$", line):
                # the prologue's display: IPython's where it is installed, else print
                line = re.sub(r"from.*", "pass  # (display: see the prologue)", line)
            code.append(line)
        lines += code
        owner += [index] * len(code)
    return "\n".join(lines) + "\n", owner


def _failing_cell(log: str, script: Path, owner: list[int]) -> int | None:
    found = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', log)
    if not found:
        return None
    line = int(found[-1])
    return owner[line - 1] if 0 < line <= len(owner) else None


def run_chapters(args, out: Path, work: Path) -> dict:
    """Run the chapters in ORDER (those asked for), writing DIR/chapters.json after
    each."""
    folder = Path(args.chapters_dir) if args.chapters_dir else CHAPTERS_DIR
    names = [n for n in ORDER if (folder / f"{n}.ipynb").exists()]
    names += sorted(p.stem for p in folder.glob("*.ipynb") if p.stem not in ORDER)
    if args.chapters:
        names = [n for n in names if n in args.chapters]
    results = work / "chapter_results"
    results.mkdir(parents=True, exist_ok=True)
    # the benchmark chapter shows the benchmark stage's run
    for name in out.glob("benchmark_colab*"):
        shutil.copy(name, results / name.name)
    deadline = time.time() + args.budget - 5.0
    report = {"chapters": {}, "results_dir": str(results)}
    earlier = out / "chapters.json"
    if args.resume and earlier.exists():  # run again: the chapters that ran are kept
        ran = json.loads(earlier.read_text())["chapters"]
        report["chapters"] = {n: e for n, e in ran.items() if e["status"] != "skipped"}
    lock = threading.Lock()

    def record(name: str, entry: dict) -> None:
        with lock:
            report["chapters"][name] = entry
            ordered = {
                n: report["chapters"][n] for n in names if n in report["chapters"]
            }
            write_json(out / "chapters.json", {**report, "chapters": ordered})
        print(
            f"chapter {name}: {entry['status']} in {entry.get('seconds')} s", flush=True
        )

    def run_one(name: str) -> None:
        left = deadline - time.time()
        if left < MIN_CHAPTER_S:
            record(
                name, {"status": "skipped", "reason": f"no time left ({left:.0f} s)"}
            )
            return
        script, owner = chapter_script(folder / f"{name}.ipynb")
        path = work / f"chapter_{name}.py"
        path.write_text(script)
        log = work / f"chapter_{name}.log"
        tiny = args.tiny or name in CLOSING
        env = {
            **os.environ,
            "POSENC_RESULTS": str(results),
            "PYTHONHASHSEED": "0",
            **({"POSENC_TINY": "1"} if tiny else {}),
        }
        with log.open("w") as sink:
            code, seconds = _run_logged(
                path, folder, env, min(CHAPTER_CAP_S, left), sink
            )
        text = log.read_text(errors="replace")
        entry = {"seconds": seconds, "tiny": tiny}
        if code == 0:
            entry["status"] = "passed"
        elif code is None:
            entry["status"] = "timed out"
            entry["reason"] = f"stopped after {seconds:.0f} s, its time cap"
        else:
            entry["status"] = "failed"
            entry["cell"] = _failing_cell(text, path, owner)
            entry["error"] = text.strip().splitlines()[-15:]
        record(name, entry)

    todo = [n for n in names if n not in report["chapters"]]
    # chapters share the GPU, not their timings: `jobs` of them run side by side
    with ThreadPoolExecutor(max_workers=max(1, args.jobs or 1)) as pool:
        list(pool.map(run_one, todo))
    entries = report["chapters"].values()
    passed = sum(e["status"] == "passed" for e in entries)
    left = sum(e["status"] == "skipped" for e in entries)
    note = {"status": "done", "passed": passed, "chapters": len(names)}
    if left:  # run the stage again (--resume) for the chapters left
        note.update(
            status="incomplete", reason=f"{left} chapters left for lack of time"
        )
    return note


def _run_logged(path: Path, cwd: Path, env: dict, timeout: float, sink) -> tuple:
    """Run the script, its output in `sink`: (return code, None if stopped; s)."""
    start = time.perf_counter()
    with subprocess.Popen(
        [sys.executable, str(path)],
        cwd=cwd,
        env=env,
        stdout=sink,
        stderr=subprocess.STDOUT,
    ) as child:
        try:
            code = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            code = None
    return code, round(time.perf_counter() - start, 1)
