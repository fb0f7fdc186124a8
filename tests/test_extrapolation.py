import csv
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from posenc import TinyTransformer
from posenc.study import corpus as corpus_mod
from posenc.study import evaluate as ev
from posenc.study import extrapolation as xp
from posenc.study import ngram
from posenc.study import passkey as pk
from posenc.study import summary

ROOT = Path(__file__).resolve().parents[1]
TINY = xp.replace(xp.PRESETS["smoke"], steps=2, finetune_steps=1, eval_sequences=2, sliding_sequences=2, passkey_count=2)


@pytest.fixture(scope="module")
def corpus():
    return corpus_mod.load_corpus(max_bytes=1_000_000)


def test_corpus_is_the_standard_library_split_by_file_and_hashed(corpus):
    files = corpus_mod.stdlib_files()
    assert files and all(p.suffix == ".py" and "site-packages" not in p.parts for p in files)
    assert [p.as_posix() for p in files] == sorted(p.as_posix() for p in files)
    assert not any(p.as_posix().endswith("pydoc_data/topics.py") for p in files)  # generated prose, not code
    assert corpus.size >= 1_000_000 and corpus.train_files > corpus.valid_files > 0
    again = corpus_mod.load_corpus(max_bytes=1_000_000)
    assert again.sha256 == corpus.sha256 and torch.equal(again.valid, corpus.valid)  # deterministic
    assert corpus_mod.load_corpus(max_bytes=200_000).sha256 != corpus.sha256  # the hash identifies the content


def test_whole_corpus_composition_adds_up():
    table = corpus_mod.composition()
    whole = corpus_mod.load_corpus()
    assert sum(r["train_bytes"] for r in table) == len(whole.train) and sum(r["valid_bytes"] for r in table) == len(whole.valid)
    assert sum(r["train_files"] + r["valid_files"] for r in table) == len(corpus_mod.stdlib_files())
    assert len(whole.valid) >= 1_000_000  # the bar for the validation split
    assert corpus_mod.top_level("json/decoder.py") == "json" and corpus_mod.top_level("os.py") == "os"


def test_split_is_by_file_and_stable():
    assert corpus_mod.in_validation("json/decoder.py", 10) == corpus_mod.in_validation("json/decoder.py", 10)
    names = [f"m{i}.py" for i in range(2000)]
    share = sum(corpus_mod.in_validation(n, 10) for n in names) / len(names)
    assert 0.07 < share < 0.13


def test_ngram_matches_counting_by_hand():
    train = torch.tensor(list(b"abracadabra abracadabra"), dtype=torch.uint8)
    valid = torch.tensor(list(b"abrac"), dtype=torch.uint8)
    text = bytes(train.tolist())
    for n in (1, 2, 3):
        k = 0.5
        expected = []
        for t in range(n - 1, len(valid)):
            ctx, nxt = bytes(valid[t - n + 1 : t].tolist()), valid[t].item()
            joint = sum(1 for i in range(len(text) - n + 1) if text[i : i + n - 1] == ctx and text[i + n - 1] == nxt)
            context = sum(1 for i in range(len(text) - n + 1) if text[i : i + n - 1] == ctx)
            expected.append(-np.log((joint + k) / (context + 256 * k)))
        assert np.allclose(ngram.ngram_losses(train, valid, n, k).numpy(), expected), n
    with pytest.raises(ValueError, match="k must be positive"):
        ngram.ngram_losses(train, valid, 2, 0.0)


def test_ngram_baselines_fall_with_order(corpus):
    base = ngram.ngram_baselines(corpus.train, corpus.valid)
    assert set(base) == {"bigram", "trigram", "4gram"}
    assert base["bigram"]["loss"] > base["trigram"]["loss"] > base["4gram"]["loss"] > 0


