from pathlib import Path

import pytest

import posenc
from posenc.study import results


def test_read_result_reads_the_local_folder_and_says_none_for_a_missing_file(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert results.read_result("x.csv", tmp_path) == "a,b\n1,2\n"
    # posenc is installed editable here (no git origin recorded): nothing to fetch, no network touched
    assert results.read_result("no-such-file.csv", tmp_path) is None


def test_the_stored_results_of_the_closing_chapters_are_found_from_chapters():
    for name in ("extrapolation_cpu.csv", "extrapolation_cpu.json", "benchmark_cpu.csv", "benchmark_cpu.json"):
        assert results.read_result(name, Path(__file__).parents[1] / "chapters" / "results"), name


def test_a_required_result_that_cannot_be_had_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("POSENC_RESULTS", raising=False)
    with pytest.raises(FileNotFoundError, match="set POSENC_RESULTS to a folder holding the file"):
        results.read_result("no-such-file.csv", tmp_path, required=True)


def test_posenc_results_names_a_second_folder(tmp_path, monkeypatch):
    (tmp_path / "y.json").write_text("{}")
    monkeypatch.setenv("POSENC_RESULTS", str(tmp_path))
    assert results.read_result("y.json", tmp_path / "elsewhere", required=True) == "{}"
