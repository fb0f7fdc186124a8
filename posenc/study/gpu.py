"""Every GPU number the course needs, from one command bounded in time.

    python -m posenc.study.gpu --minutes 8 --out DIR [--corpus STDLIB.tar.gz] [--jobs N]
    python -m posenc.study.gpu --pack-corpus STDLIB.tar.gz  # where the study was made

Runs in priority order, each stage in a process of its own, bounded by the time left and
writing its files before the next starts; DIR/stages.json says after every stage which
are done, skipped (why) or failed (the error), so a kill at any moment keeps every
finished stage's files whole:

1. environment: DIR/environment.json (the GPU, its clocks, driver, versions, which of
   SDPA's fused backends accept causal attention at 4,096 tokens, FlexAttention's
   blocks);
2. benchmark: the `colab` preset (8,192 tokens first), DIR/benchmark_colab.csv and
   .json, rows appended after every group;
3. crosscheck: DIR/crosscheck.json, the kernel time torch.profiler sees beside the event
   time of a few key paths (what host overhead the event times hold);
4. chapters: every chapter top to bottom on the GPU as plain Python (no Jupyter needed),
   the closing two at tiny size, each with a time cap, --jobs N of them side by side
   (they share the GPU; their times are not measurements): DIR/chapters.json;
5. study: the extrapolation study's `colab` preset, DIR/extrapolation_colab*, on the
   same bytes as the stored CPU run when --corpus gives them (else its loss levels are
   not comparable with the stored run's, and stages.json says so).

With --minutes 8 on an H100 the first four fit; the study runs in what is left, and a
later command with --resume continues it (a stage already done is not run again). The
files go where the chapters read them by copying DIR's benchmark_colab.* (and
extrapolation_colab*) into chapters/results/ of a clone. --tiny runs every stage at tiny
size (the tests do, on the emulated device).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

STAGES = ("environment", "benchmark", "crosscheck", "chapters", "study")
# each stage's share of the minutes at most (the chapters and the study take what is
# left)
CAPS = {"environment": 0.08, "benchmark": 0.5, "crosscheck": 0.12}
FLOORS = {"environment": 60.0, "crosscheck": 60.0}  # seconds a stage may take at least
MIN_STAGE_S = 15.0  # a stage is started only with at least this many seconds left
GRACE_S = 5.0  # after its time, a stage is stopped; this long to write what it holds


def write_json(path: Path, data) -> None:
    """Replace `path` with `data` as JSON, atomically (a file beside it, then
    os.replace)."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def watch_parent() -> None:
    """End this process when its parent dies (a killed command leaves no stage)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def _own_group() -> dict:
    """Popen arguments for a child in a process group of its own (killed as one)."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}  # noqa: PLW1509


def run_child(args: list[str], timeout: float, env: dict | None = None) -> tuple:
    """Run a Python child in its own process group: (its code, None if stopped; s)."""
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, *args], env=env, **_own_group())
    try:
        code = child.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        code = None
    return code, round(time.perf_counter() - start, 1)


def stage_files(name: str, out: Path, tiny: bool) -> list[str]:
    """The files a stage writes in `out`."""
    bench = "colab_tiny" if tiny else "colab"
    study = "colab_tiny" if tiny else "colab"
    return {
        "environment": ["environment.json"],
        "benchmark": [f"benchmark_{bench}.csv", f"benchmark_{bench}.json"],
        "crosscheck": ["crosscheck.json"],
        "chapters": ["chapters.json"],
        "study": [
            f"extrapolation_{study}.csv",
            f"extrapolation_{study}_sequences.csv",
            f"extrapolation_{study}.json",
        ],
    }[name]


