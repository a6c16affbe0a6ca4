r"""DP-FTRL's server: follow-the-regularized-leader on tree-aggregated noisy prefix sums.

Kairouz, McMahan, Song, Thakkar, Thakurta and Xu (2021), "Practical and Private (Deep)
Learning without Sampling or Shuffling", in its federated form (DP-FTRLM: the server
optimizer TensorFlow Federated's and Google's production DP-FTRL use). Each round ``t`` of
a tree, the server takes the round's pseudo-gradient
:math:`g_t = -\frac1m \sum_{k} \operatorname{clip}(\Delta_k, C)` (the clients' clipped model
changes, summed over the survivors and divided by the cohort size ``m``, never by the
survivors: one client moves it by at most :math:`C / m`), and

.. math::

  S_t = \sum_{s \le t} g_s + \sum_{(l, j) \in \mathcal D(t)} \nu_{l, j},
  \qquad b_t = \mu\, b_{t-1} + S_t,
  \qquad x_t = x_0 - \eta\, (\mu\, b_t + S_t \text{ (Nesterov) or } b_t),

where :math:`\mathcal D(t)` are the nodes of the binary tree whose ranges tile ``[1, t]``
(one per set bit ``l`` of ``t``: node ``(l, t >> l)`` covers steps
``((t >> l) - 1) 2^l + 1 .. (t >> l) 2^l``) and each node's noise
:math:`\nu_{l, j} \sim \mathcal N(0, \sigma^2 I)` is drawn once, from the tree's key folded
with ``l`` and ``j``: every prefix sum that uses a node sees the same draw, and nothing but
the key and the step is stored (no buffer of node values). A client in one round of a tree
is in at most ``ceil(log2(T + 1))`` nodes of a ``T``-round tree: the accounting of
:func:`fedco.privacy.tree_epsilon_spent`.

The tree restarts every ``rounds_per_tree`` rounds (an epoch of the run's ``"epochs"``
client schedule: every client in at most one round of each tree): :math:`x_0` becomes the
current model, the sum and the momentum buffer zero, and the key the round's fresh one.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedco.algorithms.core.servers import ServerAggregator, weighted_client_mean
from fedco.algorithms.core.types import PyTree


class FTRLState(NamedTuple):
  """The DP-FTRL server's state (a pytree).

  Attributes:
    step: rounds done in the current tree (``int32``); ``rounds_per_tree`` at the start, so
      the first round starts a tree.
    key: the current tree's PRNG key (its nodes' noise).
    start: the server values when the tree started (:math:`x_0`).
    total: the sum of the tree's pseudo-gradients, without noise.
    momentum: the momentum buffer :math:`b_t`.
  """

  step: jax.Array
  key: jax.Array
  start: PyTree
  total: PyTree
  momentum: PyTree


def tree_depth(steps: int) -> int:
  """``ceil(log2(steps + 1))``: the nodes of a ``steps``-round tree that hold one round."""
  return math.ceil(math.log2(steps + 1)) if steps > 0 else 0


def node_noise(key, level, index, like: PyTree, std) -> PyTree:
  """The noise of tree node ``(level, index)``: ``N(0, std^2)`` per coordinate, shaped and
  typed like ``like``, from ``key`` folded with ``level``, ``index`` and the leaf number."""
  node = jax.random.fold_in(jax.random.fold_in(key, level), index)
  leaves, treedef = jax.tree.flatten(like)
  noise = [
    (std * jax.random.normal(jax.random.fold_in(node, i), jnp.shape(a))).astype(jnp.result_type(a))
    for i, a in enumerate(leaves)
  ]
  return jax.tree.unflatten(treedef, noise)


def prefix_noise(key, step, like: PyTree, std, levels: int) -> PyTree:
  """The noise on the prefix sum of steps ``1..step`` (``step`` in ``[0, 2^levels)``): the
  sum of :func:`node_noise` over the nodes ``(l, step >> l)`` of its set bits ``l``."""
  total = jax.tree.map(jnp.zeros_like, like)
  step = jnp.asarray(step, jnp.int32)
  for level in range(levels):
    on = ((step >> level) & 1).astype(bool)
    noise = node_noise(key, level, step >> level, like, std)
    total = jax.tree.map(lambda t, n, on=on: t + jnp.where(on, n, jnp.zeros_like(n)), total, noise)
  return total


def ftrl_aggregator(
  learning_rate: float,
  *,
  noise_std: float,
  rounds_per_tree: int,
  clients_per_round: int,
  momentum: float = 0.0,
  nesterov: bool = False,
) -> ServerAggregator:
  r"""DP-FTRL's server as a :class:`~fedco.extend.ServerAggregator` (see the module).

  The clients' values must already be clipped (the run's uplink clips each client's model
  change to the bound :math:`C` whose ``noise_std`` is :math:`z C / m`).

  Args:
    learning_rate: :math:`\eta > 0`.
    noise_std: :math:`\sigma \ge 0`, each tree node's noise per coordinate, on the
      pseudo-gradient's scale (the mean's: ``z * C / clients_per_round``).
    rounds_per_tree: rounds between restarts (an int ``>= 1``).
    clients_per_round: ``m``, the divisor of the round's sum.
    momentum: :math:`\mu \in [0, 1)`.
    nesterov: the Nesterov form of the momentum.

  Returns:
    a :class:`~fedco.extend.ServerAggregator` (``reads_each=False``).
  """
  levels = tree_depth(rounds_per_tree)

  def init(server, counts):
    del counts
    zeros = jax.tree.map(jnp.zeros_like, server)
    return FTRLState(
      jnp.asarray(rounds_per_tree, jnp.int32), jax.random.PRNGKey(0), server, zeros, zeros
    )

  def update(server, state, client_values, info):
    restart = state.step >= rounds_per_tree
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(restart, a, b), new, old)
    zeros = jax.tree.map(jnp.zeros_like, server)
    start, total = keep(server, state.start), keep(zeros, state.total)
    buffer = keep(zeros, state.momentum)
    key = keep(_raw(info.key), state.key)
    step = jnp.where(restart, 0, state.step) + 1
    weights = jnp.where(info.alive_mask, 1.0 / clients_per_round, 0.0)
    changes = {
      k: jax.tree.map(lambda c, s: c - s[None], client_values[k], server[k]) for k in server
    }
    gradient = jax.tree.map(jnp.negative, weighted_client_mean(changes, weights))
    total = jax.tree.map(jnp.add, total, gradient)
    noisy = jax.tree.map(jnp.add, total, prefix_noise(key, step, total, noise_std, levels))
    buffer = jax.tree.map(lambda b, s: momentum * b + s, buffer, noisy)
    direction = jax.tree.map(lambda b, s: momentum * b + s, buffer, noisy) if nesterov else buffer
    new = jax.tree.map(lambda x0, d: (x0 - learning_rate * d).astype(x0.dtype), start, direction)
    return new, FTRLState(step, key, start, total, buffer)

  return ServerAggregator(init, update, reads_each=False)


def _raw(key) -> Any:
  """A raw ``uint32`` key (a typed key's data), as :class:`FTRLState` stores it."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


__all__ = ["FTRLState", "ftrl_aggregator", "node_noise", "prefix_noise", "tree_depth"]
