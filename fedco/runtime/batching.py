"""Batches and oracles: one client's rows drawn by position in its slice of the data's row
list (memory ``O(total examples)``, never ``clients x largest client``), and the keyword
arguments an algorithm's ``update`` takes, bound to them. Weights are in the run's float
type."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedco.data.federated import FederatedData
from fedco.problems.base import Problem


class ClientView(NamedTuple):
  """What one client slot reads (the runtime ``vmap``-s it over a round's slots).

  Attributes:
    examples: every example (compact layout; not mapped) or the slot's own block of
      ``max_count`` rows (resident client blocks).
    start: where the client's rows start in ``row_list`` (compact) or its block (``0``).
    count: the client's number of examples.
    row_list: the data's ``flat_rows`` (compact); ``None`` when positions are rows (blocks).
    id_offset: resident blocks only: the compact example id of the block's first row, so the
      ids an algorithm sees equal those of a one-process run (``None`` otherwise).
  """

  examples: Any
  start: jax.Array
  count: jax.Array
  row_list: Optional[jax.Array] = None
  id_offset: Optional[jax.Array] = None


def draw(
  key, view: ClientView, batch_size: Optional[int], max_count: int, *, return_rows: bool = False
):
  """One client's batch from its view: rows gathered by position, and weights summing to 1.

  ``batch_size=None`` takes the client's whole data: ``max_count`` positions (static), those
  past ``count`` repeat the client's first example with weight 0. Otherwise ``batch_size``
  positions are drawn uniformly with replacement from ``[0, count)``. ``return_rows=True``
  also returns the examples' ids (``int32 [b]``; primal-dual DRO keeps one weight per id).
  """
  if batch_size is None:
    pos = jnp.arange(max_count)
    valid = pos < view.count
    pos = jnp.where(valid, pos, 0)
    weights = valid.astype(_float()) / view.count
  else:
    pos = jax.random.randint(key, (batch_size,), 0, view.count)
    weights = jnp.full((batch_size,), 1.0 / batch_size, _float())
  rows = view.start + pos
  if view.row_list is not None:
    rows = view.row_list[rows]
  batch = jax.tree.map(lambda a: a[rows], view.examples)
  if not return_rows:
    return batch, weights
  return batch, weights, rows if view.id_offset is None else rows + view.id_offset


def draw_batch(
  key, data: FederatedData, client, batch_size: Optional[int], *, return_rows: bool = False
):
  """Client ``client``'s batch of ``data`` (see :func:`draw`): ``(batch, weights)``, and the
  drawn example rows with ``return_rows=True``. Traceable; ``client`` may be traced.

  Batches are drawn *with replacement*, so ``batch_size`` may exceed a client's size;
  ``batch_size=None`` is the client's whole data.
  """
  view = ClientView(data.examples, data.offsets[client], data.counts[client], data.flat_rows)
  return draw(key, view, batch_size, data.max_count, return_rows=return_rows)


def oracle_args(
  problem: Problem, inner_batch, outer_batch, next_inner_batch=None, weights=(None, None, None)
):
  """The keyword arguments an algorithm's ``update`` takes, bound to the given batches.

  Returns ``(grad_h_fn, kwargs)``: ``grad_h_fn(params)`` is ``grad h(x; outer_batch)`` (or
  ``None`` without an extra term), and ``kwargs`` holds ``inner_fn``, ``outer_fn`` and
  ``next_inner_fn`` for compositional problems (and ``unlinked_outer_fn``, the outer's
  batch mean before the problem's ``outer_link``, when it has one) and, when there is an
  extra term,
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
      next_inner_fn=lambda x: problem.inner_value(x, next_inner_batch, wn),
    )
    if problem.outer_link is not None:  # the loss inside the link (normalised ComFedL)
      kwargs["unlinked_outer_fn"] = lambda y: problem.unlinked_outer_value(y, outer_batch, wf)
  grad_h = None
  if problem.extra is not None:
    grad_h = lambda x: problem.extra_grad(x, outer_batch, wf)
    kwargs["extra_fn"] = lambda x: problem.extra_value(x, outer_batch, wf)
    kwargs["example_losses_fn"] = lambda x: jax.vmap(problem.extra, in_axes=(None, 0))(
      x, outer_batch
    )
    kwargs["example_weights"] = wf
  return grad_h, kwargs


def _float():
  """The run's float type for weights: float64 under ``jax_enable_x64``, else float32 (a mean
  over float32 values casts the weights down; float64 runs keep every digit)."""
  return jnp.result_type(float)
