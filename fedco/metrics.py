"""Per-client metrics over a :class:`~fedco.data.FederatedData`, for ``metrics_fn``.

Federated objectives care about the spread over clients, not only the pooled mean: a
distributionally robust method is judged by its worst client. :func:`per_client_mean`
evaluates a per-example function and averages it within each client (one value per client,
``[K]``), and :func:`summarize` reduces that to the mean and the worst client. Both are
jittable, so they run inside ``fedco.simulate``'s compiled rounds through its
``metrics_fn``::

  def metrics_fn(params, test):  # fedco.simulate(..., metrics_fn=metrics_fn, metrics_data=test)
    acc = fedco.metrics.per_client_mean(accuracy, params, test)  # accuracy(params, example)
    mean, worst = fedco.metrics.summarize(acc, worst="min")
    return {"acc_avg": mean, "acc_worst": worst}
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fedco import _labels
from fedco.data.federated import FederatedData


def per_client_mean(fn: Callable[[Any, Any], Any], params, data: FederatedData):
  r"""Each client's mean of a per-example function: one value per client, ``[K]``.

  For client :math:`k` with examples :math:`D_k`, computes
  :math:`\frac{1}{n_k} \sum_{e \in D_k} \mathrm{fn}(x, e)` for every leaf of ``fn``'s
  output. Runs over the flat ``(row, owner)`` list, so the cost is :math:`\sum_k n_k`
  evaluations (``jax.vmap``). On client-block data (:mod:`fedco.runtime.distributed`) the
  rows already are that list (padding weighs 0), so nothing is gathered and no block leaves
  its device. Class labels that ``fn`` passes to ``fedco.models.accuracy`` or
  ``cross_entropy`` are checked against the data's concrete labels while tracing.

  Args:
    fn: ``fn(params, example) -> pytree`` of scalars (per-example loss, accuracy, or a
      tuple of them); ``example`` is one row of ``data.examples``.
    params: the model passed to ``fn`` unchanged (not vmapped).
    data: the clients (a :class:`~fedco.data.FederatedData` or client-block data).

  Returns:
    ``fn``'s output structure with every leaf of shape ``[K]`` (its dtype): client
    :math:`k`'s mean at index :math:`k`.

  Raises:
    ValueError: a class label read by ``fn`` lies outside the model's classes (the message
      names the field and its range).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.data.FederatedData.from_clients(
    ...   [{"y": np.array([1.0, 3.0], np.float32)}, {"y": np.array([10.0], np.float32)}]
    ... )
    >>> loss = lambda x, e: (x - e["y"]) ** 2
    >>> per_client = fedco.metrics.per_client_mean(loss, jnp.float32(0.0), data)
    >>> per_client.shape, per_client.tolist()  # client 0: (1 + 9) / 2
    ((2,), [5.0, 100.0])
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
  """The mean over clients and the worst client of a per-client metric.

  The two numbers federated robustness is reported by (average and worst-client accuracy
  or loss). The mean is unweighted: every client counts once, whatever its size.

  Args:
    per_client: ``[K]`` values, e.g. from :func:`per_client_mean`.
    worst: which end is worst: ``"min"`` (default; accuracy, higher is better) or
      ``"max"`` (a loss).

  Returns:
    ``(mean, worst)``, two scalar arrays.

  Raises:
    ValueError: ``worst`` is neither ``"min"`` nor ``"max"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> accuracy = jnp.array([0.9, 0.6, 0.75])  # three clients
    >>> mean, worst = fedco.metrics.summarize(accuracy, worst="min")
    >>> print(round(float(mean), 4), round(float(worst), 4))
    0.75 0.6
  """
  if worst not in ("min", "max"):
    raise ValueError(f'worst must be "min" (accuracy) or "max" (a loss), got {worst!r}')
  pick = jnp.min if worst == "min" else jnp.max
  return jnp.mean(per_client), pick(per_client)


__all__ = ["per_client_mean", "summarize"]
