"""The kernel goals of posenc, judged on the rows of a benchmark run (fresh, or read
back from its CSV).

Each goal asks one question a reader can act on, the same on a CPU and on a GPU, judged
per dtype and pass from `from_length` tokens on:

* **posenc's overhead**: flex through posenc.attention against the very kernel called
  directly (`flex_direct`), time at most 1.05x (the host microseconds per call are
  reported beside it);
* **the position's cost**: each score scheme through compiled flex against plain causal
  flex, the same kernel without a score_mod: ALiBi at most 1.1x, T5 at most 1.2x (T5's
  former score_mod, `t5_computed`, is judged against the same bound, beside it);
* **FlexAttention's kernel**: plain causal flex against the fastest causal SDPA kernel,
  at least 0.9x its speed forward and 0.8x forward+backward (a property of the kernels,
  not of posenc);
* **block sparsity**: the sliding window through flex against causal flex times the
  fraction of causal's blocks the window leaves, at most 1.1x;
* **RoPE**: posenc's eager rotation against Hugging Face's eager function, at most 1.1x
  its time (the design's rule: never slower, with room for noise); the compiled rotation
  at least 0.8 of the bandwidth of a copy of the same bytes into a preallocated buffer;
* **memory**: on a CPU compiled flex at most 64 MiB per call (judged only with an exact
  counter: the resident-set growth is a lower bound); on a GPU every fused path's peak
  per sequence linear in L (growth exponent at most 1.1 between the lengths measured).

A time goal's value is the median of per-round ratios between the two paths, which were
timed in the same rounds (from the run's samples; where a run kept none, the ratio of
medians), and `iqr` holds their quartiles. With several runs (posenc.study.benchmark
--runs) every run is judged, and the goal is met only where it is met in every run, not
met where it is missed in every run, and "inconclusive" otherwise; `values` lists the
runs' values and `value` is their median. A goal whose path did not run is reported with
`met` None and the reason, never left out. A memory goal is judged only with an exact
counter (posenc.study.measure.COUNTERS).
"""

from __future__ import annotations

from .bench_paths import BACKWARD, FORWARD
from .goal_rules import (  # noqa: F401 - the rules, importable from here
    CPU_FLEX_MIB,
    FUSED,
    LINEAR_EXPONENT,
    combine,
    judge_linear_memory,
    judge_memory_bound,
    paired,
)

OVERHEAD = (
    1.05  # flex through posenc.attention / the same kernel called directly, at most
)
POSITION_COST = {
    "alibi": 1.1,
    "t5": 1.2,
    "t5_computed": 1.2,
}  # scheme flex / causal flex
FLEX_SPEED = {
    FORWARD: 0.9,
    BACKWARD: 0.8,
}  # fastest causal SDPA time / causal flex time, at least
WINDOW = 1.1  # window flex / (causal flex x block fraction), at most
ROPE_EAGER = 1.1  # posenc's eager RoPE / Hugging Face's eager, at most
ROPE_BANDWIDTH = 0.8  # compiled RoPE's bandwidth / a preallocated copy's, at least
GOAL_LENGTH = 4096
VERDICTS = ("met", "NOT met", "inconclusive", "not judged")


def _key(row: dict) -> tuple:
    return (
        row["scheme"],
        row["path"],
        row["pass"],
        row["dtype"],
        row["seq_len"],
        row["batch"],
    )


def goals(
    rows: list[dict],
    fractions: dict | None = None,
    device: str | None = None,
    from_length: int = GOAL_LENGTH,
    samples: dict | None = None,
) -> list[dict]:
    """Each goal judged on `rows` (one run or several): dicts with keys goal, device,
    scheme, path, pass, dtype, seq_len, value, values, bound, met, verdict, reason, iqr.

    `device` is "cpu" or "cuda"; None takes it from the rows' "device" column.
    `fractions` are the run's block fractions (its metadata), `samples` its samples_ms.
    `from_length` is where the time goals start (4096; the tests judge tiny runs from
    their lengths).
    """
    if not isinstance(from_length, int) or from_length < 1:
        raise ValueError(f"from_length must be a positive int; got {from_length!r}")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(
            "rows must be a list of dicts (run()'s rows, or read_rows of a stored CSV)"
        )
    if device is None:
        device = next((r.get("device") for r in rows if r.get("device")), None) or "cpu"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda'; got {device!r}")
    if fractions is not None and not isinstance(fractions, dict):
        raise TypeError(
            "fractions must be a dict (the run's block_fractions) or None; got "
            f"{type(fractions).__name__}"
        )
    runs = sorted({r.get("run") or 1 for r in rows})
    per_run = [
        judge_run(
            [r for r in rows if (r.get("run") or 1) == run],
            fractions,
            device,
            from_length,
            samples,
        )
        for run in runs
    ]
    return combine(per_run)


