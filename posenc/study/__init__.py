"""The study and benchmark machinery of the closing chapters; the core package never
imports it.

corpus, tasks and passkey make the data; ngram counts the byte n-gram baselines;
evaluate scores models on matched text and with a sliding window; summary bootstraps
intervals and ranks; measure times calls (interleaved, with an L2 flush on a GPU) and
counts memory (each counter exact or a lower bound); runinfo records one metadata
schema; results keeps the one results folder (results_dir, command_line, read_result);
presets plans a benchmark run and budgets its time; bench_paths builds the benchmark's
measured paths; goals judges them; extrapolation_presets sizes the study (and estimates
a preset's time), extrapolation_runs trains and evaluates one model; extrapolation and
benchmark are the two entry points (`python -m posenc.study.extrapolation`, `python -m
posenc.study.benchmark`).
"""
