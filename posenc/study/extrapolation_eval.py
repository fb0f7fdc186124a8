"""Scoring one trained model of the extrapolation study, at every length.

`Evaluation` holds a preset's fixed validation sequences, passkey tests and copy-probe
sequences and scores a model on them (matched and sliding losses, passkey retrieval by
depth, the copy probe of posenc.study.longcontext); `attention_profile` records where
each head attends.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..core import attention
from ..model import TinyTransformer
from .evaluate import matched_losses, sliding_losses, spaced_starts
from .extrapolation_presets import Preset
from .longcontext import probe_distances, probe_sequences, segment_losses
from .passkey import passkey_correct, test_batch

if TYPE_CHECKING:  # run's World, which imports this module
    from .extrapolation_runs import World


def _bucket(b: int, width: int) -> str:
    """The name of bucket b of positions: "64-128" for b = 1 at width 64."""
    return f"{b * width}-{(b + 1) * width}"


def _row(protocol: str, n: int, value: float, metric: str = "loss", **keys) -> dict:
    """One result row: a protocol's metric at evaluation length n (keys: its bucket or
    depth)."""
    return {
        "protocol": protocol,
        "eval_len": n,
        **keys,
        "metric": metric,
        "value": value,
    }


def _unreached(protocol: str, n: int, error: Exception, metric="loss", **keys) -> dict:
    """The row of a length the model cannot take (a learned table has no row past it):
    no value, the error's first words as its note."""
    note = str(error).split(":")[0]
    return {**_row(protocol, n, math.nan, metric, **keys), "note": note}


def _as_text(values: torch.Tensor) -> str:
    """Per-sequence losses as the sequences file stores them: space-separated, 4
    decimals.
    """
    return " ".join(f"{v:.4f}" for v in values.tolist())


