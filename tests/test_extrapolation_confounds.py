"""The extrapolation study's controls: variations of a preset, where heads attend, baselines on the same bytes,
seed-level intervals, the corpus without generated tables, and the benchmark's digest that they leave alone."""

import dataclasses
import json
import math
import shutil
import sysconfig
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posenc import TinyTransformer, alibi_slopes
from posenc.study import corpus as corpus_mod
from posenc.study import extrapolation as xp
from posenc.study import ngram, runinfo, summary

TINY = replace(xp.PRESETS["smoke"], steps=2, finetune_steps=1, eval_sequences=2, sliding_sequences=2, passkey_count=2)


@pytest.fixture(scope="module")
def corpus():
    return corpus_mod.load_corpus(max_bytes=1_000_000)


# --- variations ---------------------------------------------------------------------------------------

def test_the_cpu_preset_runs_five_seeds_and_its_variations():
    cpu = xp.PRESETS["cpu"]
    assert cpu.seeds == (0, 1, 2, 3, 4)
    own = [(label, seed) for label in xp.SCHEMES for seed in cpu.seeds]
    assert cpu.runs[: len(own)] == own and len(set(cpu.runs)) == len(cpu.runs)
    heads8 = {name for name, _ in cpu.runs if name.endswith(":heads8")}
    assert heads8 == {f"{label}:heads8" for label in ("nope", "t5", "alibi")}  # three schemes with 8 heads, three seeds each
    assert {seed for name, seed in cpu.runs if name.endswith(":heads8")} == {0, 1, 2}
    label, variant, eight = cpu.for_run("alibi:heads8")
    assert (label, variant, eight.num_heads, eight.dim, eight.head_dim, eight.variations) == ("alibi", "heads8", 8, 64, 8, ())
    assert replace(eight, num_heads=cpu.num_heads, variations=cpu.variations) == cpu  # it changes the head count only
    assert cpu.for_run("rope:lr_half")[2].lr == cpu.lr / 2 and cpu.for_run("rope:lr_double")[2].lr == 2 * cpu.lr
    assert cpu.for_run("t5") == ("t5", "trained", cpu)
    # the same parameters with 8 heads (T5's table has a column per head: 16 x 6 more numbers)
    sizes = {h: sum(p.numel() for p in xp.build_model("alibi", replace(cpu, num_heads=h), "cpu").parameters()) for h in (2, 8)}
    assert sizes[2] == sizes[8]


def test_a_stored_preset_with_variations_reads_back_equal():
    cpu = xp.PRESETS["cpu"]
    stored = json.loads(json.dumps(dataclasses.asdict(cpu)))
    again = xp.Preset(**{k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()})
    assert again == cpu and all(isinstance(v, xp.Variation) for v in again.variations)


