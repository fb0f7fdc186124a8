"""How long a preset of the extrapolation study takes: counts, and seconds under a cost.

`estimate` counts a preset's optimizer steps and evaluations and turns them into
seconds under a stated `StepCost` (an assumption, never a measurement); given the
metadata of the stored `cpu` run it also sets the same runs' recorded CPU seconds
beside the estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

from .extrapolation_presets import Preset, rescalings


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
# step of that model is bound by
# the launch of its operators, not by arithmetic: counted on the CPU, a training step
# dispatches about 1,240 (NoPE,
# ALiBi) to 1,770 (Shaw) aten operators, assumed at about 15 microseconds of host time
# each on Colab's host CPU, while
# its arithmetic (6 x 232 thousand parameters x 2,560 bytes, about 3.6 GFLOP) is under 1
# ms at a T4's 8 TFLOP/s fp32
# peak: 20 ms a step. An evaluation dispatches 4,400 to 11,800 operators and about 0.5
# TFLOP of forward passes: 2 s
# allowed. Once per study: the n-gram baselines (15 s recorded on one CPU thread for the
# cpu run), reading the
# standard library and the evaluation sequences: 45 s.
STEP_COSTS = {"t4": StepCost("t4", step_s=0.020, evaluation_s=2.0, fixed_s=45.0)}


def run_counts(preset: Preset, run: str) -> tuple[int, int]:
    """(optimizer steps, evaluations) of one run: plain RoPE (not a variation's) adds
    its fine-tunes and their evaluations.

    Its fine-tunes are the extensions of `rescalings` and the control fine-tuned at L
    (CONTROL_AT_L); a step at L moves the same bytes as one at 4L and is counted the
    same.
    """
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
