"""Flag-driven binaries that reproduce the papers' experiments.

Run one as ``python -m experiments.<name> --workdir=...``.
"""
