"""The compiled side of :func:`fedco.sweep`: many runs' states advanced by one program.

Runs are stacked along a leading axis ``R``: their states always, and their data, initial
models and ``metrics_data`` when each seed has its own (:class:`PerSeed`). One ``jax.jit``
initialises every run (:func:`init_program`); another advances all of them a chunk of
rounds (:func:`chunk_program`): a ``lax.scan`` over rounds of a ``vmap`` over runs of the
pure round :func:`fedco.runtime.rounds.round_step`. A run whose state or evaluated metrics
stop being finite is frozen at its last finite state (its later metrics are NaN) while the
others go on.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedco.algorithms.base import InjectedServerState, get_field, set_fields
from fedco.runtime import evaluation
from fedco.runtime import rounds as rounds_lib
from fedco.runtime.simulator import SimState


class PerSeed:
  """One value per seed for :func:`fedco.sweep`'s ``data``, ``params`` or ``metrics_data``.

  ``fedco.sweep(problem, alg, PerSeed([d0, d1]), PerSeed([p0, p1]), seeds=(0, 1), ...)``
  runs seed 0 on ``d0`` from ``p0`` and seed 1 on ``d1`` from ``p1`` (each seed's own client
  partition and initial model), still as one program: the values are stacked, so they must
  have equal shapes and dtypes (and, for data, equal client counts and ``max_count``). With
  a grid, every grid point of a seed uses that seed's value. A leaf that all values share
  (the same array object, such as the examples of seeds that partition one dataset
  differently) is not copied.

  Args:
    values: a non-empty sequence with one value per entry of ``seeds``, in that order.

  Raises:
    ValueError: if ``values`` is not a non-empty sequence (a string is refused); ``sweep``
      raises it when their number is not the number of seeds or their shapes differ.

  Examples:
    Two seeds of FedAvg, each from its own initial model:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]], np.float32)
    >>> data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(4)])
    >>> problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
    >>> starts = fedco.runtime.PerSeed([jnp.zeros(2), jnp.full(2, 2.0)])
    >>> starts
    PerSeed(<2 values>)
    >>> result = fedco.sweep(
    ...   problem, fedco.fedavg(0.1, 1), data, starts, rounds=1, seeds=[0, 1], batch_size=None
    ... )
    >>> [[round(float(v), 2) for v in params] for params in result.params]  # after 1 round
    [[0.5, 0.45], [2.1, 2.05]]
  """

  def __init__(self, values: Sequence[Any]):
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
      raise ValueError(
        f"PerSeed needs a non-empty list with one value per seed, got {type(values).__name__}"
      )
    self.values = list(values)

  def __len__(self):
    return len(self.values)

  def __repr__(self):
    return f"PerSeed(<{len(self.values)} values>)"


def per_run(name: str, value, seeds: Sequence[int], run_seeds: Sequence[int]):
  """``(value, axes)``: a :class:`PerSeed` stacked along a leading run axis, with the
  ``vmap`` axes of its leaves (``0``; ``None`` for a leaf every seed shares, the same
  array object, such as the examples of seeds that partition one dataset differently);
  any other value as it is, with axis ``None``."""
  if not isinstance(value, PerSeed):
    return value, None
  if len(value) != len(seeds):
    raise ValueError(f"{name}: PerSeed holds {len(value)} values for {len(seeds)} seeds")
  first = value.values[0]
  for seed, v in zip(seeds[1:], value.values[1:]):
    if not stackable([first, v]):
      raise ValueError(
        f"{name}: seed {seed}'s value has other shapes than seed {seeds[0]}'s "
        f"({_brief(v)} vs {_brief(first)}); the runs of one sweep are stacked, "
        f"so per-seed values need equal shapes (and equal client counts)"
      )
  where = {s: i for i, s in enumerate(seeds)}
  order = [where[s] for s in run_seeds]

  def leaf(*leaves):
    if all(l is leaves[0] for l in leaves):
      return leaves[0], None
    return jnp.stack([jnp.asarray(leaves[i]) for i in order]), 0

  treedef = jax.tree.structure(first)
  pairs = [leaf(*ls) for ls in zip(*(jax.tree.leaves(v) for v in value.values))]
  return (
    jax.tree.unflatten(treedef, [p[0] for p in pairs]),
    jax.tree.unflatten(treedef, [p[1] for p in pairs]),
  )


def stackable(values: Sequence[Any]) -> bool:
  """Whether pytrees have one structure and equal leaf shapes and dtypes (can be stacked
  into one sweep: data with equal client counts and ``max_count``, say)."""
  shape = lambda v: (
    jax.tree.structure(v),
    [(np.shape(a), jnp.result_type(a)) for a in jax.tree.leaves(v)],
  )
  return all(shape(v) == shape(values[0]) for v in values[1:])


def _brief(tree) -> str:
  leaves = jax.tree.leaves(tree)
  shapes = [tuple(np.shape(a)) for a in leaves[:3]]
  return f"{len(leaves)} arrays, first shapes {shapes}"


def set_hyperparams(state: SimState, values: Dict[str, jax.Array]) -> SimState:
  """One run's state with its hyperparameters, in every client's state and the server's."""
  if not values:
    return state
  hp = dict(get_field(state.clients, "hyperparams"))
  for name, value in values.items():
    hp[name] = jnp.broadcast_to(value.astype(hp[name].dtype), hp[name].shape)
  clients = set_fields(state.clients, hyperparams=hp)
  server_opt_state = state.server_opt_state
  if isinstance(server_opt_state, InjectedServerState):
    shp = dict(server_opt_state.hyperparams)
    shp.update({k: v.astype(shp[k].dtype) for k, v in values.items() if k in shp})
    server_opt_state = server_opt_state._replace(hyperparams=shp)
  return state._replace(clients=clients, server_opt_state=server_opt_state)