def test_matched_protocol_scores_the_same_bytes(corpus):
    torch.manual_seed(0)
    model = TinyTransformer(256, dim=16, num_heads=2, num_layers=1, scheme="rope", backend="sdpa").eval()
    seqs = ev.spaced_sequences(corpus.valid, 4 * 8 + 1, 3)
    short, long = ev.matched_losses(model, seqs, 8), ev.matched_losses(model, seqs, 32)
    assert short.shape == long.shape == (3, 32)
    assert torch.allclose(short[:, :8], long[:, :8], atol=1e-5)  # causal: the first window is computed the same way
    assert not torch.allclose(short[:, 8:], long[:, 8:])  # later windows: the short one starts afresh
    with pytest.raises(ValueError, match="multiple of the window length"):
        ev.matched_losses(model, seqs, 12)


def test_sliding_protocol_gives_every_target_its_context(corpus):
    torch.manual_seed(0)
    # a window of 4 keys in one layer: the model sees at most 4 bytes, so any window of 4 or more scores alike
    model = TinyTransformer(256, dim=16, num_heads=2, num_layers=1, scheme="sliding_window", scheme_args={"window": 4}, backend="sdpa").eval()
    seqs = ev.spaced_sequences(corpus.valid, 32 + 8 + 1, 3)
    a, b = ev.sliding_losses(model, seqs, 8, 8, 4), ev.sliding_losses(model, seqs, 32, 8, 2)
    assert a.shape == (3, 8) and torch.allclose(a, b, atol=1e-5)
    full = ev.token_losses(model, seqs[:, :-1], seqs[:, 1:])[:, -8:]
    assert torch.allclose(a, full, atol=1e-5)


def test_passkey_layout_and_labels():
    gen = torch.Generator().manual_seed(0)
    x, y, keys = pk.passkey_batch(40, [0.0, 0.5, 1.0], gen)
    assert x.shape == y.shape == (3, 40)
    for row in range(3):
        text = bytes(x[row].tolist())
        key = bytes(keys[row].tolist())
        assert text.count(b"#" + key) == 1 and text.endswith(b"?" + key)
        answer = y[row] != pk.IGNORE_INDEX
        assert answer.sum() == 4 and torch.equal(y[row][answer], keys[row])
        assert torch.equal(x[row, 36:40], y[row, 35:39])  # each answer digit is the next byte
    assert bytes(x[0, :5].tolist()).startswith(b"#")  # depth 0: the key comes first
    key = bytes(keys[2].tolist())
    assert bytes(x[2].tolist()).endswith(b"#" + key + b"?" + key)  # depth 1: right before the question


def test_passkey_accuracy_is_exact_match():
    class Oracle(torch.nn.Module):
        """Predicts the next byte of the sequence it is given: a perfect retriever."""

        def __init__(self):
            super().__init__()
            self.p = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            nxt = torch.cat((x[:, 1:], x[:, -1:]), 1)
            return torch.nn.functional.one_hot(nxt, 256).float()

    assert pk.passkey_accuracy(Oracle(), 32, 0.5, count=8) == 1.0


@pytest.mark.parametrize("label", list(xp.scheme_table(xp.PRESETS["smoke"])))
def test_one_training_step_per_scheme_and_evaluation_past_l(label, corpus):
    rows, seqs = xp.run(label, 0, TINY, corpus)
    losses = {(r["scheme"], r["variant"], r["protocol"], r["eval_len"]): r for r in rows if r["bucket"] == "all"}
    for (scheme, variant, protocol, length), row in losses.items():
        if label == "learned" and length > TINY.train_len:
            assert row["value"] != row["value"] and "outside the learned table" in row["note"]  # NaN, as documented
        else:
            assert 0 < row["value"] < 10
    assert {p for _, _, p, _ in losses} == {"matched", "sliding"}
    assert {r["protocol"] for r in rows} >= {"matched", "sliding", "passkey"}
    if label == "rope":
        assert {s for s, _, _, _ in losses} == set(xp.rescalings(TINY)) | {xp.CONTROL_AT_L}
        assert {v for _, v, _, _ in losses} == {"trained", "zero-shot", "fine-tuned"}
        assert {v for s, v, _, _ in losses if s == xp.CONTROL_AT_L} == {"fine-tuned"}
    profile = [r for r in rows if r["task"] == "attention"]  # where the trained model's heads attend, at every length it takes
    lengths = {TINY.train_len} if label == "learned" else {f * TINY.train_len for f in TINY.eval_factors}
    assert {r["eval_len"] for r in profile} == lengths and {r["variant"] for r in profile} == {"trained"}
    assert len(profile) == len(lengths) * TINY.num_layers * TINY.num_heads * 3


