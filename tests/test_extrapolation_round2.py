"""The extrapolation study's second referee round: the interpolated n-gram, the copy probe, today's layer recipes,
ALiBi's slopes apart from its head count, YaRN's temperature evaluated from kept weights, the statistics of the
verdicts, and the cost of the cpu preset."""

import json
import math
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posenc import TinyTransformer
from posenc.layer import Layer, LogFloorTemperature
from posenc.qk.rope_scaling import yarn_mscale
from posenc.scheme import NoPE
from posenc.study import corpus as corpus_mod
from posenc.study import extrapolation as xp
from posenc.study import extrapolation_budget as budget
from posenc.study import extrapolation_layers as layers
from posenc.study import extrapolation_runs as runs
from posenc.study import longcontext, ngram, summary, verdicts
from posenc.study.extrapolation_weights import WeightCache

ROOT = Path(__file__).resolve().parents[1]
# two layers of two heads: a recipe has a local and a global layer, ALiBi two slopes
TINY = replace(xp.PRESETS["smoke"], steps=2, finetune_steps=1, eval_sequences=2, sliding_sequences=2, passkey_count=2,
               probe_sequences=2, num_layers=2, num_heads=2,
               variations=(xp.Variation("slopes_L", ("alibi",), (0,), alibi_slopes=(0.5, 1 / 32)),
                           xp.Variation("heads4_two_slopes", ("alibi",), (0,), num_heads=4,
                                        alibi_slopes=(1 / 16,) * 2 + (1 / 256,) * 2)),
               ablations=(xp.Ablation("temperature", (0,)),))
LABELS = ["rope", "alibi", "rnope_swa", "irope"]


@pytest.fixture(scope="module")
def corpus():
    return corpus_mod.load_corpus(max_bytes=1_000_000)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """One tiny study of every new kind of run, with its weight cache."""
    out = tmp_path_factory.mktemp("study")
    cache = WeightCache(out / "weights")
    paths = xp.study(TINY, out, labels=LABELS, quiet=True, weights=cache)
    return out, cache, paths


# --- the interpolated n-gram -------------------------------------------------------------------------

def test_witten_bell_matches_counting_by_hand():
    train = torch.tensor(list(b"def f(x):\n    return x + 1\ndef g(y):\n    return y * 2\nclass A:\n    pass\n"),
                         dtype=torch.uint8)
    valid = torch.tensor(list(b"def h(z):\n    return z - 3\n"), dtype=torch.uint8)
    order = 4
    losses = ngram.witten_bell_losses(train, valid, order)
    text, padded = bytes(train.tolist()), b"\n" * (order - 1) + bytes(valid.tolist())
    unigram, seen = Counter(text), len(set(text))

    def p(n, context, x):
        if n == 1:
            return (unigram[x] + seen / 256) / (len(text) + seen)
        lower = p(n - 1, context[1:], x)
        follows = Counter(text[i + n - 1] for i in range(len(text) - n + 1) if text[i : i + n - 1] == context)
        total = sum(follows.values())
        return lower if total == 0 else (follows[x] + len(follows) * lower) / (total + len(follows))

    for n in range(1, order + 1):
        expected = [-math.log(p(n, padded[t + order - n : t + order - 1], padded[t + order - 1])) for t in range(len(valid))]
        assert torch.allclose(losses[n], torch.tensor(expected, dtype=torch.float64)), n
    total = sum(math.exp(-ngram.witten_bell_losses(train, torch.tensor([b], dtype=torch.uint8), 3)[3].item())
                for b in range(256))  # one context (newlines): a distribution over the next byte
    assert total == pytest.approx(1.0, abs=1e-9)
    with pytest.raises(ValueError, match="order must be in"):
        ngram.witten_bell_losses(train, valid, 8)


