"""The prepared GPU command (issue 30): `python -m posenc.study.gpu --minutes M --out DIR`, end to end on the
emulated CUDA device at tiny size, in Pythons where nbclient, nbformat, ipykernel and IPython cannot be imported
(the GPU machine has none of them), stopped by a kill after and during its stages.

Every Python the command starts gets tests/emulated_cuda.py and the import block from a sitecustomize module on
PYTHONPATH, as the GPU machine's Python would get its CUDA. No test looks at how long anything took.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import posenc.study.benchmark as bench
from posenc.study import gpu, gpu_chapters

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
SITE = '''\
import importlib.abc, os, sys
BLOCKED = {"nbclient", "nbformat", "ipykernel", "IPython"}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (not on the GPU machine)")
        return None
sys.meta_path.insert(0, _Block())
sys.path.insert(0, os.environ["EMULATE_CUDA_FROM"])
import emulated_cuda
emulated_cuda.install()
'''


def notebook(*cells: str) -> dict:
    return {"cells": [{"cell_type": "markdown", "source": "# A chapter", "metadata": {}}]
            + [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None} for c in cells],
            "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    """A sitecustomize that blocks Jupyter and emulates CUDA, two chapters, and the environment to run with them."""
    base = tmp_path_factory.mktemp("gpu_machine")
    (base / "site").mkdir()
    (base / "site" / "sitecustomize.py").write_text(SITE)
    chapters = base / "chapters"
    chapters.mkdir()
    ok = notebook(
        "!pip install -q posenc\n%matplotlib inline\nimport torch\nimport posenc\ndevice = posenc.default_device()",
        "x = torch.ones(3, device=device)\nassert device.type == 'cuda', device\ndisplay(x.sum())\n"
        "from IPython.display import display\ndisplay('shown')",  # as learned, sinusoidal do
        "try:\n    import nbclient\nexcept ImportError:\n    pass\nelse:\n    raise AssertionError('nbclient')\n"
        "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('chapter done')",
    )
    (chapters / "ok.ipynb").write_text(json.dumps(ok))
    (chapters / "fails.ipynb").write_text(json.dumps(notebook("x = 1", "assert x == 2, 'on purpose'")))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(base / "site"), str(ROOT)]), "EMULATE_CUDA_FROM": str(TESTS),
           "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor")}
    return base, chapters, env


def command(out: Path, chapters: Path, minutes: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "posenc.study.gpu", "--minutes", str(minutes), "--out", str(out), "--tiny",
            "--chapters-dir", str(chapters), *extra]


def stages(out: Path) -> dict:
    path = out / "stages.json"
    return {s["stage"]: s for s in json.loads(path.read_text())["stages"]} if path.exists() else {}


def assert_whole(out: Path, stage: dict) -> None:
    """A stage's files, as a kill leaves them: every JSON parses, every CSV line has every column."""
    for name in stage.get("files", []):
        path = out / name
        if name.endswith(".json"):
            json.loads(path.read_text())
        else:
            with path.open(newline="") as f:
                lines = list(csv.reader(f))
            assert lines and all(len(line) == len(lines[0]) for line in lines), name
    if stage["stage"] == "benchmark" and stage["status"] == "done":
        rows, meta = bench.read_run("colab_tiny", out, only=True)
        assert meta["complete"] and rows and all(r["device"] == "cuda" for r in rows)


