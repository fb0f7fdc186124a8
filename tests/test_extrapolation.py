import csv
import json

import pytest
import torch

from posenc.study import corpus as corpus_mod
from posenc.study import extrapolation as xp
from posenc.study import passkey as pk


@pytest.fixture(scope="module")
def corpus():
    return corpus_mod.load_corpus(max_bytes=200_000)


def test_corpus_is_the_standard_library_split_by_file_and_hashed(corpus):
    files = corpus_mod.stdlib_files()
    assert files and all(p.suffix == ".py" and "site-packages" not in p.parts for p in files)
    assert [p.as_posix() for p in files] == sorted(p.as_posix() for p in files)
    assert corpus.size >= 200_000 and corpus.train_files > corpus.valid_files > 0
    again = corpus_mod.load_corpus(max_bytes=200_000)
    assert again.sha256 == corpus.sha256 and torch.equal(again.valid, corpus.valid)  # deterministic
    assert corpus_mod.load_corpus(max_bytes=1_000_000).sha256 != corpus.sha256  # the hash identifies the content


def test_split_is_by_file_and_stable():
    assert corpus_mod.in_validation("json/decoder.py", 10) == corpus_mod.in_validation("json/decoder.py", 10)
    names = [f"m{i}.py" for i in range(2000)]
    share = sum(corpus_mod.in_validation(n, 10) for n in names) / len(names)
    assert 0.07 < share < 0.13


def test_windows_shift_targets_by_one(corpus):
    x, y = corpus_mod.sample_windows(corpus.train, 16, 4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    x, y = corpus_mod.eval_windows(corpus.valid, 16, 3)
    assert torch.equal(x, corpus_mod.eval_windows(corpus.valid, 16, 3)[0])


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
    preset = xp.replace(xp.PRESETS["smoke"], steps=1, passkey_steps=1, eval_count=2, passkey_count=2)
    rows = xp.run("lm", label, 0, preset, corpus)
    losses = {(r["scheme"], r["variant"], r["eval_len"]): r for r in rows if r["bucket"] == "all"}
    for (scheme, variant, length), row in losses.items():
        if label == "learned" and length > preset.train_len:
            assert row["value"] != row["value"] and "outside the learned table" in row["note"]  # NaN, as documented
        else:
            assert 0 < row["value"] < 10
    if label == "rope":
        assert {s for s, _, _ in losses} == {"rope", "rope_pi", "rope_ntk", "rope_yarn"}
        assert {v for _, v, _ in losses} == {"trained", "zero-shot", "fine-tuned"}


def test_study_writes_tidy_results_and_resumes(tmp_path):
    preset = xp.replace(xp.PRESETS["smoke"], steps=2, passkey_steps=2, eval_count=2, passkey_count=2)
    csv_path, json_path = xp.study(preset, tmp_path, tasks=("lm", "passkey"), labels=["alibi", "learned"], quiet=True)
    rows = list(csv.DictReader(csv_path.open()))
    assert set(rows[0]) == {"run", *xp.COLUMNS}
    assert {r["task"] for r in rows} == {"lm", "passkey"}
    meta = json.loads(json_path.read_text())
    for key in ("preset", "config", "device", "dtype", "versions", "git", "date", "threads", "cpu_count", "platform", "load_average_start", "corpus_sha256", "corpus_bytes", "wall_seconds", "load_average_end"):
        assert key in meta
    assert meta["versions"]["torch"] == torch.__version__ and meta["device"]["type"] == "cpu"
    assert set(meta["wall_seconds"]) == {"lm/alibi/0", "lm/learned/0", "passkey/alibi/0", "passkey/learned/0"}
    xp.study(preset, tmp_path, tasks=("lm", "passkey"), labels=["alibi", "learned"], quiet=True)  # nothing left to run
    assert len(list(csv.DictReader(csv_path.open()))) == len(rows)


def test_bad_study_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown schemes"):
        xp.study(xp.PRESETS["smoke"], tmp_path, labels=["bert"], quiet=True)
    with pytest.raises(ValueError, match="depths must be one or more fractions"):
        pk.passkey_batch(32, [1.5], torch.Generator())
    with pytest.raises(ValueError, match="length must be at least 10"):
        pk.passkey_batch(8, [0.5], torch.Generator())
