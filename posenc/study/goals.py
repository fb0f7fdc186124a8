"""The kernel goals of posenc, judged on the rows of one benchmark run (fresh, or read back from its CSV).

Every dtype and both passes are judged. A goal whose path did not run, or whose measurement
cannot decide it, is reported with `met` None and the reason, never left out.

On the CPU (the goals of the kernel work; unchanged): from 4k tokens, compiled FlexAttention
within 0.5x (window), 2.0x (ALiBi) and 2.5x (T5) of causal SDPA's time, at most 64 MiB of peak
memory; RoPE eager within 1.1x of Hugging Face's eager function, compiled within 0.3x.

On a GPU: from 4k tokens, compiled FlexAttention (plain causal, ALiBi, T5) at >= 0.9x the speed of
the fastest causal SDPA backend forward and >= 0.8x forward+backward; the window at <= 1.1x
(fraction of blocks computed x causal time), the fractions taken relative to causal's; compiled
RoPE at >= 0.8 of the bandwidth of a copy of the same bytes; every fused path's peak memory linear
in L (growth exponent <= 1.1 between the lengths measured).

A time goal's value is the median of the per-round ratios to the baseline where the run recorded them
(the ratio of medians for runs stored before), and `iqr` holds their quartiles as the value is expressed.
A memory goal is judged only with an exact counter (posenc.study.measure.COUNTERS): a lower bound
cannot certify an upper bound, and figures of two counters are never compared.
"""

from __future__ import annotations

import math

from .bench_paths import BACKWARD, FORWARD
from .measure import COUNTERS
from .presets import BASELINE

CPU_FLEX_TIME = {
    "sliding_window": 0.5,
    "alibi": 2.0,
    "t5": 2.5,
}  # time / causal SDPA, at most
CPU_FLEX_MIB = 64
CPU_ROPE = {"posenc": 1.1, "posenc_compiled": 0.3}  # time / Hugging Face eager, at most
GPU_FLEX_SPEED = {FORWARD: 0.9, BACKWARD: 0.8}  # causal SDPA time / flex time, at least
GPU_FLEX_SCHEMES = ("nope", "alibi", "t5")
GPU_WINDOW = 1.1
GPU_ROPE_BANDWIDTH = 0.8
LINEAR_EXPONENT = 1.1
FUSED = {
    ("nope", "sdpa_causal"),
    *((s, "flex") for s in ("nope", "alibi", "t5", "sliding_window", "shaw")),
    ("rope", "posenc_compiled"),
}
GOAL_LENGTH = 4096


def _ratio(row: dict, base: dict | None) -> float | None:
    """Time over the baseline's: the median of per-round ratios where the run recorded it, else the ratio of medians."""
    if row.get("ratio") is not None:
        return row["ratio"]
    return None if base is None else row["median_ms"] / base["median_ms"]


def _iqr(row: dict, invert: bool = False, scale: float = 1.0) -> list[float] | None:
    """The quartiles of the per-round ratios behind a time goal's value (as the value is expressed), where recorded."""
    if row.get("ratio_q25") is None or row.get("ratio_q75") is None:
        return None
    low, high = row["ratio_q25"] / scale, row["ratio_q75"] / scale
    return [1 / high, 1 / low] if invert else [low, high]


