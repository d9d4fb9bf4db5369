"""Benchmarks: each script measures one claim, prints a table and saves JSON, Markdown and a PNG under
bench/results/. Run one from the repository root as ``.venv/bin/python -m bench.<name>`` (those that
import only hydra_edge also as ``bench/<name>.py``); a package, so the tests import them by name."""
