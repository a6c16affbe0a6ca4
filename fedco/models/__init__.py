"""Flax models and the per-example classification losses the problems are built from."""

from fedco.models.linear import LogisticRegression, accuracy, cross_entropy, init_params

__all__ = ["LogisticRegression", "accuracy", "cross_entropy", "init_params"]