def orchestrate(args: argparse.Namespace) -> int:
    """The stages in order, each in a child process bounded by the time left."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + 60.0 * args.minutes
    status_path = out / "stages.json"
    old = (
        json.loads(status_path.read_text())
        if args.resume and status_path.exists()
        else {}
    )
    done_before = {s["stage"] for s in old.get("stages", []) if s["status"] == "done"}
    stages = [s for s in old.get("stages", []) if s["stage"] in done_before]
    record = {
        "command": sys.argv,
        "minutes": args.minutes,
        "tiny": args.tiny,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "stages": stages,
    }
    work = Path(tempfile.mkdtemp(prefix="posenc-gpu-"))
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "agg",
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        or str(work / "inductor"),
    }
    current = {}

    def stop(signum, frame):  # a command stopped from outside: say so, stop the stage
        if current.get("stage"):
            stages.append({**current, "status": "failed", "error": f"signal {signum}"})
            record["stages"] = stages
            write_json(status_path, record)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    for name in STAGES:
        if name in done_before:
            continue
        if args.stages and name not in args.stages:
            continue
        left = deadline - time.time()
        files = stage_files(name, out, args.tiny)
        if left < MIN_STAGE_S:
            stages.append(
                {
                    "stage": name,
                    "status": "skipped",
                    "files": [],
                    "reason": f"no time left ({left:.0f} s of {args.minutes} min)",
                }
            )
            continue
        cap = CAPS.get(name, 1.0) * 60.0 * args.minutes
        budget = min(left, max(cap, FLOORS.get(name, MIN_STAGE_S)))
        current.update(stage=name, budget_s=round(budget, 1))
        stages.append(
            {"stage": name, "status": "running", "budget_s": round(budget, 1)}
        )
        record["stages"] = stages
        write_json(status_path, record)
        child = [
            "-m",
            "posenc.study.gpu",
            "--stage",
            name,
            "--out",
            str(out),
            "--budget",
            str(budget),
            "--work",
            str(work),
        ]
        child += ["--tiny"] if args.tiny else []
        child += ["--resume"] if args.resume else []
        child += ["--corpus", args.corpus] if args.corpus else []
        child += ["--chapters", *args.chapters] if args.chapters else []
        child += ["--chapters-dir", args.chapters_dir] if args.chapters_dir else []
        child += ["--jobs", str(args.jobs)]
        code, seconds = run_child(child, budget, env)
        note_path = work / f"{name}.json"
        note = json.loads(note_path.read_text()) if note_path.exists() else {}
        entry = {
            "stage": name,
            "seconds": seconds,
            "budget_s": round(budget, 1),
            "files": [f for f in files if (out / f).exists()],
            **note,
        }
        if code == 0:
            entry["status"] = note.get("status", "done")
        elif code is None:
            entry.update(status="failed", error=f"stopped after {seconds} s, its time")
        else:
            entry.update(
                status="failed", error=note.get("error") or f"exit code {code}"
            )
        stages[-1] = entry
        current.clear()
        record["stages"] = stages
        write_json(status_path, record)
        print(f"stage {name}: {entry['status']} in {seconds} s", flush=True)
    record["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    write_json(status_path, record)
    return 0


def pack_corpus(path: str) -> int:
    """The standard library's sources the extrapolation corpus reads, as a .tar.gz."""
    import sysconfig
    import tarfile

    from .corpus import load_corpus, stdlib_files

    root = Path(sysconfig.get_paths()["stdlib"])
    with tarfile.open(path, "w:gz") as tar:
        for file in stdlib_files(root):
            tar.add(file, arcname=file.relative_to(root).as_posix())
    digest = load_corpus().sha256
    print(f"{path}: the corpus of this Python's standard library, sha256 {digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m posenc.study.gpu", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--minutes", type=float, default=8.0, help="time for all stages"
    )
    parser.add_argument("--out", help="folder for the stages' files")
    parser.add_argument(
        "--corpus",
        help="the stored run's corpus (a .tar.gz from --pack-corpus, or a folder)",
    )
    parser.add_argument("--tiny", action="store_true", help="every stage at tiny size")
    parser.add_argument("--resume", action="store_true", help="skip the stages done")
    parser.add_argument("--stages", nargs="+", choices=STAGES, help="only these")
    parser.add_argument("--chapters", nargs="+", help="only these chapters (names)")
    parser.add_argument("--chapters-dir", help="where the chapters are (default: ours)")
    parser.add_argument(
        "--jobs", type=int, default=1, help="chapters run side by side (default 1)"
    )
    parser.add_argument("--pack-corpus", metavar="FILE", help="write the corpus, stop")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pack_corpus:
        return pack_corpus(args.pack_corpus)
    if not args.out:
        parser.error("--out is required")
    if args.stage:
        from .gpu_stages import run_stage

        watch_parent()
        return run_stage(args)
    if args.minutes <= 0:
        parser.error(f"--minutes must be positive, got {args.minutes}")
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
