"""Checks of a simulation: its inputs (a one-line ``ValueError`` before anything runs) and,
between chunks, the finiteness of its metrics, model and host rows (``NonFiniteError``)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from fedco.algorithms.base import Algorithm
from fedco.problems.base import Problem
from fedco.runtime.distributed import fetch


class NonFiniteError(FloatingPointError):
  """A run produced a non-finite value.

  Attributes:
    round: the first evaluated round with a non-finite metric (or the chunk's last round).
    quantity: what was not finite: a metric's name, a host metric's, or ``"model"``.
    metrics: host metrics of every round up to and including the failing chunk.
    host_metrics: the host actions' rows up to and including the failing round.
  """

  def __init__(self, message, round_, metrics, host_metrics=(), quantity="model"):
    super().__init__(message)
    self.round, self.metrics, self.host_metrics = round_, metrics, list(host_metrics)
    self.quantity = quantity


def check_scalar(name, shape_dtype):
  if tuple(shape_dtype.shape) != ():
    raise ValueError(
      f"the problem's {name} function must return a scalar, got shape {tuple(shape_dtype.shape)}"
    )


_LOW_PRECISION = (jnp.float16, jnp.bfloat16)


def check_dtypes(params, examples):
  """fedco computes in float32 (or float64): refuse integer or bool params (nothing to
  differentiate) and half precision clearly."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    dtype = jnp.asarray(leaf).dtype
    if not jnp.issubdtype(dtype, jnp.inexact):
      raise ValueError(
        f"params{jax.tree_util.keystr(path)} has dtype {dtype}; params must be float32 or "
        "float64 arrays (they are differentiated), e.g. jnp.asarray(params, jnp.float32)"
      )
  for what, tree in (("params", params), ("data.examples", examples)):
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
      if jnp.asarray(leaf).dtype in _LOW_PRECISION:
        raise ValueError(
          f"{what}{jax.tree_util.keystr(path)} has dtype {jnp.asarray(leaf).dtype}; fedco's "
          "trackers and averages need float32 or float64. Cast first, e.g. "
          "jax.tree.map(lambda a: a.astype(jnp.float32), tree)"
        )


def check_kinds(problem: Problem, algorithm: Algorithm):
  kind = algorithm.problem_kind
  if kind == "plain":
    if problem.extra is None:
      raise ValueError(
        f"{algorithm.name} trains on the extra (non-compositional) term, but "
        f"problem {problem.name!r} has none; use fedco.problems.plain(loss)"
      )
    return
  if not problem.compositional:
    raise ValueError(
      f"{algorithm.name} needs a compositional problem (inner and outer), got "
      f"the plain problem {problem.name!r}"
    )
  if problem.kind != kind:
    raise ValueError(
      f"{algorithm.name} solves {kind}-inner problems, but problem "
      f"{problem.name!r} is {problem.kind}-inner"
    )


def raise_if_rows_not_finite(rows, host_metrics):
  """Stop at an action row with a non-finite number (a diverged evaluation); the caller
  fills in the error's ``metrics``."""
  for row in rows:
    for name, value in row.items():
      values = np.asarray(value)
      if np.issubdtype(values.dtype, np.floating) and not np.all(np.isfinite(values)):
        shown = np.array2string(values, threshold=8, precision=4)
        raise NonFiniteError(
          f"round {row['round']}: the host metric {name} is not finite ({shown})",
          row["round"],
          None,
          host_metrics,
          name,
        )


def data_not_finite(field: str, client: int, row: int) -> str:
  """The note of non-finite data: ``field`` (a key path), the first client holding such a
  row and the row (of ``data.examples``; a streamed run names the same row of its store)."""
  return (
    f"The data hold non-finite values (field {field}, client {client}, row {row}): fix the data."
  )


def data_finiteness_note(data, streamed: Optional[str] = None) -> str:
  """Whether the data themselves hold non-finite values (then the data, not the step size,
  are the cause), for a NonFiniteError's message: the field, client and row, or what was
  checked (a streamed run's ``data`` hold one client's rows; ``streamed`` is the note of
  the first non-finite row the rounds up to the divergence read, found as they read it)."""
  if streamed:
    return streamed
  for path, leaf in jax.tree_util.tree_flatten_with_path(data.examples)[0]:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return ""
    values = np.asarray(leaf)
    if np.issubdtype(values.dtype, np.inexact):
      bad = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
      rows = np.asarray(data.flat_rows)
      at: Union[np.ndarray, Tuple[int, ...]] = np.flatnonzero(bad[rows]) if bad.any() else ()
      if len(at):
        client = int(np.asarray(data.flat_owner)[at[0]])
        return data_not_finite(jax.tree_util.keystr(path), client, int(rows[at[0]]))
  if np.asarray(data.flat_rows).shape[0] < int(np.sum(np.asarray(data.counts))):
    return (
      "The data this run read are finite (a streamed run checks every client's rows as it "
      "reads them): the iterates diverged."
    )
  return "The data are finite: the iterates diverged."


def raise_if_not_finite(metrics, state, rounds_before):
  """Stop at the first evaluated round whose metrics are not finite (naming the objective
  first, then scalar metrics before per-client vectors)."""
  count = len(metrics["clients"]) if "clients" in metrics else 0
  evaluated = np.asarray(metrics.get("evaluated", np.ones(count, bool)), bool)
  names = sorted(
    (
      k
      for k, v in metrics.items()
      if k not in ("evaluated", "clients") and np.issubdtype(np.asarray(v).dtype, np.floating)
    ),
    key=lambda k: (k != "objective", np.ndim(metrics[k]) > 1),
  )
  first = None
  for name in names:
    values = np.asarray(metrics[name]).reshape(evaluated.shape[0], -1)
    bad = np.flatnonzero(evaluated & ~np.all(np.isfinite(values), axis=1))
    if bad.size and (first is None or bad[0] < first[0]):
      first = (int(bad[0]), name, values[bad[0]])
  model_finite = all(
    bool(np.all(np.isfinite(np.asarray(l)))) for l in jax.tree.leaves(fetch(state.server["params"]))
  )
  all_nan = first is not None and all(
    bool(np.all(np.isnan(np.asarray(metrics[n]).reshape(evaluated.shape[0], -1)[first[0]])))
    for n in names
  )
  if all_nan and not model_finite:  # NaN everywhere: the model itself diverged, say so
    r = rounds_before + first[0] + 1
    raise NonFiniteError(
      f"round {r}: the model diverged (its metrics {', '.join(names[:3])} are not finite "
      "from this evaluated round on). Lower the learning rate, or check the data for NaN or "
      "out-of-range labels and the problem's exp/log terms.",
      r,
      None,
      (),
      "model",
    )
  if first is not None:
    r = rounds_before + first[0] + 1
    values = first[2]
    if values.size == 1:
      what = f"{first[1]} is {values[0]}"
    else:  # a per-client metric: name the clients
      bad_clients = np.flatnonzero(~np.isfinite(values)).tolist()
      shown = np.array2string(values[bad_clients], threshold=6, precision=4)
      what = f"{first[1]} is not finite for client(s) {bad_clients[:10]} ({shown})"
    others = [
      n
      for n in names
      if n != first[1]
      and not np.all(np.isfinite(np.asarray(metrics[n]).reshape(evaluated.shape[0], -1)[first[0]]))
    ]
    if others:
      what += f", and so are {', '.join(others[:3])}" + (" ..." if len(others) > 3 else "")
    earlier = np.flatnonzero(evaluated[: first[0]])
    before = (
      f"round {rounds_before + int(earlier[-1]) + 1} was finite"
      if earlier.size
      else "the rounds before it were finite"
      if rounds_before
      else "it was the first evaluated round"
    )
    raise NonFiniteError(
      f"round {r}: {what} ({before}). Lower the learning rate, or check the data for NaN "
      "or out-of-range labels and the problem's exp/log terms.",
      r,
      None,
      (),
      first[1],
    )
  if not model_finite:
    last = int(fetch(state.round))
    raise NonFiniteError(
      f"rounds {rounds_before + 1}-{last}: the server model has non-finite values.", last, None
    )
