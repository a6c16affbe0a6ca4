"""Batches and oracles: one client's rows drawn by index, and the keyword arguments an
algorithm's ``update`` takes, bound to them. Weights are in the run's float type."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from fedco.problems.base import Problem


def draw_batch(key, index_row, count, examples, batch_size: Optional[int], *,
               return_rows: bool = False):
  """One client's batch: rows gathered by index, and their weights (summing to 1).

  ``batch_size=None`` takes the client's whole data (deterministic; padding rows weigh 0).
  Otherwise ``batch_size`` positions are drawn uniformly with replacement from the client's
  ``count`` examples. ``return_rows=True`` also returns the drawn rows of ``examples``
  (``int32 [b]``), the examples' global ids (primal-dual DRO keeps one weight per row).
  """
  if batch_size is None:
    rows = index_row
    weights = (jnp.arange(index_row.shape[0]) < count).astype(_float()) / count
  else:
    pos = jax.random.randint(key, (batch_size,), 0, count)
    rows = index_row[pos]
    weights = jnp.full((batch_size,), 1.0 / batch_size, _float())
  batch = jax.tree.map(lambda a: a[rows], examples)
  return (batch, weights, rows) if return_rows else (batch, weights)


def oracle_args(problem: Problem, inner_batch, outer_batch, next_inner_batch=None,
                weights=(None, None, None)):
  """The keyword arguments an algorithm's ``update`` takes, bound to the given batches.

  Returns ``(grad_h_fn, kwargs)``: ``grad_h_fn(params)`` is ``grad h(x; outer_batch)`` (or
  ``None`` without an extra term), and ``kwargs`` holds ``inner_fn``, ``outer_fn`` and
  ``next_inner_fn`` for compositional problems and, when there is an extra term,
  ``extra_fn`` (the value of ``h``), ``example_losses_fn`` (``x -> [b]``, the per-example
  values ``h(x; xi_i)`` of the outer batch, for sample-reweighting baselines such as
  FastDRO) and ``example_weights`` (``[b]``, the outer batch's weights; 0 on padding).
  Weights default to uniform means.
  """

  def _w(batch, w):
    if w is not None:
      return w
    n = jax.tree.leaves(batch)[0].shape[0]
    return jnp.full((n,), 1.0 / n, _float())

  next_inner_batch = inner_batch if next_inner_batch is None else next_inner_batch
  wg, wf, wn = (_w(b, w) for b, w in zip((inner_batch, outer_batch, next_inner_batch), weights))
  kwargs = {}
  if problem.compositional:
    kwargs = dict(
        inner_fn=lambda x: problem.inner_value(x, inner_batch, wg),
        outer_fn=lambda y: problem.outer_value(y, outer_batch, wf),
        next_inner_fn=lambda x: problem.inner_value(x, next_inner_batch, wn))
  grad_h = None
  if problem.extra is not None:
    grad_h = lambda x: problem.extra_grad(x, outer_batch, wf)
    kwargs["extra_fn"] = lambda x: problem.extra_value(x, outer_batch, wf)
    kwargs["example_losses_fn"] = lambda x: jax.vmap(problem.extra, in_axes=(None, 0))(
        x, outer_batch)
    kwargs["example_weights"] = wf
  return grad_h, kwargs


def _float():
  """The run's float type for weights: float64 under ``jax_enable_x64``, else float32 (a mean
  over float32 values casts the weights down; float64 runs keep every digit)."""
  return jnp.result_type(float)
