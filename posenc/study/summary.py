"""Intervals and rankings for the extrapolation study: a bootstrap over sequences and
seeds.

The study stores, for every (scheme, variant, seed, protocol, length), one number per
evaluation sequence (a mean loss, or a passkey hit as 0/1). A bootstrap replicate draws
the seeds with replacement and, independently, the sequences with replacement, and
recomputes every mean from the same draws: the same sequences for every scheme and
length, so that differences (a rise from L to 8L, one scheme against another) keep their
pairing and their intervals are as narrow as the data allow. Intervals are the 2.5 and
97.5 percentiles.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """Add a `label`: the scheme for a model trained from scratch, "scheme (variant)"
    for the RoPE model's extensions.
    """
    variant = frame["variant"].astype(str)
    return frame.assign(
        label=frame["scheme"].where(
            variant == "trained", frame["scheme"] + " (" + variant + ")"
        )
    )


def read_sequences(text: str) -> pd.DataFrame:
    """The per-sequence CSV as a frame whose `values` column holds float arrays (losses,
    or 0/1 passkey hits).
    """
    frame = pd.read_csv(io.StringIO(text), dtype={"values": str})

    def parse(row):
        if row["protocol"] == "passkey":
            return np.frombuffer(row["values"].encode(), dtype=np.uint8).astype(
                float
            ) - ord("0")
        return np.array(row["values"].split(), dtype=float)

    return labelled(frame.assign(values=frame.apply(parse, axis=1)))


def _cube(
    sequences: pd.DataFrame, task: str, protocol: str
) -> tuple[list[str], list[int], list[int], np.ndarray]:
    """(labels, seeds, lengths, V[label, seed, length, item]); NaN where a label has no
    value at a length.
    """
    part = sequences[(sequences.task == task) & (sequences.protocol == protocol)]
    if part.empty:
        raise ValueError(
            f"no per-sequence values for task {task!r} and protocol {protocol!r}"
        )
    labels, seeds, lengths = (
        list(dict.fromkeys(part.label)),
        sorted(part.seed.unique()),
        sorted(part.eval_len.unique()),
    )
    # passkey: one row per depth, concatenated into the items of a length
    items = part.groupby(["label", "seed", "eval_len"], sort=False)["values"].agg(
        lambda v: np.concatenate(list(v))
    )
    width = max(len(v) for v in items)
    cube = np.full((len(labels), len(seeds), len(lengths), width), np.nan)
    for (label, seed, length), values in items.items():
        if len(values) != width:
            raise ValueError(
                f"{label} seed {seed} at {length}: {len(values)} sequences, others "
                f"have {width}"
            )
        cube[labels.index(label), seeds.index(seed), lengths.index(length)] = values
    return labels, [int(s) for s in seeds], [int(n) for n in lengths], cube


def _draws(
    rng: np.random.Generator, n_seeds: int, n_items: int, replicates: int
) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap weights (replicates, seeds) and (replicates, items): how often each
    seed and each item is drawn, over the draw size.
    """
    seed_w = (
        rng.multinomial(n_seeds, np.full(n_seeds, 1 / n_seeds), size=replicates)
        / n_seeds
    )
    item_w = (
        rng.multinomial(n_items, np.full(n_items, 1 / n_items), size=replicates)
        / n_items
    )
    return seed_w, item_w


