"""Batches and oracles: one client's rows drawn by position in its slice of the data's row
list (memory ``O(total examples)``, never ``clients x largest client``), and the keyword
arguments an algorithm's ``update`` takes, bound to them. Weights are in the run's float
type."""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fedco import _validate
from fedco.data.federated import FederatedData
from fedco.problems.base import Problem


class ClientView(NamedTuple):
  """What one client slot reads (the runtime ``vmap``-s it over a round's slots).

  A client's rows are ``count`` consecutive positions from ``start``: in the compact layout
  (one process) positions index ``row_list``, the data's sorted list of rows into one
  ``examples`` array shared by all clients, so memory is ``O(total examples)``; with resident
  client blocks (:mod:`fedco.runtime.distributed`) each slot holds its own block of
  ``max_count`` rows and positions are rows of it. :func:`draw` turns a view into a batch.

  Attributes:
    examples: every example (compact layout; not mapped) or the slot's own block of
      ``max_count`` rows (resident client blocks); a pytree of arrays with a leading example
      axis.
    start: where the client's rows start in ``row_list`` (compact) or its block (``0``).
    count: the client's number of examples.
    row_list: the data's ``flat_rows`` (compact); ``None`` when positions are rows (blocks).
    id_offset: resident blocks only: the compact example id of the block's first row, so the
      ids an algorithm sees equal those of a one-process run (``None`` otherwise).

  Examples:
    A client owning rows 1-3 of five examples; ``batch_size=None`` takes its whole data,
    padded to ``max_count`` with weight-0 repeats of its first example:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco.runtime import ClientView, draw
    >>> examples = {"x": jnp.arange(5.0)}
    >>> view = ClientView(examples, jnp.array(1), jnp.array(3), row_list=jnp.arange(5))
    >>> batch, weights = draw(jax.random.PRNGKey(0), view, None, max_count=4)
    >>> batch["x"].tolist()
    [1.0, 2.0, 3.0, 1.0]
    >>> [round(float(w), 4) for w in weights]
    [0.3333, 0.3333, 0.3333, 0.0]
  """

  examples: Any
  start: jax.Array
  count: jax.Array  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  row_list: Optional[jax.Array] = None
  id_offset: Optional[jax.Array] = None


def draw(
  key, view: ClientView, batch_size: Optional[int], max_count: int, *, return_rows: bool = False
):
  r"""One client's batch from its view: rows gathered by position, and weights summing to 1.

  ``batch_size=None`` takes the client's whole data: ``max_count`` positions (static), those
  past ``count`` repeat the client's first example with weight 0, so the weights are
  ``1 / count`` on its rows. Otherwise ``batch_size`` positions are drawn uniformly *with
  replacement* from ``[0, count)`` (so ``batch_size`` may exceed ``count``) and every weight
  is ``1 / batch_size``. A batch's weighted sum of per-example values is the mini-batch mean
  the oracles use, e.g. :math:`g_k(x; \zeta) = \sum_i w_i\, g(x; \zeta_i)`. Traceable.

  Args:
    key: a PRNG key (unused when ``batch_size`` is ``None``).
    view: the client's :class:`ClientView`.
    batch_size: examples per batch, an int ``>= 1``, or ``None`` for the whole data.
    max_count: the largest client's size (static): the batch length when ``batch_size`` is
      ``None``.
    return_rows: also return the examples' ids (``int32 [b]``; primal-dual DRO keeps one
      weight per id).

  Returns:
    ``(batch, weights)``, or ``(batch, weights, rows)`` with ``return_rows=True``: ``batch``
    is ``examples`` gathered at the drawn rows (leaves ``[b, ...]``), ``weights`` a ``[b]``
    array in the run's float type summing to 1, ``rows`` the ``int32 [b]`` example ids.

  Examples:
    Three rows drawn with replacement from a client of four (rows 0-3 of ``examples``):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco.runtime import ClientView, draw
    >>> view = ClientView({"x": jnp.arange(6.0)}, jnp.array(0), jnp.array(4))
    >>> batch, weights, rows = draw(
    ...   jax.random.PRNGKey(0), view, 3, max_count=4, return_rows=True
    ... )
    >>> batch["x"].shape, bool(jnp.all(rows < 4))
    ((3,), True)
    >>> [round(float(w), 4) for w in weights]
    [0.3333, 0.3333, 0.3333]
  """
  if batch_size is None:
    pos = jnp.arange(max_count)
    valid = pos < view.count
    pos = jnp.where(valid, pos, 0)
    weights = valid.astype(run_float()) / view.count
  else:
    pos = jax.random.randint(key, (batch_size,), 0, view.count)
    weights = jnp.full((batch_size,), 1.0 / batch_size, run_float())
  return _gather(view, pos, weights, return_rows)


