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
with ``l`` and ``j``: every prefix sum that uses a node sees the same draw, and the plain
tree stores nothing but the key and the step (no buffer of node values; Honaker's efficient
estimator, ``efficient=True``, keeps each level's latest node estimate). A client in one round of a tree
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
    nodes: under ``efficient=True``, the efficient noise of the latest completed node of
      each level (leaves with a leading ``[levels]`` axis); ``()`` otherwise.
  """

  step: jax.Array
  key: jax.Array
  start: PyTree
  total: PyTree
  momentum: PyTree
  nodes: Any = ()


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
  step = jnp.asarray(step, jnp.int32)
  nodes = [node_noise(key, level, step >> level, like, std) for level in range(levels)]
  return _set_bits_sum(step, nodes, like)


def _set_bits_sum(step, per_level, like: PyTree) -> PyTree:
  """The sum of ``per_level[l]`` over the set bits ``l`` of ``step`` (the prefix ``1..step``
  tiled by one node a set bit)."""
  total = jax.tree.map(jnp.zeros_like, like)
  for level, value in enumerate(per_level):
    on = ((step >> level) & 1).astype(bool)
    total = jax.tree.map(lambda t, v, on=on: t + jnp.where(on, v, jnp.zeros_like(v)), total, value)
  return total


def efficient_weight(level: int) -> float:
  """Honaker's weight of a level-``level`` node's own noise in its efficient estimate,
  ``2^l / (2^(l+1) - 1)`` (the rest goes to its children's estimates: inverse-variance)."""
  return 2.0**level / (2.0 ** (level + 1) - 1)


def efficient_prefix_noise(key, step, latest: PyTree, std, levels: int):
  r"""``(noise, latest)``: the efficient estimator's noise on the prefix sum of steps
  ``1..step`` and the updated ``latest`` (each level's latest completed node).

  Honaker (2015)'s bottom-up estimate of each node's sum: a leaf's own noisy value; a node
  of level :math:`l`, :math:`w_l` times its own plus :math:`1 - w_l` times the sum of its
  children's estimates (:func:`efficient_weight`), variance
  :math:`2^l \sigma^2 / (2^{l+1} - 1)` instead of the plain node's :math:`\sigma^2`. The
  node noises are :func:`node_noise`'s, so the privacy is the plain tree's (this is
  post-processing). A level-``l`` node completes at the steps that are multiples of
  ``2^l``; its left child is the level below's previous latest node, its right child the one
  completing at the same step.
  """
  step = jnp.asarray(step, jnp.int32)
  like = jax.tree.map(lambda a: a[0], latest)
  level_values: list = []
  for level in range(levels):
    own = node_noise(key, level, step >> level, like, std)
    if level == 0:
      value = own
    else:
      w = efficient_weight(level)
      left = jax.tree.map(lambda a, i=level: a[i - 1], latest)
      right = level_values[level - 1]
      value = jax.tree.map(lambda o, a, b, w=w: w * o + (1 - w) * (a + b), own, left, right)
    done = (step % (1 << level)) == 0
    previous = jax.tree.map(lambda a, i=level: a[i], latest)
    level_values.append(
      jax.tree.map(lambda v, p, done=done: jnp.where(done, v, p), value, previous)
    )
  updated = jax.tree.map(lambda *vs: jnp.stack(vs), *level_values)
  return _set_bits_sum(step, level_values, like), updated


def ftrl_aggregator(
  learning_rate: float,
  *,
  noise_std: float,
  rounds_per_tree: int,
  clients_per_round: int,
  momentum: float = 0.0,
  nesterov: bool = False,
  efficient: bool = False,
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
    efficient: Honaker's estimator of each node (:func:`efficient_prefix_noise`: the same
      privacy, less noise on the prefix sums, one model-sized buffer per tree level in the
      state) instead of each node's own noisy value.

  Returns:
    a :class:`~fedco.extend.ServerAggregator` (``reads_each=False``).
  """
  levels = tree_depth(rounds_per_tree)

  def init(server, counts):
    del counts
    zeros = jax.tree.map(jnp.zeros_like, server)
    return FTRLState(
      jnp.asarray(rounds_per_tree, jnp.int32),
      jax.random.PRNGKey(0),
      server,
      zeros,
      zeros,
      _level_buffer(zeros, levels) if efficient else (),
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
    if efficient:
      nodes = keep(_level_buffer(zeros, levels), state.nodes)
      noise, nodes = efficient_prefix_noise(key, step, nodes, noise_std, levels)
    else:
      noise, nodes = prefix_noise(key, step, total, noise_std, levels), ()
    noisy = jax.tree.map(jnp.add, total, noise)
    buffer = jax.tree.map(lambda b, s: momentum * b + s, buffer, noisy)
    direction = jax.tree.map(lambda b, s: momentum * b + s, buffer, noisy) if nesterov else buffer
    new = jax.tree.map(lambda x0, d: (x0 - learning_rate * d).astype(x0.dtype), start, direction)
    return new, FTRLState(step, key, start, total, buffer, nodes)

  return ServerAggregator(init, update, reads_each=False)


def _level_buffer(zeros: PyTree, levels: int) -> PyTree:
  """Zeros with a leading ``[levels]`` axis: the efficient estimator's latest node per level."""
  return jax.tree.map(lambda a: jnp.zeros((levels,) + a.shape, a.dtype), zeros)


def _raw(key) -> Any:
  """A raw ``uint32`` key (a typed key's data), as :class:`FTRLState` stores it."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    return jax.random.key_data(key)
  return key


__all__ = [
  "FTRLState",
  "efficient_prefix_noise",
  "efficient_weight",
  "ftrl_aggregator",
  "node_noise",
  "prefix_noise",
  "tree_depth",
]
