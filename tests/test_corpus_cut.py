"""A corpus cut at max_bytes holds out at least MIN_VALID_SHARE of them: on the GPU machine's Python (3.12, no test
suite) the first megabyte held out 97 bytes, too few for the tiny evaluation."""

from posenc.study.corpus import MIN_VALID_SHARE, in_validation, load_corpus


def test_a_cut_corpus_reads_on_until_its_validation_split_is_not_a_sliver(tmp_path):
    names = sorted(f"m{i:03d}.py" for i in range(400))
    first_valid = next(i for i, n in enumerate(names) if in_validation(n, 10))
    for i, name in enumerate(names):
        # the files before the first held-out one are long, the held-out ones tiny at first
        body = "x = 1\n" * (200 if i < first_valid else 2) if not in_validation(name, 10) or i < 60 else "y = 2\n" * 200
        (tmp_path / name).write_text(body)
    max_bytes = sum(len((tmp_path / n).read_bytes()) for n in names[: first_valid + 1])
    corpus = load_corpus(max_bytes, root=tmp_path)
    assert len(corpus.valid) >= MIN_VALID_SHARE * max_bytes and len(corpus.train) >= max_bytes * 0.9
    whole = load_corpus(root=tmp_path)
    assert len(corpus.valid) <= len(whole.valid)  # a prefix of the whole corpus, read in the same order