def all_finite(tree) -> jax.Array:
  leaves = [
    jnp.all(jnp.isfinite(a))
    for a in jax.tree.leaves(tree)
    if jnp.issubdtype(jnp.result_type(a), jnp.inexact)
  ]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.ones([], bool)


def _per_run(mask, leaf):
  """A ``[R]`` mask shaped to broadcast against a ``[R, ...]`` leaf."""
  return mask.reshape((-1,) + (1,) * (leaf.ndim - 1))


def _finite_metrics(metrics) -> jax.Array:
  """Whether this round's evaluated metrics are finite (unevaluated rounds hold NaN)."""
  evaluated = metrics.get("evaluated", jnp.ones([], bool))
  floats = {k: v for k, v in metrics.items() if k not in ("evaluated", "clients")}
  return ~evaluated | all_finite(floats)


def init_program(cfg, axes, **jit_kwargs):
  """``fn(params, keys, values, data) -> states``: every run's initial state.

  ``axes`` says which of ``params`` and ``data`` are stacked per run (``0``) or shared
  (``None``); ``values`` are the runs' hyperparameters ``{name: [R]}``."""

  def one(params, key, hp, data):
    return set_hyperparams(rounds_lib.init_state(cfg, params, key, data), hp)

  return jax.jit(jax.vmap(one, in_axes=(axes["params"], 0, 0, axes["data"])), **jit_kwargs)


def chunk_program(cfg, axes, final_round: int, **jit_kwargs):
  """``fn(states, frozen, data, metrics_data, length) -> (states, frozen, metrics)``.

  ``frozen`` holds, per run, ``0`` or the (1-based) round its state or evaluated metrics
  first stopped being finite; such a run keeps its last finite state and NaN metrics."""

  def step(state, data, metrics_data, due_round):
    flat = evaluation.flat_examples(cfg, data)
    return rounds_lib.round_step(cfg, data, flat, state, final_round, metrics_data, due_round)

  @functools.partial(jax.jit, static_argnames="length", **jit_kwargs)
  def run_chunk(states, frozen, data, metrics_data, length):
    advance = jax.vmap(step, in_axes=(0, axes["data"], axes["metrics_data"], None))

    def one_round(carry, _):
      states, frozen = carry
      # The runs advance together (a frozen run's round stops, behind, and its metrics are
      # masked), so the round they complete is one unbatched value: the evaluation stays a
      # branch taken only when due; each run's own (batched) round would make vmap turn
      # the cond into a select and evaluate every round.
      due_round = jnp.max(states.round) + 1
      new, metrics = advance(states, data, metrics_data, due_round)
      ok = jax.vmap(all_finite)(new) & jax.vmap(_finite_metrics)(metrics)
      stop = (frozen == 0) & ~ok
      frozen = jnp.where(stop, new.round, frozen)
      keep_old = frozen > 0
      states = jax.tree.map(lambda a, b: jnp.where(_per_run(keep_old, a), a, b), states, new)
      masked = jax.tree.map(
        lambda m: (
          m
          if not jnp.issubdtype(m.dtype, jnp.inexact)
          else jnp.where(_per_run(keep_old & ~stop, m), jnp.nan, m)
        ),
        metrics,
      )
      return (states, frozen), masked

    (states, frozen), metrics = jax.lax.scan(one_round, (states, frozen), None, length=length)
    return states, frozen, metrics

  return run_chunk


def divergences(frozen, metrics) -> List[Optional[Dict[str, Any]]]:
  """``None`` or ``{"round", "quantity"}`` per run from the freeze rounds (1-based)."""
  out: List[Optional[Dict[str, Any]]] = []
  for r, round_ in enumerate(np.asarray(frozen).tolist()):
    if round_ == 0:
      out.append(None)
      continue
    quantity = "state"  # the model or a tracker, unless an evaluated metric says more
    evaluated = "evaluated" not in metrics or bool(metrics["evaluated"][r][round_ - 1])
    names = (k for k in metrics if k not in ("evaluated", "clients")) if evaluated else ()
    for name in sorted(names, key=lambda k: k != "objective"):
      value = np.asarray(metrics[name][r][round_ - 1])
      if np.issubdtype(value.dtype, np.floating) and not np.all(np.isfinite(value)):
        quantity = name
        break
    out.append({"round": int(round_), "quantity": quantity})
  return out


__all__ = ["PerSeed"]
