"""Per-client metrics over a :class:`~fedco.data.FederatedData`, for ``metrics_fn``."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedco import _labels
from fedco.data.federated import FederatedData


def per_client_mean(fn: Callable[[Any, Any], Any], params, data: FederatedData):
  """``fn(params, example)`` averaged over each client's examples: leaves of shape ``[K]``.

  Runs over the flat ``(row, owner)`` list, so the cost is ``sum_k n_k`` evaluations. On
  client-block data (:mod:`fedco.runtime.distributed`) the rows already are that list
  (padding weighs 0), so nothing is gathered and no block leaves its device.
  """
  from fedco.runtime import distributed  # pylint: disable=g-import-not-at-top (import cycle)

  if isinstance(data, distributed.ClientBlockData):
    examples = data.examples
  else:
    examples = jax.tree.map(lambda a: a[data.flat_rows], data.examples)

  def checked(p, example):  # a label read from the example: checked against the data
    with _labels.from_data(example, data.examples, data.flat_rows):
      return fn(p, example)

  values = jax.vmap(checked, in_axes=(None, 0))(params, examples)
  weights = data.flat_weights()
  return jax.tree.map(
    lambda v: jax.ops.segment_sum(
      weights.reshape(weights.shape + (1,) * (v.ndim - 1)).astype(v.dtype) * v,
      data.flat_owner,
      num_segments=data.num_clients,
    ),
    values,
  )


def summarize(per_client: jax.Array, *, worst: str = "min"):
  """``(mean over clients, worst client)``; ``worst`` is ``"min"`` (accuracy) or ``"max"``."""
  pick = jnp.min if worst == "min" else jnp.max
  return jnp.mean(per_client), pick(per_client)


__all__ = ["per_client_mean", "summarize"]
