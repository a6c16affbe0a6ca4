"""Which clients a round takes: uniformly without replacement each round (``sampling=
"uniform"``), or in epochs of ``K // m`` rounds that cut one permutation of the clients into
cohorts (``"epochs"``: every client at most once an epoch, as DP-FTRL's accounting needs);
and the same draws replayed on the host from a run's first key (:func:`schedule`: what a
streamed run reads ahead).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def sample(cfg, key, state):
  """``(clients, schedule)``: the round's sorted clients and the state's next ``schedule``."""
  if cfg.sampling == "epochs":
    return epoch_clients(key, state.schedule, state.round, cfg.num_clients, cfg.clients_per_round)
  return sample_clients(key, cfg.num_clients, cfg.clients_per_round), state.schedule


def epoch_clients(key, epoch_key, round_, n: int, m: int):
  """``(clients, epoch_key)`` of round ``round_`` (0-based) under ``sampling="epochs"``:
  cohort ``round_ mod (n // m)`` of the epoch's permutation of the ``n`` clients, sorted. A
  round that starts an epoch takes ``key`` (the round's sampling key) as the epoch's key;
  the others keep ``epoch_key``."""
  per_epoch = n // m
  position = jnp.asarray(round_, jnp.int32) % per_epoch
  epoch_key = jnp.where(position == 0, key, epoch_key)
  order = jax.random.permutation(epoch_key, n)
  return jnp.sort(jax.lax.dynamic_slice(order, (position * m,), (m,))), epoch_key


# From this many clients on, a round of few clients is drawn by Floyd's algorithm (O(m^2))
# instead of a permutation of all of them (O(K log K): about 1 s at a million clients).
FLOYD_MIN_CLIENTS = 65_536


def sample_clients(key, n: int, m: int) -> jax.Array:
  """``m`` of ``n`` clients uniformly without replacement, sorted (a round's sample).

  All ``n`` when ``m == n``; the first ``m`` of a random permutation for fewer than
  :data:`FLOYD_MIN_CLIENTS` clients or ``m^2 > n``; otherwise Floyd's algorithm: for
  ``j = n - m, ..., n - 1`` draw ``t`` uniform in ``[0, j]`` and take ``t``, or ``j`` if
  ``t`` was taken (``m`` draws, no ``O(n)`` work). Both are uniform over the ``m``-subsets;
  the choice depends only on ``(n, m)``.
  """
  if m == n:
    return jnp.arange(n)
  if n < FLOYD_MIN_CLIENTS or m * m > n:
    return jnp.sort(jax.random.permutation(key, n)[:m])

  def draw(i, taken):
    j = n - m + i
    t = jax.random.randint(jax.random.fold_in(key, i), (), 0, j + 1)
    seen = jnp.any((taken == t) & (jnp.arange(m) < i))
    return taken.at[i].set(jnp.where(seen, j, t))

  return jnp.sort(jax.lax.fori_loop(0, m, draw, jnp.zeros((m,), jnp.int32)))


@functools.partial(
  jax.jit, static_argnames=("num_clients", "clients_per_round", "rounds", "sampling")
)
def _schedule(key, *, num_clients, clients_per_round, rounds, sampling):
  def one(carry, round_):
    key, epoch_key = carry
    key, k_sample, *_ = jax.random.split(key, 5)  # as round_step splits it
    if sampling == "epochs":
      ids, epoch_key = epoch_clients(k_sample, epoch_key, round_, num_clients, clients_per_round)
    else:
      ids = sample_clients(k_sample, num_clients, clients_per_round)
    return (key, epoch_key), ids

  return jax.lax.scan(one, (key, jnp.zeros_like(key)), jnp.arange(rounds))[1]


def schedule(
  key, num_clients: int, clients_per_round: int, rounds: int, sampling: str = "uniform"
) -> np.ndarray:
  """``int [rounds, m]``: the clients each of ``rounds`` rounds from state key ``key``
  samples (``round_step``'s draw under ``sampling``, replayed)."""
  return np.asarray(
    _schedule(
      key,
      num_clients=num_clients,
      clients_per_round=clients_per_round,
      rounds=rounds,
      sampling=sampling,
    )
  )


__all__ = ["FLOYD_MIN_CLIENTS", "epoch_clients", "sample", "sample_clients", "schedule"]
