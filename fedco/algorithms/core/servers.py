"""Servers: what combines the clients' values at the end of a round.

An algorithm's server is an optax transform on the pseudo-gradient
(:func:`averaging_server`, wrapped by :func:`optax_aggregator`) or a
:class:`ServerAggregator` that sees every client's values and the round's
:class:`RoundInfo`; :func:`as_aggregator` turns either into an aggregator, and
:func:`weighted_client_mean` and :func:`project_simplex` are their building blocks.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import optax

from fedco.algorithms.core.types import PyTree


class RoundInfo(NamedTuple):
  """What a server aggregator may read about the round that just ended.

  Attributes:
    ids: ``int32 [m]``, the round's clients (sorted).
    weights: ``[m]``, the plan's averaging weights for them (uniform or by data size).
    counts: ``int32 [m]``, their data sizes.
    num_clients: ``K``, all clients.
    key: a PRNG key for the server's own randomness.
    client_losses: ``(params, ids, key) -> [len(ids)]``: each listed client's loss of
      ``params`` on one fresh mini-batch of its data (DRFA's loss queries).
    alive: ``bool [m]``: which of them survived the round (client dropout); dropped
      clients' values must not count. Their ``weights`` are already 0. ``None``
      (default): all of them; ``alive_mask`` gives the mask either way.
    combine: the run's aggregation rule (a :class:`fedco.byzantine.Rule`, the
      simulator's ``aggregation=``) or ``None`` (default: the weighted mean); an aggregator
      that declares ``combines=True`` takes its means of client values through
      :meth:`center`.

  Examples:
    The usual server after a round whose second client dropped out:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> info = extend.RoundInfo(ids=jnp.array([0, 2]), weights=jnp.array([1.0, 0.0]),
    ...                         counts=jnp.array([5, 5]), num_clients=3,
    ...                         key=jax.random.key(0), client_losses=None,
    ...                         alive=jnp.array([True, False]))
    >>> server = extend.optax_aggregator(extend.averaging_server())
    >>> values = {"params": jnp.zeros(2)}
    >>> clients = {"params": jnp.array([[1.0, 2.0], [9.0, 9.0]])}
    >>> values, _ = server.update(values, server.init(values, info.counts), clients, info)
    >>> [round(float(v), 4) for v in values["params"]]
    [1.0, 2.0]
  """

  ids: jax.Array
  weights: jax.Array
  counts: jax.Array
  num_clients: int
  key: jax.Array
  client_losses: Callable[..., jax.Array]
  alive: Optional[jax.Array] = None
  combine: Optional[Callable[..., Any]] = None

  @property
  def alive_mask(self) -> jax.Array:
    return jnp.ones(self.ids.shape, bool) if self.alive is None else self.alive

  def center(self, values: PyTree, weights: jax.Array) -> PyTree:
    """The surviving clients' ``values`` (changes from a server copy, leading ``[m]``
    axis) combined with ``weights`` (summing to 1 over them): their weighted mean, or the
    run's aggregation rule (:attr:`combine`)."""
    if self.combine is None:
      return weighted_client_mean(values, weights * self.alive_mask)
    return self.combine(values, weights, self.alive_mask, centered=True)