def test_study_writes_the_results_contract_and_resumes(tmp_path):
    csv_path, seq_path, json_path = xp.study(TINY, tmp_path, labels=["alibi", "learned"], quiet=True)
    assert csv_path.name == "extrapolation_smoke.csv" and json_path.name == "extrapolation_smoke.json"
    rows = list(csv.DictReader(csv_path.open()))
    assert set(rows[0]) == {"run", *xp.COLUMNS}
    assert {"matched", "sliding", "passkey"} <= {r["protocol"] for r in rows} and {r["seed"] for r in rows} == {"0"}
    meta = json.loads(json_path.read_text())
    for key in ("preset", "config", "device", "dtype", "versions", "git", "date", "threads", "cpu_count", "platform", "load_average_start",
                "corpus_sha256", "corpus_train_bytes", "corpus_valid_bytes", "wall_seconds", "load_average_end", "seeds", "ngram_baselines"):
        assert key in meta
    assert meta["seeds"] == list(TINY.seeds) and set(meta["ngram_baselines"]) == {"bigram", "trigram", "4gram"}
    assert meta["versions"]["torch"] == torch.__version__ and meta["device"]["type"] == "cpu"
    assert set(meta["wall_seconds"]) == {"alibi/0", "learned/0"} and meta["date_end"] >= meta["date"]
    sequences = summary.read_sequences(seq_path.read_text())
    table = summary.bootstrap(sequences, replicates=50)
    assert (table.lo <= table["mean"] + 1e-12).all() and (table["mean"] <= table.hi + 1e-12).all()
    assert set(table.label) == {"alibi", "learned"} and (table[table.eval_len == TINY.train_len].rise == 0).all()
    rises = summary.bucket_rise(sequences, TINY.train_len, 8 * TINY.train_len, replicates=50)  # the learned table has no 8L
    assert set(rises.label) == {"alibi"} and list(rises.bucket) == [f"{b * TINY.train_len}-{(b + 1) * TINY.train_len}" for b in range(8)]
    assert (rises.lo <= rises["mean"] + 1e-12).all() and (rises["mean"] <= rises.hi + 1e-12).all()
    assert rises.iloc[0][["mean", "lo", "hi"]].abs().max() < 1e-3  # causal: the first bucket is scored identically
    with pytest.raises(ValueError, match="short and long must be lengths with bucket values"):
        summary.bucket_rise(sequences, 2 * TINY.train_len, 8 * TINY.train_len)
    xp.study(TINY, tmp_path, labels=["alibi", "learned"], quiet=True)  # nothing left to run
    assert len(list(csv.DictReader(csv_path.open()))) == len(rows)
    [outcome] = xp.check(TINY, tmp_path, "learned/0")  # a re-run gives the stored rows bit for bit, NaN notes included
    assert outcome["identical"] and outcome["rows"] == sum(r["run"] == "learned" for r in rows)
    assert outcome["sequence_rows"] == sum(r["run"] == "learned" for r in csv.DictReader(seq_path.open())) > 0
    assert json.loads(json_path.read_text())["reproduction_checks"] == [outcome]


