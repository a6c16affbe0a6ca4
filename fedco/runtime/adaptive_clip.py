"""Adaptive clipping in the round (Andrew, Thakkar, McMahan and Ramaswamy 2021).

Under ``privacy=fedco.privacy.gaussian(..., adaptive=fedco.privacy.adaptive_clipping())``
the clip bound of each field sent once at a round's end (the model, ``every_round`` and
``report`` fields) follows a target quantile :math:`\\gamma` of the clients' upload norms.
Each round, besides its clipped upload, every client reports one bit, whether its upload's
norm was within the bound; the server adds Gaussian noise :math:`\\sigma_b` to the bits'
sum and moves the bound geometrically,

.. math:: C \\leftarrow C \\exp\\big(-\\eta_C\\, (\\tilde b - \\gamma)\\big), \\qquad
   \\tilde b = \\frac{1}{n}\\Big(\\sum_{k} b_k + \\mathcal N(0, \\sigma_b^2)\\Big),

with :math:`n` the clients that sent. The upload's own noise multiplier becomes
:math:`z_\\Delta = (z^{-2} - (2\\sigma_b)^{-2})^{-1/2}`, so the bits and the upload together
cost what one Gaussian mechanism of multiplier :math:`z` does (the paper's Theorem 1): the
accountant is unchanged. The bounds live in the server's state (:class:`ClipState`, beside
the algorithm's own), so a checkpoint keeps them.
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco.algorithms.base import ServerAggregator


class ClipState(NamedTuple):
  """The server's state under adaptive clipping.

  Attributes:
    inner: the algorithm's own server state.
    bounds: ``{field: float32 scalar}``, each adapted field's current clip bound.
  """

  inner: Any
  bounds: Dict[str, jax.Array]


def wrap(aggregator: ServerAggregator, uplink) -> ServerAggregator:
  """``aggregator`` whose state also holds the adapted fields' bounds (starting at the
  privacy's ``clip``); its update leaves them to :func:`advance`."""

  def init(server, counts):
    start = {f: jnp.asarray(uplink.clip[f], jnp.float32) for f in uplink.adapted}
    return ClipState(aggregator.init(server, counts), start)

  def update(server, state, client_values, info):
    server, inner = aggregator.update(server, state.inner, client_values, info)
    return server, ClipState(inner, state.bounds)

  return aggregator._replace(init=init, update=update)


def bounds_of(cfg, state) -> Optional[Dict[str, jax.Array]]:
  """The adapted fields' bounds for this round, ``None`` without adaptive clipping."""
  up = cfg.uplink
  if up is None or not up.adapted:
    return None
  return state.server_opt_state.bounds


def within(values, reference, bound) -> jax.Array:
  """``bool [m]``: whether each client's upload (its change from ``reference``, or the value
  itself) has global L2 norm at most ``bound``: the bit it reports."""
  deltas = values if reference is None else jax.tree.map(lambda v, r: v - r, values, reference)
  return jax.vmap(optax.global_norm)(deltas) <= bound


def advance(up, state: ClipState, bits: Dict[str, jax.Array], alive, key) -> ClipState:
  """The bounds after a round: each moved by its noised fraction of clients within it."""
  spec = up.privacy.adaptive
  sent = jnp.sum(alive)
  new = {}
  for i, field in enumerate(sorted(state.bounds)):
    count = jnp.sum(bits[field] & alive).astype(jnp.float32)
    if up.count_noise:
      count = count + up.count_noise * jax.random.normal(jax.random.fold_in(key, i))
    fraction = count / jnp.maximum(sent, 1).astype(jnp.float32)
    step = jnp.exp(-spec.learning_rate * (fraction - spec.target_quantile))
    new[field] = jnp.where(sent > 0, state.bounds[field] * step, state.bounds[field])
  return ClipState(state.inner, new)