def test_nothing_jupyter_is_importable_there(machine):
    _, _, env = machine
    code = "import importlib, torch\nfor m in ('nbclient', 'nbformat', 'ipykernel', 'IPython'):\n" \
           "    try:\n        importlib.import_module(m)\n    except ImportError:\n        continue\n    raise SystemExit(m)\n" \
           "assert torch.cuda.is_available()"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_gpu_command_runs_every_stage_and_a_kill_keeps_what_finished(machine, tmp_path):
    base, chapters, env = machine
    out = tmp_path / "out"
    # one minute: every stage gets a status (done, skipped for lack of time, or failed), the command exits 0
    done = subprocess.run(command(out, chapters, 1), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first = stages(out)
    assert list(first) == list(gpu.STAGES)
    for stage in first.values():
        assert stage["status"] in ("done", "skipped", "failed"), stage
        assert stage["status"] == "done" or stage.get("reason") or stage.get("error"), stage
        assert_whole(out, stage)

    # resumed with time to spare (the stages end when done; a loaded machine is slow): killed (the command alone, as a time limit kills it) once the benchmark has finished
    child = subprocess.Popen(command(out, chapters, 20, "--resume"), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    deadline = time.time() + 500
    while time.time() < deadline and stages(out).get("benchmark", {}).get("status") != "done":
        time.sleep(0.5)
    child.send_signal(signal.SIGKILL)
    child.wait()
    killed = stages(out)
    assert killed["benchmark"]["status"] == "done" and killed["environment"]["status"] == "done"
    for stage in killed.values():
        assert_whole(out, stage)
    for _ in range(30):  # the stage that was running sees its parent gone and ends too
        running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        if str(out) not in running:
            break
        time.sleep(0.5)
    assert str(out) not in running

    # resumed again: the finished stages are not run again, the rest run to the end
    done = subprocess.run(command(out, chapters, 20, "--resume"), env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    final = stages(out)
    assert final["benchmark"] == killed["benchmark"]  # kept, not re-run
    assert all(final[name]["status"] == "done" for name in gpu.STAGES), json.dumps(final, indent=1)
    for stage in final.values():
        assert_whole(out, stage)
    environment = json.loads((out / "environment.json").read_text())
    assert environment["gpu"]["name"] and environment["dtype"] == "bfloat16"
    assert not any(environment["jupyter_importable"].values())  # the command needed none of them
    assert set(environment["sdpa_backends_causal_4096"]) >= {"cudnn_attention forward", "flash_attention forward+backward"}
    cross = json.loads((out / "crosscheck.json").read_text())
    assert {(r["scheme"], r["path"]) for r in cross["rows"]} >= {("nope", "flex"), ("nope", "flex_direct")}
    assert all("event_ms" in r and "host_ms" in r for r in cross["rows"])  # the emulated device has no kernel times
    report = json.loads((out / "chapters.json").read_text())["chapters"]
    assert report["ok"]["status"] == "passed", report["ok"]
    assert report["fails"]["status"] == "failed" and report["fails"]["cell"] == 2 and "on purpose" in report["fails"]["error"][-1]
    study = final["study"]
    assert study["files"] == gpu.stage_files("study", out, True) and "corpus_sha256" in study


def test_a_chapter_becomes_plain_python(tmp_path):
    path = tmp_path / "c.ipynb"
    path.write_text(json.dumps(notebook("a = 1\n!ls\nif a:\n    %timeit a", "b = a + 1\nfrom IPython.display import display")))
    script, owner = gpu_chapters.chapter_script(path)
    compile(script, "c.py", "exec")  # shell and magic lines are left out
    assert "pass  # (shell or magic line left out)" in script and "!ls" not in script
    assert "pass  # (display: see the prologue)" in script  # IPython's display where it is, else print
    lines = script.splitlines()
    assert owner[lines.index("b = a + 1")] == 2 and owner[lines.index("a = 1")] == 1 and owner[0] == 0


def test_chapters_side_by_side_each_get_their_own_status(machine, tmp_path):
    _, chapters, env = machine
    out = tmp_path / "out"
    done = subprocess.run(command(out, chapters, 5, "--stages", "chapters", "--jobs", "2"), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "chapters.json").read_text())["chapters"]
    assert list(report) == ["fails", "ok"]  # the chapters' order, whichever ended first
    assert report["ok"]["status"] == "passed" and report["fails"]["status"] == "failed"
    assert report["fails"]["cell"] == 2 and "on purpose" in report["fails"]["error"][-1]


def test_jobs_must_be_positive(tmp_path):
    with pytest.raises(SystemExit):
        gpu.main(["--out", str(tmp_path), "--jobs", "0"])
