"""Input checks of a simulation that raise a one-line ``ValueError`` before anything runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedco.algorithms.base import Algorithm
from fedco.problems.base import Problem


def _scalar(name, shape_dtype):
  if tuple(shape_dtype.shape) != ():
    raise ValueError(f"the problem's {name} function must return a scalar, got shape "
                     f"{tuple(shape_dtype.shape)}")


_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def _check_dtypes(params, examples):
  """fedco computes in float32 (or float64): refuse half precision clearly."""
  for what, tree in (("params", params), ("data.examples", examples)):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if jnp.asarray(leaf).dtype in _LOW_PRECISION:
        raise ValueError(
            f"{what}{jax.tree_util.keystr(path)} has dtype {jnp.asarray(leaf).dtype}; fedco's "
            "trackers and averages need float32 or float64. Cast first, e.g. "
            "jax.tree.map(lambda a: a.astype(jnp.float32), tree)")


def _check_kinds(problem: Problem, algorithm: Algorithm):
  kind = algorithm.problem_kind
  if kind == "plain":
    if problem.extra is None:
      raise ValueError(f"{algorithm.name} trains on the extra (non-compositional) term, but "
                       f"problem {problem.name!r} has none; use fedco.problems.plain(loss)")
    return
  if not problem.compositional:
    raise ValueError(f"{algorithm.name} needs a compositional problem (inner and outer), got "
                     f"the plain problem {problem.name!r}")
  if problem.kind != kind:
    raise ValueError(f"{algorithm.name} solves {kind}-inner problems, but problem "
                     f"{problem.name!r} is {problem.kind}-inner")