def goals(
    rows: list[dict],
    fractions: dict | None = None,
    device: str | None = None,
    from_length: int = GOAL_LENGTH,
) -> list[dict]:
    """Each goal judged on `rows`: dicts with keys goal, device, scheme, path, pass, dtype, seq_len, value, bound, met, reason.

    `device` is "cpu" or "cuda"; None takes it from the rows' "device" column (runs stored before
    that column existed are CPU runs). `fractions` are the run's block fractions (its metadata).
    `from_length` is where the time goals start (4096; the tests judge tiny runs from their lengths).
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
            f"fractions must be a dict (the run's block_fractions) or None; got {type(fractions).__name__}"
        )
    by_key = {
        (r["scheme"], r["path"], r["pass"], r["dtype"], r["seq_len"], r["batch"]): r
        for r in rows
    }
    judged: list[dict] = []

    def judge(name, row, value, op, bound, unit="x", reason="", **context):
        met = (
            None
            if value is None
            else (value <= bound if op == "<=" else value >= bound)
        )
        if value is None and not reason:
            reason = (
                row.get("reason") or "not measured"
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
                "reason": reason,
                **context,
            }
        )

    def ok(row):
        return row is not None and row["status"] == "ok"

    def need(row, base, what="the baseline (causal SDPA)"):
        """The reason a goal cannot be judged from row and base, or ''."""
        if not ok(row):
            return f"the path did not run: {row['reason'] or 'skipped'}"
        if base is not None and not ok(base):
            return f"{what} did not run: {base['reason'] or 'skipped'}"
        return "" if base is not None else f"{what} was not measured at this shape"

    ordered = sorted(
        by_key.items(),
        key=lambda kv: (kv[0][4], kv[0][2], kv[0][0], kv[0][1], kv[0][3]),
    )
    for (scheme, path, pass_, dt, length, batch), row in ordered:
        base = by_key.get((*BASELINE, pass_, dt, length, batch))
        if (
            device == "cpu"
            and path == "flex"
            and scheme in CPU_FLEX_TIME
            and length >= from_length
        ):
            why = need(row, base)
            plain = by_key.get(("nope", "flex", pass_, dt, length, batch))
            judge(f"{scheme} through compiled flex, time / causal SDPA", row, None if why else _ratio(row, base), "<=", CPU_FLEX_TIME[scheme], reason=why,
                  ratio_to_causal_flex=row["median_ms"] / plain["median_ms"] if ok(row) and ok(plain) else None, iqr=_iqr(row))  # fmt: skip
            judge_memory_bound(
                judge,
                row,
                f"{scheme} through compiled flex, peak memory (MiB)",
                CPU_FLEX_MIB,
            )
        if device == "cpu" and scheme == "rope" and path in CPU_ROPE:
            hf = by_key.get(("rope", "hf_eager", pass_, dt, length, batch))
            if hf is not None:
                why = need(row, hf, "Hugging Face's eager RoPE")
                judge(
                    f"RoPE {path} / Hugging Face eager ({dt})",
                    row,
                    None if why else row["median_ms"] / hf["median_ms"],
                    "<=",
                    CPU_ROPE[path],
                    reason=why,
                )
        if device == "cuda" and path == "flex" and length >= from_length:
            if scheme in GPU_FLEX_SCHEMES:
                why = need(row, base)
                ratio = None if why else _ratio(row, base)
                judge(f"{scheme} through compiled flex, speed / fastest causal SDPA ({pass_})", row, None if ratio is None else 1 / ratio, ">=",
                      GPU_FLEX_SPEED[pass_], reason=why, baseline_backend=None if base is None else base.get("backend"), iqr=_iqr(row, invert=True))  # fmt: skip
            if scheme == "sliding_window":
                why = need(row, base)
                frac = (fractions or {}).get(str(length))
                if not why and not frac:
                    why = "the run's block fractions at this length are not known"
                work = None if why else frac["sliding_window"] / frac["causal"]
                judge(f"window through compiled flex, time / (blocks computed x causal time) ({pass_})", row,
                      None if why else _ratio(row, base) / work, "<=", GPU_WINDOW, reason=why, block_fraction_of_causal=work,
                      iqr=None if why else _iqr(row, scale=work))  # fmt: skip
        if (
            device == "cuda"
            and scheme == "rope"
            and path == "posenc_compiled"
            and length >= from_length
        ):
            copy = by_key.get(("copy", "clone", pass_, row["dtype"], length, batch))
            why = need(row, copy, "the copy of the same bytes")
            value = (
                None
                if why
                else (row["bytes_moved"] / row["median_ms"])
                / (copy["bytes_moved"] / copy["median_ms"])
            )
            judge(
                f"RoPE compiled, bandwidth / a copy's ({dt})",
                row,
                value,
                ">=",
                GPU_ROPE_BANDWIDTH,
                reason=why,
            )
    if device == "cuda":
        judge_linear_memory(judge, rows)
    return judged


def judge_memory_bound(judge, row: dict, name: str, mib: float) -> None:
    """An upper bound on peak memory: certified only by an exact counter."""
    if row["status"] != "ok":
        return judge(
            name,
            row,
            None,
            "<=",
            mib,
            " MiB",
            reason=f"the path did not run: {row['reason'] or 'skipped'}",
        )
    counter = row.get("memory_counter")
    if row.get("peak_mem_bytes") is None or COUNTERS.get(counter) != "exact":
        what = (
            f"{counter}, a {COUNTERS[counter]}"
            if counter in COUNTERS
            else f"{counter or 'no counter'}"
        )
        return judge(name, row, None, "<=", mib, " MiB", reason=f"memory counted with {what}: it cannot certify an upper bound",
                     lower_bound_mib=row["peak_mem_bytes"] / 2**20 if row.get("peak_mem_bytes") is not None else None)  # fmt: skip
    judge(name, row, row["peak_mem_bytes"] / 2**20, "<=", mib, " MiB", counter=counter)


def judge_linear_memory(judge, rows: list[dict]) -> None:
    """Peak memory of each fused path linear in L: the largest growth exponent log(m2/m1)/log(L2/L1) between its lengths."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if (r["scheme"], r["path"]) in FUSED:
            series.setdefault(
                (r["scheme"], r["path"], r["pass"], r["dtype"], r["batch"]), []
            ).append(r)
    for (scheme, path, pass_, dt, _), group in sorted(series.items()):
        group = sorted(group, key=lambda r: r["seq_len"])
        name = f"{scheme} {path} peak memory linear in L ({pass_}, {dt})"
        last = group[-1]
        measured = [r for r in group if r["status"] == "ok" and r.get("peak_mem_bytes")]
        counters = {r.get("memory_counter") for r in measured}
        if len(measured) < 2:
            judge(
                name,
                last,
                None,
                "<=",
                LINEAR_EXPONENT,
                "",
                reason=f"measured at {len(measured)} length(s); linearity needs two",
            )
        elif len(counters) > 1 or COUNTERS.get(next(iter(counters))) != "exact":
            judge(
                name,
                last,
                None,
                "<=",
                LINEAR_EXPONENT,
                "",
                reason=f"memory counted with {', '.join(sorted(map(str, counters)))}: not one exact counter",
            )
        else:
            exponent = max(
                math.log(b["peak_mem_bytes"] / a["peak_mem_bytes"])
                / math.log(b["seq_len"] / a["seq_len"])
                for a, b in zip(measured, measured[1:])
            )
            judge(
                name,
                last,
                exponent,
                "<=",
                LINEAR_EXPONENT,
                "",
                lengths=[r["seq_len"] for r in measured],
                counter=next(iter(counters)),
            )
