"""The study and benchmark machinery of the closing chapters; the core package never imports it.

corpus, tasks and passkey make the data; measure times calls and counts memory; runinfo
records one metadata schema; results reads and writes results files; extrapolation and
benchmark are the two entry points (`python -m posenc.study.extrapolation`,
`python -m posenc.study.benchmark`).
"""