def test_bootstrap_ranks_and_pairs():
    rng = np.random.default_rng(0)
    base = rng.normal(2.0, 0.5, 40)  # the text's difficulty, shared by both schemes
    rows = []
    for seed in (0, 1, 2):
        for label, shift in (("good", 0.0), ("bad", 0.1)):
            for length, rise in ((8, 0.0), (16, 0.05 if label == "bad" else 0.0)):
                values = base + shift + rise + rng.normal(0, 0.01, 40)
                rows.append({"task": "lm", "scheme": label, "variant": "trained", "seed": seed, "protocol": "matched", "eval_len": length,
                             "values": values})
    frame = summary.labelled(pd.DataFrame(rows))
    table = summary.bootstrap(frame, replicates=400).set_index(["label", "eval_len"])
    assert table.loc[("good", 8), "rank"] == 1 and table.loc[("bad", 16), "rank_lo"] == 2
    assert table.loc[("bad", 16), "rise_lo"] > 0.04 and table.loc[("good", 16), "rise_hi"] < 0.01  # paired: narrow
    assert table.loc[("good", 8), "hi"] - table.loc[("good", 8), "lo"] > 0.1  # unpaired: the text's spread
    mean, lo, hi = summary.difference(frame, "bad", "good", 16, replicates=400)
    assert 0.14 < lo < mean < hi < 0.16


def test_bad_study_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown schemes"):
        xp.study(xp.PRESETS["smoke"], tmp_path, labels=["bert"], quiet=True)
    with pytest.raises(ValueError, match="does not split evenly"):
        xp.World(0, 3).rows(8)
    with pytest.raises(ValueError, match="depths must be one or more fractions"):
        pk.passkey_batch(32, [1.5], torch.Generator())
    with pytest.raises(ValueError, match="length must be at least 10"):
        pk.passkey_batch(8, [0.5], torch.Generator())


def _study_command(processes: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
            "-m", "posenc.study.extrapolation", "--preset", "smoke", "--schemes", "rope", "--out", str(out)]


def test_two_gloo_processes_equal_one_process(tmp_path):
    """DistributedDataParallel over two CPU processes (gloo) gives the one-process results, same global batch."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "POSENC_WEIGHTS": str(tmp_path / "weights")}
    for processes in (1, 2):
        done = subprocess.run(_study_command(processes, tmp_path / str(processes)), cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = (pd.read_csv(tmp_path / str(p) / "extrapolation_smoke.csv") for p in (1, 2))
    assert json.loads((tmp_path / "2" / "extrapolation_smoke.json").read_text())["world_size"] == 2
    keys = ["task", "scheme", "variant", "protocol", "eval_len", "depth", "bucket", "metric"]
    assert one[keys].astype(str).equals(two[keys].astype(str))
    assert np.allclose(one.value, two.value, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert len(one) > 100 and one.scheme.nunique() == len(xp.rescalings(xp.PRESETS["smoke"])) + 1  # and the control at L


def test_runs_side_by_side_write_what_one_process_writes(tmp_path):
    """preset.jobs trains whole runs in separate processes: the files are the one-process files, byte for byte."""
    one = replace(TINY, threads=1, jobs=1)
    paths = {jobs: xp.study(replace(one, jobs=jobs), tmp_path / str(jobs), labels=["learned", "alibi"], quiet=True) for jobs in (1, 2)}
    for single, pooled in zip(paths[1][:2], paths[2][:2]):
        assert single.read_bytes() == pooled.read_bytes()
    assert json.loads(paths[2][2].read_text())["jobs"] == 2


def test_gpu_preset_runs_at_its_own_shapes(corpus):
    """The gpu preset (8 heads of 32, L = 256, 8L = 2,048) has not run on a GPU yet: one step of it on the CPU shows the shapes fit."""
    gpu = replace(xp.PRESETS["gpu"], device="cpu", steps=1, finetune_steps=1, eval_sequences=2, sliding_sequences=2, passkey_count=1, probe_sequences=2,
                  depths=(0.5,), seeds=(0,))
    rows, _ = xp.run("alibi", 0, gpu, corpus)
    lengths = {r["eval_len"] for r in rows if r["protocol"] == "matched" and r["bucket"] == "all"}
    assert lengths == {256, 512, 1024, 2048} and all(0 < r["value"] < 10 for r in rows if r["metric"] == "loss")


def test_colab_preset_is_the_cpu_model_with_fewer_runs_and_its_estimate_adds_up():
    """colab: the cpu preset's model, data, steps and evaluation, six schemes, seed 0, on CUDA; under 10 minutes by the stated T4 cost."""
    cpu, colab = xp.PRESETS["cpu"], xp.PRESETS["colab"]
    assert replace(colab, name="cpu", seeds=cpu.seeds, threads=cpu.threads, jobs=cpu.jobs, device="cpu", schemes=None,
                   variations=cpu.variations, ablations=cpu.ablations) == cpu
    assert colab.device == "cuda" and colab.seeds == (0,) and "rope" in colab.labels and 3 <= len(colab.labels) < len(xp.SCHEMES)
    assert colab.variations == colab.ablations == () and colab.runs == [(label, 0) for label in colab.labels]
    cost, t4 = xp.estimate(colab), xp.STEP_COSTS["t4"]
    fine_tunes = len(xp.rescalings(cpu)) + 1  # the extensions and the control at L
    steps = (len(colab.labels) - 1) * cpu.steps + cpu.steps + fine_tunes * cpu.finetune_steps
    evaluations = len(colab.labels) + (fine_tunes + len(xp.rescalings(cpu)) - 1)  # rope: 5 zero-shot and 7 fine-tuned evaluations more
    assert (cost["steps"], cost["evaluations"]) == (steps, evaluations)
    assert cost["estimate_s"] == round(t4.fixed_s + steps * t4.step_s + evaluations * t4.evaluation_s, 1) < 600
    meta = json.loads((ROOT / "chapters" / "results" / "extrapolation_cpu.json").read_text())
    recorded = xp.estimate(colab, recorded=meta)
    assert recorded["recorded_s"] == round(sum(meta["wall_seconds"][f"{label}/0"] for label in colab.labels), 1)
    assert "recorded_s" not in xp.estimate(replace(colab, seeds=(7,)), recorded=meta)  # no such runs recorded: no comparison
    assert xp.PRESETS["cpu"].labels == xp.SCHEMES == tuple(xp.scheme_table(cpu))
    with pytest.raises(ValueError, match="unknown schemes"):
        replace(colab, schemes=("bert",))