class ServerAggregator(NamedTuple):
  """A server that sees every client's values, not only their mean.

  Attributes:
    init: ``(server_values, counts[K]) -> state``; ``server_values`` is
      ``{"params": x, field: ...}`` for the plan's ``every_round`` fields.
    update: ``(server_values, state, client_values, info: RoundInfo) ->
      (server_values, state)``; ``client_values`` holds the round's clients' ``params``,
      ``every_round`` and ``report`` fields, stacked on a leading ``[m]`` axis.
    reads_each: whether ``update`` reads the clients' values one by one (q-FedAvg, AFL,
      DRFA...) rather than only their weighted mean (:func:`optax_aggregator`); privacy
      noise then goes on each upload instead of once on the mean.
    queries_losses: whether ``update`` calls ``info.client_losses`` (DRFA's loss queries:
      uploads outside the communication plan, which privacy refuses).
    combines: whether ``update`` takes every mean of client values through
      :meth:`RoundInfo.center`, so a run's aggregation rule (``aggregation=``, e.g. a
      coordinate-wise median) reaches it; a run refuses a rule for an aggregator that does
      not (AFL and DRFA do).

  Examples:
    A coordinate-wise median server (robust to a few outlying clients; this simple one
    ignores dropout), used in place of FedAvg's:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco import extend
    >>> def init(server_values, counts):
    ...   return ()
    >>> def update(server_values, state, client_values, info):
    ...   values = {k: client_values[k] for k in server_values}
    ...   return jax.tree.map(lambda a: jnp.median(a, axis=0), values), state
    >>> opt = fedco.fedavg(0.1).replace(server=extend.ServerAggregator(init, update))
    >>> clients = {"params": jnp.array([[1.0], [2.0], [100.0]])}
    >>> info = extend.RoundInfo(ids=jnp.arange(3), weights=jnp.full(3, 1 / 3),
    ...                         counts=jnp.ones(3, int), num_clients=3,
    ...                         key=jax.random.key(0), client_losses=None)
    >>> server, _ = opt.server.update({"params": jnp.zeros(1)}, (), clients, info)
    >>> round(float(server["params"][0]), 4)
    2.0
  """

  init: Callable[..., Any]
  update: Callable[..., Tuple[Any, Any]]
  reads_each: bool = True
  queries_losses: bool = False
  combines: bool = False


def weighted_client_mean(tree: PyTree, weights: jax.Array) -> PyTree:
  r"""``sum_i w_i v_i`` over the leading clients axis.

  :math:`\sum_i w_i v_i` for every leaf :math:`v` of shape ``[m, ...]``; the weights are
  cast to each leaf's dtype and are used as given (not normalised).

  Args:
    tree: a pytree whose leaves are stacked on a leading ``[m]`` clients axis.
    weights: ``[m]``, the clients' weights (those of :class:`RoundInfo` sum to 1).

  Returns:
    a pytree of ``tree``'s structure, each leaf without the leading axis.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> tree = {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]])}
    >>> mean = extend.weighted_client_mean(tree, jnp.array([0.25, 0.75]))
    >>> [round(float(v), 4) for v in mean["w"]]
    [2.5, 5.0]
  """
  return jax.tree.map(lambda a: jnp.tensordot(weights.astype(a.dtype), a, axes=1), tree)


def optax_aggregator(tx: optax.GradientTransformation) -> ServerAggregator:
  r"""The usual server: ``tx`` applied to ``server - weighted mean of the clients``.

  The pseudo-gradient :math:`\bar v - \sum_k w_k v_k` of each server value :math:`\bar v`
  (the parameters and the plan's ``every_round`` fields), with the weights of
  :class:`RoundInfo`, is passed to ``tx``, and its updates are applied: ``optax.sgd(1.0)``
  is plain averaging (:func:`averaging_server`), ``optax.adam`` FedAdam.

  Args:
    tx: an optax transformation on ``{"params": ..., field: ...}`` dicts.

  Returns:
    a :class:`ServerAggregator` that reads only the weighted mean (``reads_each=False``),
    or, under a run's aggregation rule (``RoundInfo.combine``), the rule's center of the
    clients' changes (``combines=True``).

  Examples:
    A server that moves halfway to the clients' mean:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import extend
    >>> server = extend.optax_aggregator(optax.sgd(0.5))
    >>> info = extend.RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                         counts=jnp.array([3, 3]), num_clients=2,
    ...                         key=jax.random.key(0), client_losses=None)
    >>> values = {"params": jnp.zeros(2)}
    >>> clients = {"params": jnp.array([[2.0, 0.0], [4.0, 2.0]])}
    >>> values, _ = server.update(values, server.init(values, info.counts), clients, info)
    >>> [round(float(v), 4) for v in values["params"]]
    [1.5, 0.5]
  """

  def init(server, counts):
    del counts
    return tx.init(server)

  def update(server, state, client_values, info):
    if info.combine is None:
      means = weighted_client_mean({k: client_values[k] for k in server}, info.weights)
      pseudo_grad = jax.tree.map(jnp.subtract, server, means)
    else:  # the run's aggregation rule, on each field's changes
      pseudo_grad = {
        k: jax.tree.map(
          jnp.negative,
          info.center(
            jax.tree.map(lambda c, s: c - s[None], client_values[k], server[k]), info.weights
          ),
        )
        for k in server
      }
    updates, state = tx.update(pseudo_grad, state, server)
    return optax.apply_updates(server, updates), state

  return ServerAggregator(init, update, reads_each=False, combines=True)