@pytest.mark.parametrize("make, match", [
    (lambda: xp.Variation("wide", ("bert",), (0,), num_heads=4), "schemes must be some of"),
    (lambda: xp.Variation("wide", (), (0,), num_heads=4), "schemes must be some of"),
    (lambda: xp.Variation("wide", ("rope",), (0,)), "num_heads, lr or alibi_slopes to change"),
    (lambda: xp.Variation("steep", ("rope",), (0,), alibi_slopes=(0.5,)), "sets ALiBi's slopes"),
    (lambda: xp.Variation("two words", ("rope",), (0,), lr=1.0), "identifier as its name"),
    (lambda: replace(TINY, variations=(xp.Variation("v", ("rope",), (0,), lr=1.0), xp.Variation("v", ("nope",), (0,), lr=2.0))),
     "change different things"),
    (lambda: replace(TINY, variations=(xp.Variation("v", ("rope",), (0,), lr=1.0), xp.Variation("v", ("rope",), (0, 1), lr=1.0))),
     "listed twice"),
    (lambda: TINY.for_run("rope:nosuch"), "unknown variation 'nosuch'"),
    (lambda: TINY.for_run("bert"), "unknown scheme 'bert'"),
])  # fmt: skip
def test_bad_variations_are_named(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_a_variation_trains_its_own_model_and_skips_the_extensions(corpus):
    preset = replace(TINY, variations=(xp.Variation("wide", ("rope", "t5"), (0,), num_heads=4),))
    rows, seqs = xp.run("rope:wide", 0, preset, corpus)
    assert {r["variant"] for r in rows} == {"wide"} and {r["scheme"] for r in rows} == {"rope"}  # no extensions
    heads = {r["bucket"] for r in rows if r["task"] == "attention"}
    assert heads == {f"layer0.head{h}" for h in range(4)}  # the variation's head count
    frame = summary.labelled(pd.DataFrame(seqs))
    assert set(frame.label) == {"rope (wide)"}
    assert xp.run_counts(preset, "rope:wide") == (preset.steps, 1) and xp.run_counts(preset, "rope")[1] == 1 + 5 + 7


# --- where heads attend --------------------------------------------------------------------------------

def test_attention_profile_of_a_uniform_head_is_known_in_closed_form():
    """q = k = 0 under NoPE: every query spreads evenly over its i + 1 keys, so each statistic has a formula."""
    torch.manual_seed(0)
    model = TinyTransformer(256, dim=16, num_heads=2, num_layers=2, scheme="nope", backend="sdpa").eval()
    for block in model.blocks:
        with torch.no_grad():
            block.qkv.weight[: 2 * 16].zero_()  # the query and key projections
    L, n = 8, 32
    windows = torch.randint(0, 256, (3, n))
    rows = xp.attention_profile(model, windows, L)
    i = torch.arange(n - L // 2, n, dtype=torch.float64)  # the queries it averages over: the last L/2
    expected = {"entropy": torch.log(i + 1).mean(), "far_mass": ((i + 1 - L) / (i + 1)).mean(), "mean_distance": (i / 2).mean()}
    assert len(rows) == 2 * 2 * 3
    for r in rows:
        assert r["value"] == pytest.approx(float(expected[r["metric"]]), abs=1e-6), r
    at_L = xp.attention_profile(model, windows[:, :L], L)
    assert all(r["value"] == 0 for r in at_L if r["metric"] == "far_mass")  # no key is L bytes back inside a window of L
    assert not any(block._forward_pre_hooks for block in model.blocks)  # the hooks are gone


def test_attention_profile_follows_alibi_slopes():
    """ALiBi with q = k = 0: the steep head (slope 1/2) keeps its weight near the diagonal, the gentle one (1/256) spreads."""
    model = TinyTransformer(256, dim=16, num_heads=8, num_layers=1, scheme="alibi", backend="sdpa").eval()
    with torch.no_grad():
        model.blocks[0].qkv.weight[:32].zero_()
    rows = {r["bucket"]: r["value"] for r in xp.attention_profile(model, torch.randint(0, 256, (2, 64)), 16) if r["metric"] == "entropy"}
    entropies = [rows[f"layer0.head{h}"] for h in range(8)]
    assert entropies == sorted(entropies)
    for head, slope in enumerate(alibi_slopes(8).tolist()):  # weights exp(-slope d) over the distances d = 0..i
        expected = []
        for i in range(64 - 8, 64):
            p = torch.softmax(-slope * torch.arange(i + 1, dtype=torch.float64), 0)
            expected.append(float(-(p * p.log()).sum()))
        assert entropies[head] == pytest.approx(np.mean(expected), abs=1e-5), head


# --- baselines on the same bytes -----------------------------------------------------------------------

def test_byte_losses_score_every_validation_byte_in_place():
    train = torch.tensor(list(b"def f():\n    pass\ndef g():\n    pass\n"), dtype=torch.uint8)
    valid = torch.tensor(list(b"def h():\n    pass\n"), dtype=torch.uint8)
    for n in (1, 2, 3, 4):
        per_byte = ngram.byte_losses(train, valid, n, 0.1)
        assert per_byte.shape == valid.shape
        assert torch.equal(per_byte[n - 1 :], ngram.ngram_losses(train, valid, n, 0.1))  # where the context is in valid
        padded = torch.cat((torch.full((n - 1,), ord("\n"), dtype=torch.uint8), valid))
        assert torch.equal(per_byte[: n - 1], ngram.ngram_losses(train, padded, n, 0.1)[: n - 1])  # before it, newlines


def test_evaluation_targets_are_the_bytes_the_models_score(corpus):
    preset = replace(TINY, eval_sequences=5, sliding_sequences=4)
    evaluation = xp.Evaluation(corpus, preset, xp.World())
    L = preset.train_len
    assert torch.equal(corpus.valid[evaluation.targets["matched"]].long(), evaluation.matched[:, 1:])
    assert torch.equal(corpus.valid[evaluation.targets["sliding"]].long(), evaluation.sliding[:, -L:])


def test_the_study_stores_its_baselines_on_the_target_bytes(tmp_path, corpus):
    _, _, json_path = xp.study(TINY, tmp_path, labels=["alibi"], quiet=True)
    meta = json.loads(json_path.read_text())
    evaluation = xp.Evaluation(corpus_mod.load_corpus(TINY.corpus_bytes), TINY, xp.World())
    for protocol, at in evaluation.targets.items():
        for order in ("bigram", "trigram", "4gram", "wb3", "wb4", "wb5", "wb6"):
            values = np.array(meta["ngram_targets"][protocol][order].split(), dtype=float)
            assert len(values) == len(at) and meta["ngram_on_targets"][protocol][order] == pytest.approx(values.mean(), abs=1e-4)
    c = corpus_mod.load_corpus(TINY.corpus_bytes)
    direct = ngram.byte_losses(c.train, c.valid, 4, meta["ngram_add_k"]["4gram"])[evaluation.targets["sliding"]].mean(1)
    assert np.allclose(np.array(meta["ngram_targets"]["sliding"]["4gram"].split(), dtype=float), direct.numpy(), atol=5e-5)


# --- seed-level intervals ------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.9, 0.95, 0.975, 0.995])
def test_t_quantile_matches_the_closed_forms(p):
    assert summary.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-7)  # Cauchy
    assert summary.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-7)
    normal = float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(p, dtype=torch.float64)))
    assert summary.t_quantile(p, 5000) == pytest.approx(normal, rel=2e-3)
    assert summary.t_quantile(p, 3) > summary.t_quantile(p, 4) > summary.t_quantile(p, 30) > normal