def test_interpolation_beats_add_k_and_falls_with_order(corpus):
    wb = ngram.witten_bell_losses(corpus.train, corpus.valid, 5)
    add_k = ngram.ngram_baselines(corpus.train, corpus.valid)
    assert wb[2].mean() > wb[3].mean() > wb[4].mean() > wb[5].mean()
    assert float(wb[4].mean()) < add_k["4gram"]["loss"]  # backing off beats the uniform guess for unseen contexts


# --- the copy probe ------------------------------------------------------------------------------------

def test_probe_sequences_place_the_earlier_copy_where_the_window_sees_it(corpus):
    L, segment, factors = 16, 8, (1, 2, 4, 8)
    distances = longcontext.probe_distances(L, factors, segment)
    assert distances == {16: 8, 32: 24, 64: 56, 128: 120}
    control, copies = longcontext.probe_sequences(corpus.valid, 3, 8 * L, segment, distances.values())
    assert control.shape == (3, 8 * L + 1) and set(copies) == set(distances.values())
    for d, copy in copies.items():
        assert torch.equal(copy[:, -segment:], control[:, -segment:])  # the same targets
        assert torch.equal(copy[:, -segment - d : -d], control[:, -segment:])  # the earlier copy, d bytes back
        differs = (copy != control).any(0).nonzero().flatten()
        assert differs.min() >= 8 * L + 1 - d - segment and differs.max() < 8 * L + 1 - d
    # its segment is not taken from the window it ends
    assert not any(bytes(control[z, -segment:].tolist()) in bytes(control[z, :-segment].tolist()) for z in range(3))
    _, flipped = longcontext.probe_sequences(corpus.valid, 3, 8 * L, segment, distances.values(), reverse=True)
    for d, copy in flipped.items():  # the same bytes, back to front
        assert torch.equal(copy[:, -segment - d : -d], control[:, -segment:].flip(1))
        assert torch.equal(copy[:, -segment:], control[:, -segment:])
    with pytest.raises(ValueError, match="distances must lie in"):
        longcontext.probe_sequences(corpus.valid, 3, 8 * L, segment, [4])


def test_copy_gain_is_zero_out_of_sight_and_an_oracle_copier_gains_in_sight(corpus):
    """A window that ends before the earlier copy sees the same bytes as the control; a model that copies the byte
    that followed the last occurrence of its current byte loses almost nothing once the copy is in sight."""
    torch.manual_seed(0)
    model = TinyTransformer(256, dim=16, num_heads=2, num_layers=1, scheme="rope", backend="sdpa").eval()
    L, segment = 16, 8
    distances = longcontext.probe_distances(L, (1, 2, 4), segment)
    noise = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    control, copies = longcontext.probe_sequences(noise, 4, 4 * L, segment, distances.values())
    for n in (16, 32, 64):
        base = longcontext.segment_losses(model, control, n, segment)
        for d, copy in copies.items():
            gap = (base - longcontext.segment_losses(model, copy, n, segment)).abs().max()
            assert (gap == 0) == (d + segment > n), (n, d)

    class Copier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):  # predicts, at each position, what followed the previous occurrence of the current
            # 4 bytes (an induction head of a 4-byte key)
            out = torch.zeros(*x.shape, 256)
            for b in range(x.shape[0]):
                row = x[b].tolist()
                for i in range(len(row)):
                    key = row[max(0, i - 3) : i + 1]
                    j = next((j for j in range(i - 1, len(key) - 2, -1) if row[j - len(key) + 1 : j + 1] == key), None)
                    out[b, i, row[j + 1] if j is not None else 0] = 20.0
            return out

    copier = Copier()
    in_sight = longcontext.segment_losses(copier, copies[distances[32]], 32, segment)
    out_of_sight = longcontext.segment_losses(copier, copies[distances[32]], 16, segment)
    assert in_sight[:, 4:].mean() < 1e-3 < out_of_sight[:, 4:].mean()  # the first bytes need a 4-byte key first
    _, flipped = longcontext.probe_sequences(noise, 4, 4 * L, segment, distances.values(), reverse=True)
    backwards = longcontext.segment_losses(copier, flipped[distances[32]], 32, segment)
    assert backwards[:, 4:].mean() > 1  # a copier cannot follow a reversed copy


