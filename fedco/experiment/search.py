"""Grid searches over a method's hyperparameters and the problem's (:func:`search`,
:func:`combine`)."""

from __future__ import annotations

import inspect
import itertools
import types
from typing import Any, Callable, Dict, Mapping, Sequence

import numpy as np

import fedco
from fedco.experiment.config_methods import Method, check_batch_size

# ---- grid search -------------------------------------------------------------------------


def grid_axes(
  config, method: Method, problem_axes: Mapping[str, Sequence[float]] = types.MappingProxyType({})
) -> Dict[str, tuple]:
  """The grid of one method: ``grid.learning_rate``, its algorithm's ``grid.<algorithm>``
  axes, then ``problem_axes`` (experiment-specific, e.g. the KL temperature)."""
  axes = {"learning_rate": tuple(float(v) for v in config.grid.learning_rate)}
  own = config.grid.get(method.algorithm)
  if own is not None:
    allowed = inspect.signature(fedco.ALGORITHMS[method.algorithm]).parameters
    for name, values in own.items():
      if name not in allowed:
        raise ValueError(
          f"--config.grid.{method.algorithm}.{name} is not an argument of fedco.{method.algorithm}"
        )
      axes[name] = tuple(float(v) for v in values)
  axes.update({k: tuple(float(v) for v in vs) for k, vs in dict(problem_axes).items()})
  for name, values in axes.items():
    if not values:
      raise ValueError(f"--config.grid.{name} must hold at least one value")
  return axes


def search(
  method: Method,
  axes: Mapping[str, tuple],
  *,
  problem_axes: Sequence[str],
  make_problem: Callable[[Dict[str, float]], Any],
  algorithm_kwargs: Callable[[Dict[str, float]], Dict[str, Any]],
  score: Callable[[Dict[str, np.ndarray], int], Sequence[float]],
  data,
  params,
  seed: int,
  rounds: int,
  progress: bool = False,
  **simulator_kwargs,
) -> Dict[str, Any]:
  """Every point of a method's grid, as one ``fedco.sweep`` program per problem point.

  The algorithm axes (the learning rate and factory arguments) of each problem point run
  as one vmapped program; ``score(metrics, run)`` rates a run with a tuple compared in order
  (higher is better: say the worst client's accuracy, then the average to break ties); a
  diverged run scores ``None``. Returns ``{"points": [{axis: value, ..., "score": s}],
  "best": point}`` (``None`` if every point diverged; the first of the best on full ties,
  so the smaller values win).
  """
  if method.uplink.get("privacy") or method.uplink.get("compression"):
    raise ValueError(
      f"--config.methods.{method.label}: a grid search picks settings on "
      f"its runs, which spends privacy no accountant counts; search without "
      f"privacy or compression"
    )
  check_batch_size(simulator_kwargs.get("batch_size"), data)  # before the sweeps compile
  factory = fedco.ALGORITHMS[method.algorithm]
  algorithm_names = [k for k in axes if k not in problem_axes]
  points = []
  for problem_values in itertools.product(*(axes[k] for k in problem_axes)):
    fixed = dict(zip(problem_axes, problem_values))
    kwargs = {
      **{k: v for k, v in method.kwargs.items() if k not in axes},
      **algorithm_kwargs(fixed),
    }
    if method.takes_local_steps:
      kwargs["local_steps"] = method.local_steps
    result = fedco.sweep(
      make_problem(fixed),
      factory,
      data,
      params,
      rounds=rounds,
      grid={k: axes[k] for k in algorithm_names},
      seeds=(seed,),
      algorithm_kwargs=kwargs,
      progress=progress,
      **simulator_kwargs,
    )
    for r, run in enumerate(result.runs):
      value = None
      if result.diverged[r] is None:
        value = [float(v) for v in score(result.metrics, r)]
        value = value if np.all(np.isfinite(value)) else None
      points.append({**{k: run[k] for k in algorithm_names}, **fixed, "score": value})
  return {"points": points, "best": _best(points)}


def _best(points):
  finite = [p for p in points if p["score"] is not None]
  return max(finite, key=lambda p: p["score"]) if finite else None


def combine(searches: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
  """One method's searches on several seeds (same grid, same order) as one: a point's score
  is the mean of its scores, ``None`` if it diverged on any seed."""
  points = []
  for same in zip(*(s["points"] for s in searches)):
    scores = [p["score"] for p in same]
    score = (
      None
      if any(v is None for v in scores)
      else [float(v) for v in np.mean(np.asarray(scores), axis=0)]
    )
    points.append({**same[0], "score": score, "per_seed": scores})
  return {"points": points, "best": _best(points)}
