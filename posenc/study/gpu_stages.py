"""The stages of posenc.study.gpu, each run in a process of its own by that command.

A stage writes its files in the output folder and a note (done or skipped, and why) for
the command's stages.json; an exception is its error. `environment` says what the
machine is, `benchmark` runs the colab preset, `crosscheck` sets profiler kernel times
beside event times, `chapters` runs posenc.study.gpu_chapters, `study` the extrapolation
study.
"""

from __future__ import annotations

import json
import platform
import tarfile
import tempfile
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import torch

from .gpu import write_json

JUPYTER = ("nbclient", "nbformat", "ipykernel", "IPython")


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def sdpa_backends(device, dtype, length: int = 4096) -> dict:
    """Which of SDPA's fused backends accept causal attention (B=1, H=16, d_h=64) at
    `length`, forward and forward+backward: True, or the first line of the error."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    found = {}
    q, k, v = (
        torch.randn(1, 16, length, 64, device=device, dtype=dtype, requires_grad=True)
        for _ in range(3)
    )
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        for grad in (False, True):
            key = f"{name.lower()} {'forward+backward' if grad else 'forward'}"
            try:
                with sdpa_kernel(getattr(SDPBackend, name)):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=True
                    )
                    if grad:
                        out.sum().backward()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                found[key] = True
            except Exception as exc:  # noqa: BLE001 - the answer is the error
                found[key] = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return found


def environment(args, out: Path) -> dict:
    """DIR/environment.json: the machine, its versions, what its GPU accepts."""
    from .. import __version__
    from ..flex import flex_kernel_options
    from .bench_plan import choose_dtype
    from .runinfo import cpu_model, cuda_info, git_state, source_sha256

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu = cuda_info(device)
    dtype = choose_dtype(device)
    importable = {}
    for name in JUPYTER:
        try:
            __import__(name)
            importable[name] = True
        except ImportError:
            importable[name] = False
    info = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "device": str(device),
        "gpu": gpu,
        "bf16_supported": torch.cuda.is_available()
        and torch.cuda.is_bf16_supported(including_emulation=False),
        "dtype": str(dtype).removeprefix("torch."),
        "flex_kernel_options": flex_kernel_options(device),
        "sdpa_backends_causal_4096": sdpa_backends(
            device, dtype, 64 if args.tiny else 4096
        ),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "triton": _installed("triton"),
            "transformers": _installed("transformers"),
            "numpy": _installed("numpy"),
            "posenc": __version__,
        },
        "jupyter_importable": importable,
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "git": dict(zip(("commit", "dirty"), git_state())),
        "package_sha256": source_sha256(),
    }
    write_json(out / "environment.json", info)
    return {"status": "done"}


def benchmark(args, out: Path) -> dict:
    """The colab preset (tiny with --tiny), rows appended after every group."""
    from . import benchmark as bench

    preset = bench.tiny("colab") if args.tiny else bench.PRESETS["colab"]
    schemes = ("nope", "t5", "rope") if args.tiny else None
    _, meta = bench.run(
        preset,
        out,
        schemes=schemes,
        log=lambda line: print(line, flush=True),
        time_budget_s=max(args.budget - 45.0, 0.5 * args.budget),
    )
    skipped = sum(1 for g in meta["goals"] if g["met"] is None)
    return {
        "status": "done",
        "goals_not_judged": skipped,
        "elapsed_s": meta["elapsed_s"],
    }


def crosscheck(args, out: Path) -> dict:
    """DIR/crosscheck.json: per key path, the CUDA event time and the host time per call
    beside the kernel time torch.profiler records for the same calls."""
    from . import benchmark as bench
    from .bench_paths import Runner

    preset = bench.tiny("colab") if args.tiny else bench.PRESETS["colab"]
    device = torch.device(preset.device)
    dtype = bench.choose_dtype(device)
    length = preset.lengths[0]
    runner = Runner(preset, device, dtype)
    keys = [
        ("nope", "flex"),
        ("nope", "flex_direct"),
        ("t5", "flex"),
        ("nope", "sdpa_causal"),
        ("rope", "posenc_compiled"),
        ("copy", "preallocated"),
    ]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.profiler.ProfilerActivity.CUDA in torch.profiler.supported_activities():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    rows = []
    for scheme, path in keys:
        task = bench.Task(scheme, path, bench.FORWARD, length, preset.batch_at(length))
        row = {"scheme": scheme, "path": path, "seq_len": length, "batch": task.batch}
        try:
            fn = runner.step(task, length)[0]
            samples, failed = bench.time_rounds(
                {path: fn}, device, preset.warmup, 3, runner.flush(), min_calls=5
            )
            if failed:
                raise failed[path]
            row["event_ms"] = sorted(samples[path].ms)[1]
            row["host_ms"] = sorted(samples[path].host_ms)[1]
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(5):
                    fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            # the kernels' own events: an operator's self device time is its
            # kernels' again (summing both counted every kernel twice on an H200)
            kernel_us = sum(
                getattr(e, "self_device_time_total", None)
                or getattr(e, "self_cuda_time_total", 0)
                for e in prof.key_averages()
                if e.device_type == torch.autograd.DeviceType.CUDA
            )
            row["kernel_ms"] = kernel_us / 1e3 / 5 if kernel_us else None
            if row["kernel_ms"] is None:
                row["note"] = "the profiler recorded no device kernels"
        except Exception as exc:  # noqa: BLE001 - recorded per path
            row["error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_json(
        out / "crosscheck.json",
        {
            "device": str(device),
            "rows": rows,
            "dtype": str(dtype).removeprefix("torch."),
        },
    )
    return {"status": "done"}


def _corpus_root(corpus: str | None, work: Path) -> Path | None:
    if not corpus:
        return None
    path = Path(corpus)
    if path.is_dir():
        return path
    root = Path(tempfile.mkdtemp(prefix="corpus-", dir=work))
    with tarfile.open(path) as tar:
        try:
            tar.extractall(root, filter="data")
        except TypeError:  # a Python without extraction filters
            tar.extractall(root)  # noqa: S202
    return root


def study(args, out: Path) -> dict:
    """The extrapolation study's colab preset (tiny with --tiny), resumable."""
    from . import extrapolation as xp
    from .corpus import load_corpus
    from .results import read_result

    preset = xp.tiny(xp.PRESETS["colab"]) if args.tiny else xp.PRESETS["colab"]
    root = _corpus_root(args.corpus, Path(args.work))
    digest = load_corpus(preset.corpus_bytes, root=root).sha256
    stored = read_result("extrapolation_cpu.json")
    stored_digest = None if stored is None else json.loads(stored).get("corpus_sha256")
    same = digest == stored_digest
    xp.study(preset, out, corpus_root=root)
    note = {"status": "done", "corpus_sha256": digest, "corpus_matches_stored": same}
    if args.tiny:
        note["reason"] = "tiny: a slice of the corpus, not compared with the stored run"
    elif not same:
        note["reason"] = (
            "the corpus differs from the stored cpu run's (another Python's standard "
            "library): compare rises and rankings, not loss levels; pass --corpus with "
            "the stored run's bytes (python -m posenc.study.gpu --pack-corpus)"
        )
    return note


def run_stage(args) -> int:
    """Run one stage; its note goes to WORK/<stage>.json for stages.json."""
    out, work = Path(args.out), Path(args.work or tempfile.mkdtemp())
    stages = {
        "environment": environment,
        "benchmark": benchmark,
        "crosscheck": crosscheck,
        "study": study,
    }
    try:
        if args.stage == "chapters":
            from .gpu_chapters import run_chapters

            note = run_chapters(args, out, work)
        else:
            note = stages[args.stage](args, out)
        code = 0
    except Exception as exc:  # noqa: BLE001 - the stage's error, for stages.json
        tail = traceback.format_exc().strip().splitlines()[-12:]
        note, code = (
            {"error": f"{type(exc).__name__}: {exc}"[:500], "traceback": tail},
            1,
        )
        traceback.print_exc()
    write_json(work / f"{args.stage}.json", note)
    return code
