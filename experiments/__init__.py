"""Flag-driven binaries that reproduce the papers' experiments (``python -m experiments.<name>``)."""