def bootstrap(
    sequences: pd.DataFrame,
    task: str = "lm",
    protocol: str = "matched",
    replicates: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per label and length: the mean over seeds and sequences, its interval, the rise
    from the shortest length, and the rank.

    Columns: label, eval_len, mean, lo, hi, rise, rise_lo, rise_hi (mean at this length
    minus at the shortest, on the same sequences), rank (1 = lowest loss or highest
    accuracy among the labels with a value at that length), rank_lo, rank_hi (the rank's
    interval over replicates).
    """
    labels, seeds, lengths, cube = _cube(sequences, task, protocol)
    rng = np.random.default_rng(seed)
    n_seeds, n_items = cube.shape[1], cube.shape[3]
    seed_w, item_w = _draws(rng, n_seeds, n_items, replicates)
    boot = np.einsum(
        "bs,lsni,bi->bln", seed_w, np.nan_to_num(cube), item_w
    )  # (B, labels, lengths)
    missing = np.isnan(cube).any(axis=(1, 3))  # (labels, lengths)
    boot[:, missing] = np.nan
    point = cube.mean(axis=(1, 3))
    better = -1 if task == "passkey" else 1  # rank 1: lowest loss, highest accuracy
    ranks = pd.DataFrame(better * point).rank(axis=0, method="min").to_numpy()
    boot_ranks = np.stack(
        [pd.DataFrame(better * b).rank(axis=0, method="min").to_numpy() for b in boot]
    )
    rows = []
    for i, label in enumerate(labels):
        for j, length in enumerate(lengths):
            if missing[i, j]:
                continue
            rise = boot[:, i, j] - boot[:, i, 0]
            rows.append(
                {
                    "label": label,
                    "eval_len": length,
                    "mean": point[i, j],
                    "lo": np.percentile(boot[:, i, j], 2.5),
                    "hi": np.percentile(boot[:, i, j], 97.5),
                    "rise": point[i, j] - point[i, 0],
                    "rise_lo": np.percentile(rise, 2.5),
                    "rise_hi": np.percentile(rise, 97.5),
                    "rank": int(ranks[i, j]),
                    "rank_lo": int(np.percentile(boot_ranks[:, i, j], 2.5)),
                    "rank_hi": int(np.percentile(boot_ranks[:, i, j], 97.5)),
                }
            )
    out = pd.DataFrame(rows)
    out.attrs.update(seeds=seeds, items=n_items, replicates=replicates)
    return out


def difference(
    sequences: pd.DataFrame,
    first: str,
    second,
    length: int,
    task: str = "lm",
    protocol: str = "matched",
    replicates: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(mean, lo, hi) of first minus second at one length, paired over the same
    sequences and seeds.

    `second` is a label, or one value per sequence that every seed shares (a baseline
    scored on the same targets, such as an n-gram's loss of each sequence).
    """
    labels, _, lengths, cube = _cube(sequences, task, protocol)
    rng = np.random.default_rng(seed)
    reference = (
        cube[labels.index(second), :, lengths.index(length)]
        if isinstance(second, str)
        else np.asarray(second, dtype=float)
    )
    if reference.shape[-1] != cube.shape[3]:
        raise ValueError(
            f"second must be a label or one value per sequence ({cube.shape[3]}), got "
            f"{reference.shape[-1]} values"
        )
    diff = cube[labels.index(first), :, lengths.index(length)] - reference  # (S, N)
    n_seeds, n_items = diff.shape
    seed_w, item_w = _draws(rng, n_seeds, n_items, replicates)
    boot = np.einsum("bs,si,bi->b", seed_w, diff, item_w)
    return (
        float(diff.mean()),
        float(np.percentile(boot, 2.5)),
        float(np.percentile(boot, 97.5)),
    )


def bucket_rise(
    sequences: pd.DataFrame,
    short: int,
    long: int,
    replicates: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per label and bucket of positions: the loss in windows of `long` minus in windows
    of `short`, on the same bytes.

    Reads the per-sequence bucket means the study stores (protocol "matched_bucket") and
    bootstraps them as `bootstrap` does, paired: one draw of seeds and sequences for
    every label and bucket. Labels without values at `long` (a learned table past its
    length) are left out. Columns: label, bucket, mean, lo, hi.
    """
    part = sequences[
        (sequences.task == "lm") & (sequences.protocol == "matched_bucket")
    ]
    if part.empty:
        raise ValueError(
            "no per-bucket values (protocol 'matched_bucket') in these sequences"
        )
    values = part.set_index(["label", "seed", "bucket", "eval_len"])["values"]
    lengths = set(part.eval_len)
    if not {short, long} <= lengths:
        raise ValueError(
            f"short and long must be lengths with bucket values, {sorted(lengths)}; "
            f"got {short} and {long}"
        )
    labels = [
        l
        for l in dict.fromkeys(part.label)
        if (part[part.label == l].eval_len == long).any()
    ]
    seeds, buckets = sorted(part.seed.unique()), list(dict.fromkeys(part.bucket))
    diff = np.stack(
        [
            np.stack(
                [
                    np.stack(
                        [
                            values[(l, s, b, long)] - values[(l, s, b, short)]
                            for b in buckets
                        ]
                    )
                    for s in seeds
                ]
            )
            for l in labels
        ]
    )  # (labels, seeds, buckets, sequences)
    rng = np.random.default_rng(seed)
    n_seeds, n_items = diff.shape[1], diff.shape[3]
    seed_w, item_w = _draws(rng, n_seeds, n_items, replicates)
    boot = np.einsum("bs,lski,bi->blk", seed_w, diff, item_w)
    point = diff.mean(axis=(1, 3))
    rows = [
        {
            "label": l,
            "bucket": b,
            "mean": point[i, k],
            "lo": np.percentile(boot[:, i, k], 2.5),
            "hi": np.percentile(boot[:, i, k], 97.5),
        }
        for i, l in enumerate(labels)
        for k, b in enumerate(buckets)
    ]
    return pd.DataFrame(rows)


# --- seed-level intervals
# -------------------------------------------------------------------------


def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with df degrees of freedom (p in (0.5, 1)): its
    density integrated numerically.
    """
    if not 0.5 < p < 1 or int(df) != df or df < 1:
        raise ValueError(
            f"p must be in (0.5, 1) and df a positive integer, got p={p!r}, df={df!r}"
        )
    log_c = (
        math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    )
    # t = sqrt(df) tan(u) maps [0, pi/2) onto [0, inf) and the density c (1 +
    # t^2/df)^(-(df+1)/2) dt becomes
    # c sqrt(df) cos(u)^(df - 1) du, smooth: the trapezoid rule on this grid is exact to
    # about 1e-9
    u = np.linspace(0.0, np.pi / 2, 200_001)
    density = math.exp(log_c) * math.sqrt(df) * np.cos(u) ** (df - 1)
    cdf = 0.5 + np.concatenate(
        ([0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(u)))
    )
    return float(math.sqrt(df) * np.tan(np.interp(p, cdf, u)))


def t_interval(values, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean of per-seed values and its Student-t interval (seeds as
    the sample).
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or len(values) < 2 or not np.isfinite(values).all():
        raise ValueError(
            "values must be two or more finite numbers (one per seed), got "
            f"{values.tolist()}"
        )
    half = (
        t_quantile(0.5 + level / 2, len(values) - 1)
        * values.std(ddof=1)
        / math.sqrt(len(values))
    )
    return (
        float(values.mean()),
        float(values.mean() - half),
        float(values.mean() + half),
    )


def per_seed(
    sequences: pd.DataFrame,
    label: str,
    length: int,
    task: str = "lm",
    protocol: str = "matched",
    minus=None,
) -> pd.Series:
    """The mean over the sequences of each seed (seed -> value), of `label` at one
    length, or of `label` minus `minus` (a label, or one value per sequence that every
    seed shares), paired sequence by sequence.
    """
    labels, seeds, lengths, cube = _cube(sequences, task, protocol)
    if label not in labels or length not in lengths:
        raise ValueError(
            f"label must be one of {labels} and length one of {lengths}, got "
            f"{label!r} and {length!r}"
        )
    values = cube[labels.index(label), :, lengths.index(length)]
    if minus is not None:
        values = values - (
            cube[labels.index(minus), :, lengths.index(length)]
            if isinstance(minus, str)
            else np.asarray(minus, dtype=float)
        )
    return pd.Series(
        values.mean(axis=1), index=pd.Index(seeds, name="seed"), name=label
    )