def test_colab_preset_runs_end_to_end_on_the_emulated_device_where_read_result_finds_it(emulated_cuda, tmp_path, monkeypatch):
    """The entry point's GPU path at tiny sizes (--tiny): trained and evaluated on CUDA, written to results_dir(), read back."""
    from posenc.study import results

    monkeypatch.setenv(results.ENV, str(tmp_path))
    monkeypatch.setenv("POSENC_WEIGHTS", str(tmp_path / "weights"))
    schemes = ["alibi", "rope"]
    assert xp.main(["--preset", "colab", "--tiny", "--schemes", *schemes]) == 0
    meta = json.loads(results.read_result("extrapolation_colab_tiny.json", required=True))
    assert meta["device"]["type"] == "cuda" and meta["config"]["device"] == "cuda" and meta["preset"] == "colab_tiny"
    assert set(meta["wall_seconds"]) == {f"{s}/0" for s in schemes}
    sequences = summary.read_sequences(results.read_result("extrapolation_colab_tiny_sequences.csv", required=True))
    table = summary.bootstrap(sequences, replicates=20)
    assert {"alibi", "rope", "rope_yarn (fine-tuned)"} <= set(table.label) and table["mean"].between(0, np.log(256)).all()


def test_check_on_the_command_line_reproduces_a_stored_run_bit_for_bit(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "POSENC_WEIGHTS": str(tmp_path / "weights")}
    base = [sys.executable, "-m", "posenc.study.extrapolation", "--preset", "smoke", "--out", str(tmp_path)]
    made = subprocess.run([*base, "--schemes", "alibi"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert made.returncode == 0, made.stderr[-3000:]
    checked = subprocess.run([*base, "--check", "alibi/0"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert checked.returncode == 0, checked.stderr[-3000:]
    outcome = json.loads(checked.stdout.strip().splitlines()[-1])
    assert outcome["identical"] and outcome["max_abs_difference"] == 0 and outcome["run"] == "alibi/0"
