"""How long a preset of the extrapolation study takes: counts, and seconds under a cost.

`estimate` counts a preset's optimizer steps and evaluations and turns them into
seconds under a stated `StepCost` (an assumption, never a measurement; "t4" for the
colab preset, "h100" for the gpu preset); given the metadata of a stored run it also
sets the same runs' recorded CPU seconds beside the estimate. `cpu_seconds` prices every
run of a cpu-like preset from a stored run's recorded seconds (and stated costs for what
that run did not do), `wall_minutes` schedules them on preset.jobs processes as the
study does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .extrapolation_layers import ablation_twins, rescalings
from .extrapolation_presets import Preset


@dataclass(frozen=True)
class StepCost:
    """Assumed seconds of a training step, of one evaluation of a model, and of what a
    study does once (not measurements).
    """

    name: str
    # one optimizer step (a fine-tuning step at 4L moves the same bytes and counts the
    # same)
    step_s: float
    evaluation_s: (
        float  # one evaluation: both protocols at every length and the passkey tests
    )
    # imports, reading the corpus, the n-gram baselines, the evaluation sequences
    fixed_s: float


# A T4 (Colab's free GPU) running the cpu preset's model in float32, eager PyTorch. A
# step of that model is bound by the launch of its operators, not by arithmetic:
# counted on the CPU, a training step dispatches about 1,240 (NoPE, ALiBi) to 1,770
# (Shaw) aten operators, assumed at about 15 microseconds of host time each on Colab's
# host CPU, while its arithmetic (6 x 232 thousand parameters x 2,560 bytes, about 3.6
# GFLOP) is under 1 ms at a T4's 8 TFLOP/s fp32 peak: 20 ms a step. An evaluation
# dispatches 4,400 to 11,800 operators and about 0.5 TFLOP of forward passes: 2 s
# allowed. Once per study: the n-gram baselines (the metadata's ngram_seconds: 29 s on
# one CPU thread for the add-k models of the first cpu run), reading the standard
# library and the evaluation sequences: 45 s.
#
# An H100 running the gpu preset's model (width 256, 8 heads, L = 256, 64 windows a
# step, 3.3 M parameters) in float32 without TF32: a step is about 6 x 3.3 M x 16,384
# bytes = 0.32 TFLOP of matmuls plus attention at 256 positions, assumed at 20 TFLOP/s
# achieved (fp32 without TF32 peaks near 67), 16 ms, plus about 1,500 launches at 6
# microseconds and a loss.item() sync: 25 ms a step. An evaluation runs 512 sequences
# of 2,049 bytes through both protocols at four lengths, the passkey tests and the copy
# probe, about 12 M bytes of forward passes (attention up to 2,048 positions) and the
# explicit attention profile: 20 s assumed. Once: 90 s (the interpolated 6-gram on the
# CPU, the corpus). Neither figure is measured: the gpu preset has not run.
STEP_COSTS = {
    "t4": StepCost("t4", step_s=0.020, evaluation_s=2.0, fixed_s=45.0),
    "h100": StepCost("h100", step_s=0.025, evaluation_s=20.0, fixed_s=90.0),
}
# The cpu preset on one thread of the stored run's machine, for what its recorded
# seconds do not hold: an evaluation (both protocols, passkey) 8 s; the copy probe of
# 32 sequences, a control, four copies and four reversed copies a length, 3.6 s an
# evaluation (a probe of 64 sequences and five windows a length measured at 0.66 of the
# language-model protocols' time, at the same load); a 200-step fine-tune at 4L 36 s
# (the RoPE run's recorded seconds beyond the plain run's, less its 11 evaluations, over
# 6 fine-tunes).
CPU_EVALUATION_S, CPU_PROBE_S, CPU_FINETUNE_S = 8.0, 3.6, 36.0
# the first cpu run's metadata holds no run_counts: its RoPE run had six fine-tunes
# and twelve evaluations
FIRST_RUN_COUNTS = {"rope": (2500 + 6 * 200, 12)}
# runs of a kind the first cpu run did not have: the recorded run whose cost they share
# (a recipe's layers cost what the RoPE window's do; the slopes change no arithmetic)
ANALOGUES = {
    "rnope_swa": "window_rope",
    "irope": "window_rope",
    "alibi:slopes_L": "alibi",
    "alibi:heads8_two_slopes": "alibi:heads8",
}


def run_counts(preset: Preset, run: str) -> tuple[int, int]:
    """(optimizer steps, evaluations) of one run: plain RoPE (not a variation's) adds
    its fine-tunes and their evaluations; an ablation only evaluates.

    RoPE's fine-tunes are the extensions of `rescalings` and the control fine-tuned at
    L (CONTROL_AT_L); a step at L moves the same bytes as one at 4L and is counted the
    same.
    """
    ablation = preset.ablation(run)
    if ablation is not None:
        return 0, len(ablation_twins(ablation.name, preset))
    label, variant, _ = preset.for_run(run)
    if label != "rope" or variant != "trained":
        return preset.steps, 1
    extensions = rescalings(preset)
    zero_shot = sum(1 for args in extensions.values() if args)
    fine_tunes = len(extensions) + 1
    return preset.steps + fine_tunes * preset.finetune_steps, 1 + zero_shot + fine_tunes


def estimate(
    preset: Preset, cost: str | StepCost = "t4", recorded: dict | None = None
) -> dict:
    """Steps, evaluations and the seconds of a study of `preset` under `cost`; with
    `recorded` (a stored run's metadata), the recorded wall seconds of the same (scheme,
    seed) runs, their seconds per step, and the estimate's speed-up on them.
    """
    cost = STEP_COSTS[cost] if isinstance(cost, str) else cost
    counts = {(run, seed): run_counts(preset, run) for run, seed in preset.runs}
    steps, evaluations = (
        sum(s for s, _ in counts.values()),
        sum(e for _, e in counts.values()),
    )
    seconds = cost.fixed_s + steps * cost.step_s + evaluations * cost.evaluation_s
    out = {
        "preset": preset.name,
        "cost": cost.name,
        "runs": len(counts),
        "steps": steps,
        "evaluations": evaluations,
        "estimate_s": round(seconds, 1),
    }
    if recorded is not None:
        wall = recorded.get("wall_seconds", {})
        known = [
            f"{label}/{seed}" for label, seed in counts if f"{label}/{seed}" in wall
        ]
        if len(known) == len(counts):
            cpu_s = sum(wall[k] for k in known)
            out.update(
                recorded_s=round(cpu_s, 1),
                recorded_step_s=round(cpu_s / steps, 4),
                speedup=round(
                    cpu_s / (steps * cost.step_s + evaluations * cost.evaluation_s), 2
                ),
            )
    return out


def cpu_seconds(preset: Preset, recorded: dict) -> dict[tuple[str, int], float]:
    """Single-thread seconds of every (run, seed) of a cpu-like preset, from a stored
    run's metadata (`recorded`, its wall_seconds): a run it recorded takes the least of
    its recorded seeds (or of its ANALOGUES entry: the seeds do the same work, and a
    run slowed or paused beside other work only takes longer); what it did not record
    is priced at CPU_EVALUATION_S, CPU_PROBE_S and CPU_FINETUNE_S (evaluations and
    fine-tunes a run has beyond the recorded one, the copy probe where the recorded run
    had none)."""
    wall, old = recorded.get("wall_seconds", {}), Preset(**_config(recorded))
    had_probe = bool(getattr(old, "probe_sequences", 0))
    out = {}
    for run, seed in preset.runs:
        steps, evaluations = run_counts(preset, run)
        if preset.ablation(run):  # its recorded seconds, or its evaluations priced
            mine = [v for k, v in wall.items() if k.rpartition("/")[0] == run]
            priced = evaluations * (CPU_EVALUATION_S + CPU_PROBE_S)
            out[(run, seed)] = min(mine) if mine else priced
            continue
        base = ANALOGUES.get(run, run)
        seconds = [v for k, v in wall.items() if k.rpartition("/")[0] == base]
        if not seconds:
            raise ValueError(f"no recorded run like {run!r} in the metadata")
        value = min(seconds)
        old_steps, old_evaluations = recorded.get("run_counts", {}).get(
            base
        ) or FIRST_RUN_COUNTS.get(base, run_counts(old, base))
        fine_tunes = (steps - old_steps) / max(1, preset.finetune_steps)
        value += fine_tunes * CPU_FINETUNE_S
        value += (evaluations - old_evaluations) * CPU_EVALUATION_S
        value += 0 if had_probe else evaluations * CPU_PROBE_S
        out[(run, seed)] = value
    return out


def _config(meta: dict) -> dict:
    config = meta["config"]
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


def wall_minutes(preset: Preset, seconds: dict, fixed_s: float = 120.0) -> float:
    """Minutes of a study on preset.jobs processes: its runs in the order the study
    starts them (RoPE first, the ablations as their RoPE runs end), each on the first
    process free, after `fixed_s` (the n-gram baselines, the corpus)."""
    order = sorted(seconds, key=lambda r: (bool(preset.ablation(r[0])), r[0] != "rope"))
    free = [fixed_s] * max(1, preset.jobs)
    for run in order:
        at = free.index(min(free))
        free[at] += seconds[run]
    return max(free) / 60