def test_t_interval_and_its_errors():
    mean, lo, hi = summary.t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and hi - mean == pytest.approx(summary.t_quantile(0.975, 2) * 1 / math.sqrt(3))
    assert summary.t_interval([5.0, 5.0]) == (5.0, 5.0, 5.0)
    for bad in ([1.0], [1.0, float("nan")], [[1.0, 2.0]]):
        with pytest.raises(ValueError, match="one per seed"):
            summary.t_interval(bad)
    with pytest.raises(ValueError, match="p must be in"):
        summary.t_quantile(0.3, 4)


def test_per_seed_and_differences_against_a_baseline_on_the_same_sequences():
    rng = np.random.default_rng(1)
    text = rng.normal(2.0, 0.4, 30)  # per-sequence difficulty, shared by everything scored on those bytes
    rows = [{"task": "lm", "scheme": "m", "variant": "trained", "seed": s, "protocol": "sliding", "eval_len": 8,
             "values": text - 0.1 + 0.02 * s + rng.normal(0, 0.01, 30)} for s in range(4)]
    rows += [{"task": "lm", "scheme": "base", "variant": "trained", "seed": s, "protocol": "sliding", "eval_len": 8, "values": text}
             for s in range(4)]
    frame = summary.labelled(pd.DataFrame(rows))
    gaps = summary.per_seed(frame, "m", 8, "lm", "sliding", minus=text)
    assert list(gaps.index) == [0, 1, 2, 3] and np.allclose(gaps, [-0.1, -0.08, -0.06, -0.04], atol=0.01)
    assert gaps.equals(summary.per_seed(frame, "m", 8, "lm", "sliding", minus="base"))
    as_array = summary.difference(frame, "m", text, 8, "lm", "sliding", replicates=300)
    assert as_array == summary.difference(frame, "m", "base", 8, "lm", "sliding", replicates=300)
    assert as_array[1] < as_array[0] < as_array[2] < 0 and as_array[2] - as_array[1] < 0.08  # paired: the text's spread (0.4) cancels
    with pytest.raises(ValueError, match="one value per sequence"):
        summary.difference(frame, "m", text[:5], 8, "lm", "sliding")
    with pytest.raises(ValueError, match="label must be one of"):
        summary.per_seed(frame, "x", 8, "lm", "sliding")


# --- the corpus without generated tables -------------------------------------------------------------

def test_generated_codec_tables_are_left_out():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = {p.relative_to(root).as_posix() for p in corpus_mod.stdlib_files()}
    assert "encodings/utf_8.py" in files and "encodings/cp1252.py" not in files and "encodings/mac_roman.py" not in files
    assert not any(corpus_mod.CODEC_TABLE in (root / f).read_bytes()[:200] for f in files if f.startswith("encodings/"))
    assert corpus_mod.generated(root / "encodings/cp720.py", "encodings/cp720.py")  # made by another script, the same docstring


# --- the benchmark's digest ----------------------------------------------------------------------------

def test_the_benchmark_digest_ignores_the_study_and_follows_the_measured_code(tmp_path):
    assert all((runinfo.PACKAGE / name).is_file() for name in runinfo.NOT_BENCHMARKED)  # no stale name
    copy = tmp_path / "posenc"
    shutil.copytree(runinfo.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = runinfo.source_sha256(copy), runinfo.benchmarked_sha256(copy)
    assert before == (runinfo.source_sha256(), runinfo.benchmarked_sha256())
    (copy / "study" / "summary.py").write_text((copy / "study" / "summary.py").read_text() + "\n# a change to the study\n")
    study_changed = runinfo.source_sha256(copy), runinfo.benchmarked_sha256(copy)
    assert study_changed[0] != before[0] and study_changed[1] == before[1]
    (copy / "core.py").write_text((copy / "core.py").read_text() + "\n# a change to what is measured\n")
    assert runinfo.benchmarked_sha256(copy) != before[1]
