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

:func:`pooled_mean` is the other reading, the one TFF and the papers that use it report: a
metric over the whole held-out set pooled, each example (or each scored token of a
sequence) counted once, so large clients weigh more.
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

  values = jax.vmap(_checked(fn, data), in_axes=(None, 0))(params, examples)
  weights = data.flat_weights()
  return jax.tree.map(
    lambda v: jax.ops.segment_sum(
      weights.reshape(weights.shape + (1,) * (v.ndim - 1)).astype(v.dtype) * v,
      data.flat_owner,
      num_segments=data.num_clients,
    ),
    values,
  )


def _checked(fn, data):
  """``fn`` with the labels it reads from an example checked against ``data``'s."""

  def checked(p, example):
    with _labels.from_data(example, data.examples, data.flat_rows):
      return fn(p, example)

  return checked


def per_client_models_mean(fn: Callable[[Any, Any], Any], models, data: FederatedData):
  r"""Each client's mean of a per-example function at *its own* model: ``[K]`` per leaf.

  :func:`per_client_mean` with a model per client (personalised methods: FedRep's heads,
  APFL's mixtures, Ditto's personal models; :func:`fedco.algorithms.personal.personal_model`
  gives them): client :math:`k`'s mean of ``fn(models[k], e)`` over :math:`e \in D_k`. The
  clients are taken one at a time (``jax.lax.map``), each over its rows padded to
  ``data.max_count`` (padding weighs 0), so one model's evaluations exist at once and the
  cost is :math:`K \cdot \max_k n_k` evaluations.

  Args:
    fn: ``fn(params, example) -> pytree`` of scalars.
    models: the clients' models, every leaf ``[K, ...]`` (client ``k``'s at index ``k``).
    data: the clients (a :class:`~fedco.data.FederatedData`).

  Returns:
    ``fn``'s output structure with every leaf of shape ``[K]``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.FederatedData.from_clients(
    ...   [{"y": np.array([1.0, 3.0], np.float32)}, {"y": np.array([10.0], np.float32)}]
    ... )
    >>> models = jnp.array([0.0, 10.0])  # client 1's model fits it exactly
    >>> err = lambda w, e: (e["y"] - w) ** 2
    >>> fedco.metrics.per_client_models_mean(err, models, data).tolist()
    [5.0, 0.0]
  """
  position = jnp.arange(data.max_count)

  def one(args):
    model, offset, count = args
    rows = data.flat_rows[offset + jnp.minimum(position, count - 1)]
    examples = jax.tree.map(lambda a: a[rows], data.examples)

    values = jax.vmap(_checked(fn, data), in_axes=(None, 0))(model, examples)
    weight = (position < count).astype(jnp.result_type(float)) / count
    return jax.tree.map(lambda v: jnp.tensordot(weight.astype(v.dtype), v, axes=(0, 0)), values)

  return jax.lax.map(one, (models, data.offsets, data.counts))


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


def pooled_mean(fn: Callable[[Any, Any], Any], params, examples, *, batch_size: int = 0):
  r"""Metrics pooled over a whole set of examples, each weighted by its own count.

  ``fn(params, example)`` returns ``{name: (value, weight)}`` for one example: ``value`` the
  example's mean of the metric over what it scores and ``weight`` how many things that is
  (``1`` for an image; the scored tokens of a sequence). The result is, per name,
  :math:`\sum_e w_e v_e / \sum_e w_e`: the metric over every scored item of the set, as TFF
  evaluates a model on a whole test split (Shakespeare's accuracy over all non-special
  tokens, EMNIST's over all images), not a mean over clients (:func:`per_client_mean`).
  A set whose weights sum to 0 gives 0. Jittable; evaluated ``batch_size`` examples at a
  time (``jax.lax.map``), so memory stays bounded on a large set.

  Args:
    fn: ``fn(params, example) -> {name: (value, weight)}``, scalars; ``example`` is one row
      of ``examples``.
    params: the model passed to ``fn`` unchanged.
    examples: a pytree of arrays with a leading example axis (``FederatedDataset.test``).
    batch_size: examples evaluated together (``0``: all at once).

  Returns:
    ``{name: scalar}``, the pooled means.

  Raises:
    ValueError: ``batch_size`` is not an int ``>= 0``, or ``fn`` does not return
      ``{name: (value, weight)}``.

  Examples:
    Two sequences with 3 and 1 scored tokens, right on 2 of 3 and on 1 of 1: pooled 3 of 4
    (a mean over the two sequences would say 5/6):

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> examples = {"hits": jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]),
    ...             "scored": jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])}
    >>> def fn(params, e):
    ...   count = e["scored"].sum()
    ...   return {"accuracy": ((e["hits"] * e["scored"]).sum() / count, count)}
    >>> pooled = fedco.metrics.pooled_mean(fn, None, examples, batch_size=1)
    >>> float(pooled["accuracy"])
    0.75
  """
  if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 0:
    raise ValueError(f"batch_size must be an int >= 0 (0: all at once), got {batch_size!r}")

  def one(example):
    out = fn(params, example)
    if not isinstance(out, dict) or not all(
      isinstance(v, tuple) and len(v) == 2 for v in out.values()
    ):
      raise ValueError(
        f"pooled_mean's fn must return {{name: (value, weight)}}, got {type(out).__name__}"
      )
    pairs = {k: (jnp.asarray(v), jnp.asarray(w)) for k, (v, w) in out.items()}
    return {k: (v, w.astype(v.dtype)) for k, (v, w) in pairs.items()}

  values = jax.lax.map(one, examples, batch_size=batch_size or None)
  out = {}
  for name, (value, weight) in values.items():
    total = jnp.sum(weight)
    out[name] = jnp.where(total > 0, jnp.sum(value * weight) / jnp.where(total > 0, total, 1), 0)
  return out


__all__ = ["per_client_mean", "per_client_models_mean", "pooled_mean", "summarize"]
