"""Benchmarks for fedco (run as modules, e.g. ``python -m benchmarks.logistic_loop``)."""
