"""The rules behind posenc.study.goals: paired ratios, verdicts over runs, memory.

`paired` takes one path's time over another's as the median of per-round ratios (the two
were timed in the same rounds); `combine` turns each run's verdict into one (met in
every run, missed in every run, or inconclusive); `judge_memory_bound` and
`judge_linear_memory` judge memory only with an exact counter
(posenc.study.measure.COUNTERS).
"""

from __future__ import annotations

import math
import statistics

from .measure import COUNTERS, summarize

CPU_FLEX_MIB = 64
LINEAR_EXPONENT = 1.1
FUSED = {
    ("nope", "sdpa_causal"),
    *((s, "flex") for s in ("nope", "alibi", "t5", "sliding_window", "shaw")),
    ("rope", "posenc_compiled"),
}


def _samples_of(row: dict, samples: dict | None) -> list[float] | None:
    if not samples:
        return None
    return samples.get(
        "/".join(
            str(row[c])
            for c in ("run", "scheme", "path", "pass", "dtype", "seq_len", "batch")
        )
    )


def paired(
    row: dict, partner: dict, samples: dict | None
) -> tuple[float, list[float] | None]:
    """row's time over partner's: the median of per-round ratios and their quartiles
    where the run kept both rows' samples (timed in the same rounds), else the ratio of
    medians."""
    a, b = _samples_of(row, samples), _samples_of(partner, samples)
    if a and b and len(a) == len(b):
        median, q25, q75 = summarize([x / y for x, y in zip(a, b)])
        return median, [q25, q75]
    return row["median_ms"] / partner["median_ms"], None


def combine(per_run: list[list[dict]]) -> list[dict]:
    """One verdict per goal from each run's: met in every run, missed in every run, or
    inconclusive."""
    order, found = [], {}
    for judged in per_run:
        for g in judged:
            key = (
                g["goal"],
                g.get("pass"),
                g.get("dtype"),
                g.get("seq_len"),
                g.get("batch"),
            )
            if key not in found:
                order.append(key)
                found[key] = []
            found[key].append(g)
    out = []
    for key in order:
        gs = found[key]
        first = dict(gs[0])
        values = [g["value"] for g in gs]
        known = [v for v in values if v is not None]
        mets = [g["met"] for g in gs]
        first["values"] = values
        first["runs"] = len(gs)
        if len(gs) > 1:
            first["value"] = statistics.median(known) if known else None
            first["iqr"] = [g.get("iqr") for g in gs]
        if len(known) < len(values) or not known:
            first["met"], first["verdict"] = None, "not judged"
            first["reason"] = (
                next((g["reason"] for g in gs if g["value"] is None), "")
                or first["reason"]
            )
        elif all(mets):
            first["met"], first["verdict"] = True, "met"
        elif not any(mets):
            first["met"], first["verdict"] = False, "NOT met"
        else:
            first["met"], first["verdict"] = None, "inconclusive"
            first["reason"] = f"met in {sum(bool(m) for m in mets)} of {len(mets)} runs"
        out.append(first)
    return out


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
        return judge(
            name,
            row,
            None,
            "<=",
            mib,
            " MiB",
            reason=f"memory counted with {what}: it cannot certify an upper bound",
            lower_bound_mib=row["peak_mem_bytes"] / 2**20
            if row.get("peak_mem_bytes") is not None
            else None,
        )
    judge(name, row, row["peak_mem_bytes"] / 2**20, "<=", mib, " MiB", counter=counter)


def judge_linear_memory(judge, rows: list[dict]) -> None:
    """Peak memory per sequence (peak / batch) of each fused path linear in L: the
    largest growth exponent log(m2/m1)/log(L2/L1) between its lengths."""
    series: dict[tuple, list[dict]] = {}
    for r in rows:
        if (r["scheme"], r["path"]) in FUSED:
            series.setdefault(
                (r["scheme"], r["path"], r["pass"], r["dtype"]), []
            ).append(r)
    for (scheme, path, pass_, dt), group in sorted(series.items()):
        group = sorted(group, key=lambda r: r["seq_len"])
        name = f"{scheme} {path} peak memory linear in L ({pass_}, {dt})"
        last = group[-1]
        measured = [r for r in group if r["status"] == "ok" and r.get("peak_mem_bytes")]
        counters = {r.get("memory_counter") for r in measured}
        lengths = sorted({r["seq_len"] for r in measured})
        if len(lengths) < 2:
            judge(
                name,
                last,
                None,
                "<=",
                LINEAR_EXPONENT,
                "",
                reason=f"measured at {len(lengths)} length(s); linearity needs two",
            )
        elif len(counters) > 1 or COUNTERS.get(next(iter(counters))) != "exact":
            judge(
                name,
                last,
                None,
                "<=",
                LINEAR_EXPONENT,
                "",
                reason=f"memory counted with {', '.join(sorted(map(str, counters)))}: "
                "not one exact counter",
            )
        else:
            per_length = {
                n: max(
                    r["peak_mem_bytes"] / r["batch"]
                    for r in measured
                    if r["seq_len"] == n
                )
                for n in lengths
            }
            exponent = max(
                math.log(per_length[b] / per_length[a]) / math.log(b / a)
                for a, b in zip(lengths, lengths[1:])
            )
            judge(
                name,
                last,
                exponent,
                "<=",
                LINEAR_EXPONENT,
                "",
                lengths=lengths,
                counter=next(iter(counters)),
            )
