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
extrapolation_presets sizes the study and extrapolation_budget estimates a preset's
time, extrapolation_layers builds its models (the layer recipes, ALiBi's slope sets, the
context extensions), extrapolation_runs trains and evaluates one model,
extrapolation_eval scores it, extrapolation_weights keeps trained weights outside the
repository so ablations re-evaluate them, extrapolation_check repeats runs bit for bit,
longcontext is the copy probe, and verdicts the t, exact binomial and Holm tests the
chapter's claims rest on; extrapolation and benchmark are the
two entry points (`python -m posenc.study.extrapolation`, `python -m
posenc.study.benchmark`), and gpu (with gpu_stages and gpu_chapters) the one command for
a first GPU run (`python -m posenc.study.gpu`).
"""