def judge_run(
    rows: list[dict],
    fractions: dict | None,
    device: str,
    from_length: int,
    samples: dict | None,
) -> list[dict]:
    """Every goal on the rows of one run."""
    by_key = {_key(r): r for r in rows}
    judged: list[dict] = []

    def judge(name, row, value, op, bound, unit="x", reason="", **context):
        met = (
            None
            if value is None
            else (value <= bound if op == "<=" else value >= bound)
        )
        if value is None and not reason:
            reason = (
                (row.get("reason") or "not measured")
                if row is not None
                else "not measured"
            )
        key = (
            {k: row[k] for k in ("scheme", "path", "pass", "dtype", "seq_len", "batch")}
            if row is not None
            else {}
        )
        judged.append(
            {
                "goal": name,
                "device": device,
                **key,
                "value": value,
                "bound": f"{op} {bound:g}{unit}",
                "met": met,
                "verdict": "not judged" if met is None else "met" if met else "NOT met",
                "reason": reason,
                **context,
            }
        )

    def ok(row):
        return row is not None and row["status"] == "ok"

    def need(row, partner, what):
        """The reason a goal cannot be judged from row and partner, or ''."""
        if not ok(row):
            return f"the path did not run: {row['reason'] or 'skipped'}"
        if partner is None:
            return f"{what} was not measured at this shape"
        if not ok(partner):
            return f"{what} did not run: {partner['reason'] or 'skipped'}"
        return ""

    def ratio_goal(
        name, row, partner, what, op, bound, invert=False, scale=1.0, **context
    ):
        why = need(row, partner, what)
        if why:
            return judge(name, row, None, op, bound, reason=why, **context)
        value, iqr = paired(row, partner, samples)
        value, iqr = value / scale, None if iqr is None else [q / scale for q in iqr]
        if invert:
            value, iqr = 1 / value, None if iqr is None else [1 / iqr[1], 1 / iqr[0]]
        judge(name, row, value, op, bound, iqr=iqr, **context)

    ordered = sorted(
        by_key.items(),
        key=lambda kv: (kv[0][4], kv[0][2], kv[0][0], kv[0][1], kv[0][3]),
    )
    for (scheme, path, pass_, dt, length, batch), row in ordered:
        long = length >= from_length
        causal_flex = by_key.get(("nope", "flex", pass_, dt, length, batch))
        if long and path == "flex_direct":
            flex = by_key.get((scheme, "flex", pass_, dt, length, batch))
            if flex is not None:
                host = (
                    (flex["host_ms"] - row["host_ms"]) * 1e3
                    if ok(flex)
                    and ok(row)
                    and flex.get("host_ms") is not None
                    and row.get("host_ms") is not None
                    else None
                )
                ratio_goal(
                    f"{scheme}: flex through posenc.attention / the kernel called "
                    f"directly ({pass_})",
                    flex,
                    row,
                    "the kernel called directly",
                    "<=",
                    OVERHEAD,
                    host_us_per_call=host,
                )
        if long and path == "flex" and scheme in POSITION_COST:
            ratio_goal(
                f"{scheme}: flex / plain causal flex, the position's cost ({pass_})",
                row,
                causal_flex,
                "plain causal flex",
                "<=",
                POSITION_COST[scheme],
            )
        if long and path == "flex" and scheme == "nope":
            bases = [
                by_key.get(("nope", p, pass_, dt, length, batch))
                for p in ("sdpa_causal", "sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
            ]
            bases = [b for b in bases if ok(b)]
            base = min(bases, key=lambda b: b["median_ms"]) if bases else None
            ratio_goal(
                f"plain causal flex, speed / the fastest causal SDPA ({pass_})",
                row,
                base,
                "causal SDPA",
                ">=",
                FLEX_SPEED[pass_],
                invert=True,
                baseline_path=None if base is None else base["path"],
            )
        if long and path == "flex" and scheme == "sliding_window":
            frac = (fractions or {}).get(str(length))
            name = f"window: flex / (causal flex x its block fraction) ({pass_})"
            if not frac:
                judge(
                    name,
                    row,
                    None,
                    "<=",
                    WINDOW,
                    reason="the run's block fractions at this length are not known",
                )
            else:
                work = frac["sliding_window"] / frac["causal"]
                ratio_goal(
                    name,
                    row,
                    causal_flex,
                    "plain causal flex",
                    "<=",
                    WINDOW,
                    scale=work,
                    block_fraction_of_causal=work,
                )
        if (
            device == "cpu"
            and long
            and path == "flex"
            and scheme in ("alibi", "t5", "sliding_window")
        ):
            judge_memory_bound(
                judge,
                row,
                f"{scheme} through compiled flex, peak memory (MiB)",
                CPU_FLEX_MIB,
            )
        if scheme == "rope" and path == "posenc" and long:
            hf = by_key.get(("rope", "hf_eager", pass_, dt, length, batch))
            if hf is not None:
                ratio_goal(
                    f"RoPE eager: posenc / Hugging Face ({dt})",
                    row,
                    hf,
                    "Hugging Face's eager RoPE",
                    "<=",
                    ROPE_EAGER,
                )
        if scheme == "rope" and path == "posenc_compiled" and long:
            copy = by_key.get(("copy", "preallocated", pass_, dt, length, batch))
            ratio_goal(
                f"RoPE compiled: bandwidth / a preallocated copy's ({dt})",
                row,
                copy,
                "the copy of the same bytes",
                ">=",
                ROPE_BANDWIDTH,
                invert=True,
            )
    if device == "cuda":
        judge_linear_memory(judge, rows)
    return judged