def test_the_study_stores_the_probe_at_every_length_and_copy_gains_read_it(stored):
    out, _, (csv_path, seq_path, _) = stored
    rows = pd.read_csv(csv_path)
    probe = rows[(rows.task == "copy") & (rows.run == "rope") & (rows.variant == "trained")]
    L = TINY.train_len
    assert set(probe.eval_len) == {f * L for f in TINY.eval_factors}
    assert set(probe[probe.protocol == "copy"].bucket.astype(int)) == {f * L - L // 2 for f in TINY.eval_factors}
    assert set(probe[probe.protocol == "copy_reversed"].bucket) == set(probe[probe.protocol == "copy"].bucket)
    sequences = summary.read_sequences(seq_path.read_text())
    gains = verdicts.copy_gains(sequences, "irope")
    assert set(gains.columns) == {"seed", "eval_len", "distance", "gain", "reversed_gain", "in_sight"}
    assert (gains[~gains.in_sight].gain.abs() < 1e-9).all() and gains.in_sight.sum() == 10  # 4 + 3 + 2 + 1 in sight
    assert (gains[~gains.in_sight].reversed_gain.abs() < 1e-9).all() and gains.reversed_gain.notna().all()
    assert (gains.in_sight == (gains.distance + L // 2 <= gains.eval_len)).all()


# --- today's layer recipes, ALiBi's slopes -------------------------------------------------------------

def test_recipes_put_a_global_layer_after_three_local_ones():
    four = replace(TINY, num_layers=8, train_len=64, num_heads=2, dim=64)
    swa, irope = layers.recipe_layers("rnope_swa", four), layers.recipe_layers("irope", four)
    assert [type(s).__name__ for s in swa] == ["Layer"] * 3 + ["NoPE"] + ["Layer"] * 3 + ["NoPE"]
    assert swa[0].window == 16 and swa[0].inner.name == "rope" and swa[0].inner.head_dim == 32
    assert [s.mask.key for s in irope if s.mask is not None] == [("chunked", 16)] * 6
    glob = irope[3]
    assert isinstance(glob, Layer) and glob.inner is None or isinstance(glob.inner, NoPE)
    assert glob.temperature == LogFloorTemperature(0.1, 16, 1.0)  # Llama 4's form, stepping every chunk
    assert [type(s).__name__ for s in layers.recipe_layers("rnope_swa", replace(four, num_layers=2))] == ["Layer", "NoPE"]
    with pytest.raises(ValueError, match="unknown recipe"):
        layers.recipe_layers("rope", four)


def test_recipe_models_train_and_their_local_layers_never_reach_past_the_window(corpus):
    preset = replace(TINY, num_layers=4)
    for label in layers.RECIPES:
        rows, _ = xp.run(label, 0, preset, corpus)
        far = {r["bucket"]: r["value"] for r in rows if r["task"] == "attention" and r["metric"] == "far_mass"
               and r["eval_len"] == 8 * preset.train_len}
        assert all(far[f"layer{i}.head{h}"] == 0 for i in range(3) for h in range(2)), label  # local: nothing L back
        assert all(far[f"layer3.head{h}"] > 0 for h in range(2)), label  # the global layer reaches far
        assert all(0 < r["value"] < 10 for r in rows if r["metric"] == "loss" and r["task"] == "lm")
    counts = layers.parameter_counts(preset, ["rope", "nope", "rnope_swa", "irope", "alibi:slopes_L", "alibi"])
    assert len(set(counts.values())) == 1  # recipes and slopes add no parameter


def test_sloped_alibi_uses_the_variation_slopes_in_every_layer():
    for run, slopes in (("alibi:slopes_L", [0.5, 1 / 32]), ("alibi:heads4_two_slopes", [1 / 16] * 2 + [1 / 256] * 2)):
        label, variant, preset = TINY.for_run(run)
        model = runs.build_model(label, preset, "cpu")
        assert all(block.scheme.slopes.tolist() == slopes for block in model.blocks), run
    assert runs.build_model("alibi", TINY, "cpu").blocks[0].scheme.slopes.tolist() == [1 / 16, 1 / 256]  # the paper's
    with pytest.raises(ValueError, match="ALiBi slopes for"):
        runs.build_model("alibi", replace(TINY, alibi_slopes=(0.5,)), "cpu")
    with pytest.raises(ValueError, match="slopes must be positive"):
        layers.SlopedALiBi([0.5, -1.0])


def test_the_cpu_preset_separates_alibi_slopes_from_its_head_count():
    cpu = xp.PRESETS["cpu"]
    slopes = {name: cpu.for_run(f"alibi:{name}")[2] for name in ("slopes_L", "heads8_two_slopes")}
    assert slopes["slopes_L"].num_heads == 2 and slopes["slopes_L"].alibi_slopes == (1 / 2, 1 / 32)
    assert [s * cpu.train_len for s in slopes["slopes_L"].alibi_slopes] == [32, 2]  # Press et al.'s bias at their L
    assert slopes["heads8_two_slopes"].num_heads == 8 and set(slopes["heads8_two_slopes"].alibi_slopes) == {1 / 16, 1 / 256}
    for name in ("heads8", "slopes_L", "heads8_two_slopes"):
        assert {seed for run, seed in cpu.runs if run == f"alibi:{name}"} == {0, 1, 2}
    assert set(cpu.labels) >= {"rnope_swa", "irope"} and {s for r, s in cpu.runs if r == "irope"} == set(cpu.seeds)


# --- YaRN's temperature, from kept weights ---------------------------------------------------------------

def test_temperature_twins_move_the_factor_alone():
    twins = {(t.label, t.variant): t for t in layers.ablation_twins("temperature", TINY)}
    heat = yarn_mscale(float(TINY.finetune_factor))
    assert twins[("rope_pi_temp", "zero-shot")].temperature == heat and twins[("rope_pi_temp", "toggled")].source == "rope_pi"
    assert twins[("rope_yarn_notemp", "toggled")].rope_args["attention_factor"] == 1.0
    torch.manual_seed(0)
    model = TinyTransformer(256, dim=16, num_heads=2, num_layers=1, scheme="rope", backend="sdpa")
    hot = layers.with_rope(model, heat, rope_type="linear", factor=4.0).blocks[0].scheme
    cold = layers.with_rope(model, rope_type="linear", factor=4.0).blocks[0].scheme
    x = torch.randn(1, 2, 8, 8)
    assert torch.allclose(hot.transform_qk(x, range(8)), heat * cold.transform_qk(x, range(8)), atol=1e-6)
    yarn = layers.with_rope(model, **layers.rescalings(TINY)["rope_yarn_notemp"]).blocks[0].scheme
    assert yarn.attention_factor == 1.0 and layers.with_rope(model, **layers.rescalings(TINY)["rope_yarn"]).blocks[
        0].scheme.attention_factor == pytest.approx(heat)
    with pytest.raises(ValueError, match="unknown ablation"):
        layers.ablation_twins("sinks", TINY)


def test_an_ablation_reads_the_kept_weights_and_equals_one_that_trains_again(stored, corpus, monkeypatch):
    out, cache, (csv_path, _, json_path) = stored
    saved = cache.load(TINY, "rope", 0)
    assert set(saved) == {"trained", "rope_at_L", *layers.rescalings(TINY)}
    assert cache.folder(TINY, "rope", 0).parent.parent.parent == cache.root and cache.load(TINY, "nope", 0) is None
    assert cache.load(TINY, "alibi:slopes_L", 0) is not None  # every trained run keeps its weights
    from_cache = xp.run("rope:temperature", 0, TINY, corpus, weights=cache)
    monkeypatch.setattr(runs, "train_run", lambda *a, **k: pytest.fail("an ablation with kept weights trained"))
    assert xp.run("rope:temperature", 0, TINY, corpus, weights=cache) == from_cache
    monkeypatch.undo()
    assert xp.run("rope:temperature", 0, TINY, corpus) == from_cache  # no cache: the RoPE run again, the same bits
    labels = {(r["scheme"], r["variant"]) for r in from_cache[0]}
    assert labels == {(t.label, t.variant) for t in layers.ablation_twins("temperature", TINY)}
    meta = json.loads(json_path.read_text())
    assert meta["wall_seconds"]["rope:temperature/0"] < meta["wall_seconds"]["rope/0"]


def test_check_reproduces_one_run_of_each_new_kind_bit_for_bit(stored):
    out, cache, (_, _, json_path) = stored
    wanted = ["rope/0", "rope:temperature/0", "irope/0", "rnope_swa/0", "alibi:slopes_L/0", "alibi:heads4_two_slopes/0"]
    outcomes = xp.check(TINY, out, wanted, cache)
    assert [o["run"] for o in outcomes] == wanted and all(o["identical"] and o["sequence_rows"] > 0 for o in outcomes)
    meta = json.loads(json_path.read_text())
    assert {c["run"] for c in meta["reproduction_checks"]} == set(wanted) and all(c["date"] >= meta["date_end"]
                                                                                     for c in meta["reproduction_checks"])
    with pytest.raises(ValueError, match="no stored rows"):
        xp.check(TINY, out, ["nope/0"], cache)


def test_the_weight_cache_stays_outside_the_repository_and_keys_on_the_preset(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="outside the repository"):
        WeightCache(ROOT / "chapters" / "weights")
    monkeypatch.setenv("POSENC_WEIGHTS", str(tmp_path / "w"))
    cache = WeightCache()
    assert cache.root == tmp_path / "w" and cache.key(TINY) != cache.key(replace(TINY, lr=1.0))
    assert cache.key(TINY) == cache.key(replace(TINY, jobs=2))  # how many run side by side changes no weight
    model = torch.nn.Linear(3, 2)
    cache.save(TINY, "nope", 1, {"trained": model})
    assert torch.equal(cache.load(TINY, "nope", 1)["trained"]["weight"], model.weight)
    (cache.folder(TINY, "nope", 1) / "complete.json").unlink()
    assert cache.load(TINY, "nope", 1) is None  # a run killed while saving leaves nothing that is read


def test_runs_side_by_side_start_an_ablation_after_its_rope_run(tmp_path, stored):
    """Two processes: the ablation waits for the RoPE run of its seed; the files are those of one process."""
    two = xp.study(replace(TINY, jobs=2, threads=1), tmp_path, labels=["rope", "alibi"], quiet=True,
                   weights=WeightCache(tmp_path / "weights"))
    mine = pd.read_csv(two[0])
    theirs = pd.read_csv(stored[2][0])
    theirs = theirs[theirs.run.isin(set(mine.run))].reset_index(drop=True)
    assert mine.astype(str).equals(theirs.astype(str))


# --- statistics of the verdicts --------------------------------------------------------------------------

@pytest.mark.parametrize("df", [1, 2, 4, 30])
def test_t_cdf_inverts_t_quantile(df):
    for p in (0.6, 0.9, 0.975, 0.999):
        assert verdicts.t_cdf(summary.t_quantile(p, df), df) == pytest.approx(p, abs=1e-8)
        assert verdicts.t_cdf(-summary.t_quantile(p, df), df) == pytest.approx(1 - p, abs=1e-8)
    assert verdicts.t_cdf(math.inf, df) == 1.0 and verdicts.t_cdf(0.0, df) == pytest.approx(0.5)


def test_t_test_binomial_interval_and_holm_against_known_values():
    test = verdicts.t_test([1.0, 2.0, 3.0])
    assert test["p"] == pytest.approx(2 * (1 - verdicts.t_cdf(2 / (1 / math.sqrt(3)), 2))) and 0.07 < test["p"] < 0.08
    assert verdicts.t_test([2.0, 2.0])["p"] == 0.0 and verdicts.t_test([0.0, 0.0])["p"] == 1.0
    assert verdicts.binomial_interval(3, 5) == pytest.approx((0.146633, 0.947255), abs=1e-5)  # Clopper-Pearson tables
    assert verdicts.binomial_interval(0, 5) == pytest.approx((0.0, 0.521824), abs=1e-5)
    assert verdicts.binomial_interval(5, 5) == pytest.approx((0.478176, 1.0), abs=1e-5)
    lo, hi = verdicts.binomial_interval(80, 160)
    assert lo == pytest.approx(1 - hi, abs=1e-9) and 0.41 < lo < 0.43
    assert np.allclose(verdicts.holm([0.01, 0.04, 0.03, 0.2]), [0.04, 0.09, 0.09, 0.2])
    with pytest.raises(ValueError, match="0 <= k <= n"):
        verdicts.binomial_interval(6, 5)


def test_a_family_labels_what_survives_holm_and_what_is_exploratory():
    family = verdicts.Family("section")
    family.claim("clear", [0.5, 0.52, 0.49, 0.51, 0.5])
    family.claim("borderline", [0.077, 0.048, 0.026, 0.243, 0.202])  # T5's 8L sliding rise in the first run
    family.claim("wrong sign", [-0.5, -0.52, -0.49, -0.51, -0.5], expect=">")
    table = family.table()
    assert table.loc["clear", "label"] == "holds" and table.loc["borderline", "label"] == "exploratory"
    assert table.loc["wrong sign", "label"] == "exploratory" and not table.loc["wrong sign", "sign_as_stated"]
    assert (table.p_holm >= table.p).all()
    with pytest.raises(ValueError, match="already in family"):
        family.claim("clear", [1.0, 2.0])


# --- what the cpu preset costs -------------------------------------------------------------------------------

def test_the_cpu_preset_is_priced_from_the_stored_run_within_two_and_a_half_hours():
    cpu = xp.PRESETS["cpu"]
    meta = json.loads((ROOT / "chapters" / "results" / "extrapolation_cpu.json").read_text())
    seconds = budget.cpu_seconds(cpu, meta)
    assert set(seconds) == set(cpu.runs)
    # a recorded run costs what its fastest seed cost (the others were slowed or paused beside other work), plus
    # what is new in it
    recorded = pd.Series(meta["wall_seconds"]).groupby(lambda k: k.rpartition("/")[0]).min()
    priced = pd.Series(seconds).groupby(level=0).mean()
    for run in set(recorded.index) & set(priced.index):
        base = recorded[budget.ANALOGUES.get(run, run)]  # a run priced from its analogue's
        assert base - 1e-9 <= priced[run] <= base + 2 * budget.CPU_FINETUNE_S + 13 * budget.CPU_PROBE_S, run
    assert budget.wall_minutes(cpu, seconds) <= 155  # "at most about two and a half hours"
    assert budget.wall_minutes(replace(cpu, jobs=1), seconds) == pytest.approx(sum(seconds.values()) / 60 + 2)
    assert xp.run_counts(cpu, "rope:temperature") == (0, 7) and xp.run_counts(cpu, "rope") == (2500 + 7 * 200, 13)
    gpu = xp.estimate(xp.PRESETS["gpu"], "h100")
    assert gpu["estimate_s"] == pytest.approx(90 + gpu["steps"] * 0.025 + gpu["evaluations"] * 20)


def test_the_study_only_modules_are_left_out_of_the_benchmark_digest():
    """A change to the extrapolation study must not make the benchmark's stored results look stale."""
    from posenc.study import runinfo

    new = {"study/extrapolation_layers.py", "study/extrapolation_weights.py", "study/extrapolation_check.py",
           "study/longcontext.py", "study/verdicts.py"}
    assert new <= runinfo.NOT_BENCHMARKED, sorted(new - runinfo.NOT_BENCHMARKED)