def _gather(view, pos, weights, return_rows):
  """The view's rows at positions ``pos``: ``(batch, weights[, rows])``."""
  rows = view.start + pos
  if view.row_list is not None:
    rows = view.row_list[rows]
  batch = jax.tree.map(lambda a: a[rows], view.examples)
  if not return_rows:
    return batch, weights
  return batch, weights, rows if view.id_offset is None else rows + view.id_offset


def epoch_draw(
  key,
  view: ClientView,
  batch_size: int,
  max_count: int,
  step,
  *,
  return_rows: bool = False,
):
  r"""Batch ``step`` of a client's epochs: consecutive slices of a shuffle of its rows.

  An epoch is :math:`\lceil n_k / B \rceil` batches of ``batch_size`` :math:`B` (``n_k`` is
  the view's ``count``): batch ``j`` of epoch ``e`` holds positions ``jB, ..., jB + B - 1``
  of a uniform shuffle of ``[0, n_k)`` drawn from ``fold_in(key, e)``, so every row is used
  exactly once per epoch and each epoch has a fresh shuffle. The last batch of an epoch
  holds the remainder: its weights are ``1 / (its size)`` and the positions beyond it repeat
  a row with weight 0 (the weights sum to 1). Traceable, with ``view`` and ``step`` traced
  (``vmap`` over clients, a loop over steps); the shuffle is a random permutation of
  ``max_count`` (static) whose entries below ``n_k`` keep their order (a uniform shuffle of
  ``[0, n_k)``).

  Args:
    key: the client's epoch key (the simulator folds a constant into its round key).
    view: the client's :class:`ClientView` (``count >= 1``).
    batch_size: :math:`B`, an int ``>= 1``.
    max_count: the largest client's size (static).
    step: the local step, an int ``>= 0`` (epoch ``step // ceil(n_k / B)``).
    return_rows: also return the examples' ids, as :func:`draw`.

  Returns:
    As :func:`draw`: ``(batch, weights)`` or ``(batch, weights, rows)``, ``batch_size`` long.

  Examples:
    A client of 5 rows at batch 2: each epoch is 3 batches (2, 2 and 1 rows) that cover
    its rows once:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco.runtime.batching import ClientView, epoch_draw
    >>> view = ClientView({"x": jnp.arange(5.0)}, jnp.array(0), jnp.array(5))
    >>> key = jax.random.PRNGKey(0)
    >>> epoch = [epoch_draw(key, view, 2, 5, step) for step in range(3)]
    >>> sorted(float(x) for (b, w) in epoch for x, wi in zip(b["x"], w) if wi > 0)
    [0.0, 1.0, 2.0, 3.0, 4.0]
    >>> [w.tolist() for _, w in epoch]
    [[0.5, 0.5], [0.5, 0.5], [1.0, 0.0]]
  """
  count = jnp.maximum(view.count, 1)
  per_epoch = (count + batch_size - 1) // batch_size
  perm = jax.random.permutation(jax.random.fold_in(key, step // per_epoch), max_count)
  shuffle = perm[jnp.argsort(perm >= count, stable=True)]  # [0, count) first, in perm's order
  index = (step % per_epoch) * batch_size + jnp.arange(batch_size)
  valid = index < count
  pos = jnp.where(valid, shuffle[jnp.minimum(index, max_count - 1)], shuffle[0])
  weights = valid.astype(run_float()) / jnp.sum(valid)
  return _gather(view, pos, weights, return_rows)


def epoch_steps(data, batch_size: int, local_epochs: int = 1) -> int:
  r"""The local steps the largest client takes in ``local_epochs`` epochs at ``batch_size``.

  A client of :math:`n_k` rows takes :math:`E \lceil n_k / B \rceil` steps in ``E`` epochs
  (:func:`epoch_draw`); the simulator runs at most the algorithm's ``local_steps`` a round,
  so ``local_steps=epoch_steps(data, B, E)`` lets every client finish its epochs.

  Args:
    data: a :class:`~fedco.data.FederatedData` or :class:`~fedco.data.ClientStore` (its
      ``counts``).
    batch_size: :math:`B`, an int ``>= 1``.
    local_epochs: :math:`E`, an int ``>= 1`` (default 1).

  Returns:
    :math:`E \max_k \lceil n_k / B \rceil`, an ``int``.

  Raises:
    ValueError: ``batch_size`` or ``local_epochs`` is not an int ``>= 1``.

  Examples:
    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.FederatedData.from_clients([{"x": np.zeros(n, np.float32)} for n in (3, 9)])
    >>> fedco.runtime.epoch_steps(data, batch_size=4), fedco.runtime.epoch_steps(data, 4, 2)
    (3, 6)
  """
  batch_size = _validate.positive_int("batch_size", batch_size)
  local_epochs = _validate.positive_int("local_epochs", local_epochs)
  return local_epochs * int(-(-int(np.max(np.asarray(data.counts))) // batch_size))


def draw_batch(
  key, data: FederatedData, client, batch_size: Optional[int], *, return_rows: bool = False
):
  """Client ``client``'s mini-batch of ``data`` and its weights (see :func:`draw`).

  Builds the client's :class:`ClientView` of the compact layout and draws from it: the way to
  get a client's batch in your own loop, as the simulator does. Batches are drawn *with
  replacement*, so ``batch_size`` may exceed a client's size; ``batch_size=None`` is the
  client's whole data, padded to ``data.max_count`` rows with weight 0. Traceable;
  ``client`` may be traced (``jax.vmap`` over client ids).

  Args:
    key: a PRNG key.
    data: the :class:`~fedco.data.FederatedData`.
    client: the client's id, an int (or int array) in ``[0, K)``.
    batch_size: examples per batch, an int ``>= 1``, or ``None`` for the whole data.
    return_rows: also return the drawn examples' rows (ids into ``data.examples``).

  Returns:
    ``(batch, weights)``, or ``(batch, weights, rows)`` with ``return_rows=True``: ``batch``
    has leaves ``[b, ...]`` (``b`` is ``batch_size``, or ``data.max_count`` for ``None``),
    ``weights`` is ``[b]`` and sums to 1, ``rows`` is ``int32 [b]``.

  Examples:
    Both clients' whole-data batches at once, as the simulator draws them (``vmap`` over
    client ids, under ``jit``); client 0's is padded to the largest client's 5 rows:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> data = fedco.FederatedData.from_clients(
    ...   [{"x": np.arange(3.0, dtype=np.float32)}, {"x": np.arange(10.0, 15.0, dtype=np.float32)}]
    ... )
    >>> draw = lambda client: fedco.runtime.draw_batch(jax.random.PRNGKey(0), data, client, None)
    >>> batch, weights = jax.jit(jax.vmap(draw))(jnp.arange(2))
    >>> batch["x"].tolist()
    [[0.0, 1.0, 2.0, 0.0, 0.0], [10.0, 11.0, 12.0, 13.0, 14.0]]
    >>> [[round(float(w), 2) for w in row] for row in weights]
    [[0.33, 0.33, 0.33, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2, 0.2]]
  """
  view = ClientView(data.examples, data.offsets[client], data.counts[client], data.flat_rows)
  return draw(key, view, batch_size, data.max_count, return_rows=return_rows)


def oracle_args(
  problem: Problem, inner_batch, outer_batch, next_inner_batch=None, weights=(None, None, None)
):
  r"""The keyword arguments an algorithm's ``update`` takes, bound to the given batches.

  An algorithm is an optax transform whose ``update(updates, state, params, **oracles)`` reads
  the problem through oracles (SPEC 0): the inner map :math:`g(x; \zeta)` on ``inner_batch``,
  the outer :math:`f(y; \xi)` and the extra term :math:`h(x; \xi)` on ``outer_batch``, and an
  independent inner sample :math:`g(x; \zeta')` on ``next_inner_batch`` for tracker refreshes.
  Each is the batch's weighted mean of the problem's per-example functions
  (``inner(params, example) -> pytree``, ``outer(y[, example]) -> scalar``,
  ``extra(params, example) -> scalar``); weights default to uniform means. This is what the
  simulator calls each local step, and what a hand-written loop uses (README, Use 1).

  Args:
    problem: the :class:`~fedco.problems.Problem`.
    inner_batch: the batch of :math:`g` (a pytree of arrays with a leading example axis).
    outer_batch: the batch of :math:`f` (when it reads data) and of :math:`h`.
    next_inner_batch: the batch of ``next_inner_fn``; ``None`` reuses ``inner_batch`` (then
      the "next" sample is not independent).
    weights: ``(inner, outer, next_inner)`` weight vectors ``[b]`` summing to 1 (as
      :func:`draw` returns, 0 on padding); a ``None`` entry is the uniform mean.

  Returns:
    ``(grad_h_fn, kwargs)``. ``grad_h_fn(params)`` is :math:`\nabla h(x; \xi)` on
    ``outer_batch`` (pass it as ``update``'s ``updates``), or ``None`` when the problem has no
    extra term. ``kwargs`` holds, for compositional problems, ``inner_fn`` (``x -> g(x;
    zeta)``), ``outer_fn`` (``y -> f(y; xi)``) and ``next_inner_fn`` (``x -> g(x; zeta')``),
    plus ``unlinked_outer_fn`` (the outer's batch mean before the problem's ``outer_link``)
    when it has one; and, when there is an extra term, ``extra_fn`` (the value of ``h``),
    ``example_losses_fn`` (``x -> [b]``, the per-example values ``h(x; xi_i)`` of the outer
    batch, for sample-reweighting baselines such as FastDRO) and ``example_weights``
    (``[b]``, the outer batch's weights; 0 on padding).

  Examples:
    Client-level KL-DRO's exp form, :math:`f(y) = \exp(y / \gamma)` of the mean loss, and one
    step of ComFedL's ``update`` fed with the oracles (the step is
    :math:`-\eta \exp(g / \gamma) / \gamma\, \nabla g`):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> loss = lambda w, e: jnp.sum((w - e["x"]) ** 2)  # l(w; e)
    >>> problem = fedco.problems.client_kl_dro(loss, gamma=1.0)
    >>> batch = {"x": jnp.array([[1.0, 0.0], [0.0, 1.0]])}
    >>> grad_h, oracles = fedco.oracle_args(problem, batch, batch)
    >>> grad_h is None, sorted(oracles)
    (True, ['inner_fn', 'next_inner_fn', 'outer_fn'])
    >>> y = oracles["inner_fn"](jnp.zeros(2))  # g(0; zeta): the batch's mean loss, 1
    >>> round(float(oracles["outer_fn"](y)), 4)  # f(y) = exp(1)
    2.7183
    >>> opt = fedco.comfedl(0.1, 1)
    >>> @jax.jit
    ... def step(params, state):
    ...   _, oracles = fedco.oracle_args(problem, batch, batch)
    ...   updates, state = opt.update(None, state, params, **oracles)
    ...   return optax.apply_updates(params, updates), state
    >>> params, state = step(jnp.zeros(2), opt.init(jnp.zeros(2)))
    >>> [round(float(p), 4) for p in params]
    [0.2718, 0.2718]
  """

  def _w(batch, w):
    if w is not None:
      return w
    n = jax.tree.leaves(batch)[0].shape[0]
    return jnp.full((n,), 1.0 / n, run_float())

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
  extra = problem.extra
  if extra is not None:
    grad_h = lambda x: problem.extra_grad(x, outer_batch, wf)
    kwargs["extra_fn"] = lambda x: problem.extra_value(x, outer_batch, wf)
    kwargs["example_losses_fn"] = lambda x: jax.vmap(extra, in_axes=(None, 0))(x, outer_batch)
    kwargs["example_weights"] = wf
  return grad_h, kwargs


def run_float():
  """The run's float type for weights: float64 under ``jax_enable_x64``, else float32 (a mean
  over float32 values casts the weights down; float64 runs keep every digit)."""
  return jnp.result_type(float)