class Evaluation:
    """The fixed validation sequences and passkey tests of a preset, scored for one
    model at a time.
    """

    def __init__(self, corpus, preset: Preset, world: World):
        self.preset, self.world = preset, world
        L, longest = preset.train_len, max(preset.eval_factors) * preset.train_len
        valid = corpus.valid
        matched_at = spaced_starts(len(valid), longest + 1, preset.eval_sequences)
        # sliding: L targets after a context of the longest window, placed halfway
        # between the matched sequences
        sliding_at = longest // 2 + spaced_starts(
            len(valid) - longest // 2, longest + L + 1, preset.sliding_sequences
        )
        self.matched = torch.stack(
            [valid[s : s + longest + 1] for s in matched_at.tolist()]
        ).long()
        self.sliding = torch.stack(
            [valid[s : s + longest + L + 1] for s in sliding_at.tolist()]
        ).long()
        # where each protocol's target bytes sit in the validation split: the n-gram
        # baselines score exactly these
        self.targets = {
            "matched": matched_at[:, None] + torch.arange(1, longest + 1),
            "sliding": sliding_at[:, None] + torch.arange(longest + 1, longest + L + 1),
        }
        self.passkey_tests = {
            (f * L, d): test_batch(f * L, d, preset.passkey_count)
            for f in preset.eval_factors
            for d in preset.depths
        }
        # the copy probe: at length n, the earlier copy lies D = n - segment back
        self.segment = max(1, L // 2)
        self.distances = probe_distances(L, preset.eval_factors, self.segment)
        self.probe_control, self.probe_copies, self.probe_reversed = None, {}, {}
        if preset.probe_sequences:
            args = (valid, preset.probe_sequences, longest, self.segment)
            found = self.distances.values()
            self.probe_control, self.probe_copies = probe_sequences(*args, found)
            self.probe_reversed = probe_sequences(*args, found, reverse=True)[1]

    def _mine(self, x: torch.Tensor) -> torch.Tensor:
        return x[self.world.split(len(x))]

    def lm(self, model, buckets: bool = False) -> tuple[list[dict], list[dict]]:
        """(rows, per-sequence rows) of both protocols at every length.

        With `buckets`, the per-sequence rows also hold, at L and at the longest length,
        the mean loss of each bucket of L positions of every matched sequence (protocol
        "matched_bucket"): the pairs that posenc.study.summary.bucket_rise bootstraps.
        """
        p, L = self.preset, self.preset.train_len
        rows, seqs = [], []
        for factor in p.eval_factors:
            n = factor * L
            try:
                matched = self.world.gather(
                    matched_losses(model, self._mine(self.matched), n)
                )
                sliding = self.world.gather(
                    sliding_losses(
                        model, self._mine(self.sliding), n, L, p.sliding_stride
                    )
                )
            except ValueError as exc:  # a learned table has no row past its length
                rows += [
                    _unreached(proto, n, exc, bucket="all")
                    for proto in ("matched", "sliding")
                ]
                continue
            for proto, losses in (("matched", matched), ("sliding", sliding)):
                rows.append(_row(proto, n, float(losses.mean()), bucket="all"))
                seqs.append(
                    {
                        "protocol": proto,
                        "eval_len": n,
                        "values": _as_text(losses.mean(1)),
                    }
                )
            if buckets and factor in (1, max(p.eval_factors)):
                by_bucket = matched.reshape(len(matched), -1, L).mean(
                    2
                )  # (sequences, buckets)
                seqs += [
                    {
                        "protocol": "matched_bucket",
                        "eval_len": n,
                        "bucket": _bucket(b, L),
                        "values": _as_text(by_bucket[:, b]),
                    }
                    for b in range(by_bucket.shape[1])
                ]
            per_position = matched.mean(0)
            for b in range(len(per_position) // L):
                mean = float(per_position[b * L : (b + 1) * L].mean())
                rows.append(_row("matched", n, mean, bucket=_bucket(b, L)))
        return rows, seqs

    def passkey(self, model) -> tuple[list[dict], list[dict]]:
        rows, seqs = [], []
        for (n, depth), (x, y) in self.passkey_tests.items():
            try:
                correct = self.world.gather(
                    passkey_correct(model, self._mine(x), self._mine(y))
                )
            except ValueError as exc:
                rows.append(_unreached("passkey", n, exc, "exact_match", depth=depth))
                continue
            match = float(correct.double().mean())
            rows.append(_row("passkey", n, match, "exact_match", depth=depth))
            seqs.append(
                {
                    "protocol": "passkey",
                    "eval_len": n,
                    "depth": depth,
                    "values": "".join("1" if c else "0" for c in correct.tolist()),
                }
            )
        return rows, seqs

    def probe(self, model) -> tuple[list[dict], list[dict]]:
        """(rows, per-sequence rows) of the copy probe at every length: the loss of the
        last segment of the control sequences (protocol "copy_control"), of each copy
        (protocol "copy", bucket: its distance D) and of each reversed copy (protocol
        "copy_reversed"), per sequence the segment's mean."""
        rows, seqs = [], []
        if self.probe_control is None:
            return rows, seqs
        for factor in self.preset.eval_factors:
            n = factor * self.preset.train_len
            sets = [("copy_control", "", self.probe_control)]
            sets += [("copy", str(d), x) for d, x in self.probe_copies.items()]
            sets += [
                ("copy_reversed", str(d), x) for d, x in self.probe_reversed.items()
            ]
            for protocol, bucket, x in sets:
                try:
                    losses = self.world.gather(
                        segment_losses(model, self._mine(x), n, self.segment)
                    )
                except ValueError as exc:  # a learned table has no row past it
                    rows.append(_unreached(protocol, n, exc, bucket=bucket))
                    continue
                rows.append(_row(protocol, n, float(losses.mean()), bucket=bucket))
                seqs.append(
                    {
                        "protocol": protocol,
                        "eval_len": n,
                        "bucket": bucket,
                        "values": _as_text(losses.mean(1)),
                    }
                )
        return rows, seqs

    def attention(self, model) -> list[dict]:
        """Rows of `attention_profile` on the first window of every matched sequence, at
        every length the model takes.
        """
        p, rows = self.preset, []
        for factor in p.eval_factors:
            n = factor * p.train_len
            try:
                profile = attention_profile(model, self.matched[:, :n], p.train_len)
            except ValueError:  # a learned table has no row past its length
                continue
            rows += [{"protocol": "matched", "eval_len": n, **r} for r in profile]
        return rows

    def __call__(
        self, model, buckets: bool = False, attention: bool = False
    ) -> tuple[list[dict], list[dict]]:
        lm_rows, lm_seqs = self.lm(model, buckets)
        pk_rows, pk_seqs = self.passkey(model)
        cp_rows, cp_seqs = self.probe(model)
        tag = lambda rows, task: [{"task": task, **r} for r in rows]  # noqa: E731
        at_rows = (
            tag(self.attention(model), "attention")
            if attention and self.world.main
            else []
        )
        rows = tag(lm_rows, "lm") + tag(pk_rows, "passkey") + tag(cp_rows, "copy")
        seqs = tag(lm_seqs, "lm") + tag(pk_seqs, "passkey") + tag(cp_seqs, "copy")
        return rows + at_rows, seqs


@torch.no_grad()
def attention_profile(
    model: TinyTransformer, windows: torch.Tensor, train_len: int, batch_size: int = 16
) -> list[dict]:
    """Where each head of each layer attends, for the last train_len/2 queries of
    `windows` (rows of n bytes).

    Per layer and head (bucket "layer0.head1"), the mean over those queries of: the
    entropy of the attention weights (metric "entropy", nats; ln of the number of keys
    for a uniform spread), the weight on keys at least train_len bytes back ("far_mass":
    distances never seen in training) and the weighted mean distance i - j
    ("mean_distance"). The weights are the explicit backend's, computed from each
    block's own input and projections.
    """
    device = next(model.parameters()).device
    n, first = windows.shape[1], windows.shape[1] - max(1, train_len // 2)
    sums: dict[int, torch.Tensor] = {}

    def capture(index):
        def hook(block, args):
            x, positions, mask = (*args, None)[:3]
            batch, length, dim = x.shape
            q, k, v = (
                block.qkv(block.norm1(x))
                .view(batch, length, 3, block.num_heads, dim // block.num_heads)
                .permute(2, 0, 3, 1, 4)
            )
            _, w = attention(
                q,
                k,
                v,
                block.scheme,
                causal=block.causal,
                mask=mask,
                q_positions=positions,
                k_positions=positions,
                backend="explicit",
                scale=block.scale,
                return_weights=True,
            )
            w = w[:, :, first:, :].double()  # (batch, heads, queries, keys)
            distance = (
                torch.arange(first, n, device=w.device)[:, None]
                - torch.arange(n, device=w.device)
            ).double()
            stats = torch.stack(
                (
                    -torch.special.xlogy(w, w).sum(-1),
                    (w * (distance >= train_len)).sum(-1),
                    (w * distance).sum(-1),
                )
            )
            # (3, heads)
            sums[index] = sums.get(index, 0) + stats.sum(dim=(1, 3)).cpu()

        return hook

    handles = [
        block.register_forward_pre_hook(capture(i))
        for i, block in enumerate(model.blocks)
    ]
    try:
        for at in range(0, len(windows), batch_size):
            model(windows[at : at + batch_size].to(device))
    finally:
        for handle in handles:
            handle.remove()
    count = len(windows) * (n - first)
    return [
        {
            "bucket": f"layer{layer}.head{head}",
            "metric": metric,
            "value": float(sums[layer][m, head] / count),
        }
        for layer in sorted(sums)
        for head in range(sums[layer].shape[1])
        for m, metric in enumerate(("entropy", "far_mass", "mean_distance"))
    ]
