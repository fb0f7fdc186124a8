"""The study and benchmark machinery of the closing chapters; the core package never
imports it.

corpus, tasks and passkey make the data; ngram counts the byte n-gram baselines;
evaluate scores models on matched text and with a sliding window; summary bootstraps
intervals and ranks; measure times calls (interleaved, with an L2 flush on a GPU) and
counts memory (each counter exact or a lower bound); runinfo records one metadata
schema; results keeps the one results folder (results_dir, command_line, read_result);
presets names the benchmark's presets, bench_plan plans a run and bench_budget prices
it; bench_paths builds the benchmark's measured paths and bench_checks checks them;
timing times them (interleaved samples, a steady allocator); bench_run runs a preset and
bench_files writes and reads its files; goals (with goal_rules) judges them;
extrapolation_presets sizes the study (and estimates a preset's time),
extrapolation_runs trains and evaluates one model; extrapolation and benchmark are the
two entry points (`python -m posenc.study.extrapolation`, `python -m
posenc.study.benchmark`), and gpu (with gpu_stages and gpu_chapters) the one command for
a first GPU run (`python -m posenc.study.gpu`).
"""
