"""The study and benchmark machinery of the closing chapters; the core package never imports it.

corpus, tasks and passkey make the data; ngram counts the byte n-gram baselines; evaluate
scores models on matched text and with a sliding window; summary bootstraps intervals and
ranks; measure times calls and counts memory; runinfo records one metadata schema; results
reads results files; bench_paths builds the benchmark's measured paths; extrapolation and
benchmark are the two entry points (`python -m posenc.study.extrapolation`,
`python -m posenc.study.benchmark`).
"""
