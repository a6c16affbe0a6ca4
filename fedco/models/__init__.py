"""Flax models and the per-example classification losses the problems are built from."""

from fedco.models.linear import LogisticRegression, accuracy, cross_entropy, init_params
from fedco.models.mlp import MLP, init_mlp

__all__ = ["MLP", "init_mlp", "LogisticRegression", "accuracy", "cross_entropy", "init_params"]
