"""Client faults: dropout (a client misses the round) and stragglers (fewer local steps);
and each client's step count under ``local_epochs`` (its epochs' batches, capped)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def planned_steps(cfg, counts) -> jax.Array:
  """Each client's local steps without faults (``counts``: their rows): ``local_steps``,
  or under ``local_epochs`` its epochs' batches, at most ``local_steps``."""
  steps = jnp.full(jnp.shape(counts), cfg.plan.local_steps, jnp.int32)
  if cfg.local_epochs is None:
    return steps
  epochs = cfg.local_epochs * ((counts + cfg.batch_size - 1) // cfg.batch_size)
  return jnp.minimum(steps, epochs.astype(jnp.int32))


def draw_faults(cfg, key, ids, mask, counts=None):
  """Which slots survive the round, and how many local steps each does.

  Draws are folded from the client *id*, so a client's fate does not depend on the layout.
  A straggler does a uniform number of steps in ``{1, ..., I - 1}``. Under
  ``cfg.local_epochs`` a client of ``counts`` rows does at most ``E ceil(n_k / B)`` steps
  (its epochs; the smaller of that and a straggler's draw).
  """
  local_steps = cfg.plan.local_steps
  steps_all = planned_steps(cfg, ids if counts is None else counts)
  if not cfg.faults:
    return mask, steps_all

  def draw(k):
    k_drop, k_strag, k_steps = jax.random.split(k, 3)
    survives = jax.random.bernoulli(k_drop, cfg.participation)
    straggles = jax.random.bernoulli(k_strag, cfg.straggler_prob)
    few = jax.random.randint(k_steps, (), 1, max(local_steps, 2))
    return survives, jnp.where(straggles & (local_steps > 1), few, local_steps)

  per_client = jax.vmap(jax.random.fold_in, (None, 0))
  survives, steps = jax.vmap(draw)(per_client(jax.random.fold_in(key, 1), ids))
  return mask & survives, jnp.minimum(steps.astype(jnp.int32), steps_all)