def as_aggregator(server) -> ServerAggregator:
  """An :class:`Algorithm`'s ``server`` as an aggregator (optax transforms are wrapped).

  Lets code that handles servers treat both kinds alike.

  Args:
    server: a :class:`ServerAggregator` (returned as is) or an optax transformation
      (wrapped by :func:`optax_aggregator`).

  Returns:
    a :class:`ServerAggregator`.

  Examples:
    >>> import fedco
    >>> from fedco import extend
    >>> extend.as_aggregator(fedco.fedavg(0.1).server).reads_each  # an optax server
    False
  """
  if isinstance(server, ServerAggregator):
    return server
  return optax_aggregator(server)


def project_simplex(v: jax.Array) -> jax.Array:
  r"""Euclidean projection onto the probability simplex (sort-based; Duchi et al. 2008).

  .. math::

    \Pi_\Delta(v) = \arg\min_{w \in \Delta} \|w - v\|_2 = \max(v - \theta, 0),
    \qquad \Delta = \{w \in \mathbb{R}^n : w \ge 0, \textstyle\sum_i w_i = 1\},

  with the threshold :math:`\theta` found from the sorted entries in :math:`O(n \log n)`.
  DRO baselines use it to keep client or sample weights on the simplex. Traceable.

  Args:
    v: a 1-D float array of length ``n >= 1`` (not batched).

  Returns:
    ``w``, an array of ``v``'s shape and dtype: nonnegative, summing to 1.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import algorithms
    >>> w = jax.jit(algorithms.project_simplex)(jnp.array([0.5, 1.0, -0.2]))
    >>> [round(float(x), 4) for x in w]
    [0.25, 0.75, 0.0]
  """
  n = v.shape[-1]
  u = jnp.sort(v)[::-1]
  css = jnp.cumsum(u) - 1.0
  ks = jnp.arange(1, n + 1, dtype=v.dtype)
  rho = jnp.max(jnp.where(u - css / ks > 0, ks, 0.0))
  theta = jnp.take(css, rho.astype(jnp.int32) - 1) / rho
  return jnp.maximum(v - theta, 0.0)


def averaging_server() -> optax.GradientTransformation:
  r"""Plain model averaging: ``server = server - 1.0 * (server - mean_k client)``.

  ``optax.sgd(1.0)`` on the pseudo-gradient :math:`\bar x - \sum_k w_k x_k`, so the new
  server value is the clients' weighted mean :math:`\sum_k w_k x_k`; the server of FedAvg
  and most built-in algorithms. Server SGD with another rate is DS-FedDRO's.

  Returns:
    an optax ``GradientTransformation`` (stateless).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import algorithms
    >>> tx = algorithms.averaging_server()
    >>> server, mean = jnp.zeros(2), jnp.array([1.0, 3.0])
    >>> updates, _ = tx.update(server - mean, tx.init(server))
    >>> [round(float(v), 4) for v in optax.apply_updates(server, updates)]
    [1.0, 3.0]
  """
  return optax.sgd(1.0)
