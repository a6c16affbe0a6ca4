"""Client faults: dropout (a client misses the round) and stragglers (fewer local steps)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def draw_faults(cfg, key, ids, mask):
  """Which slots survive the round, and how many local steps each does.

  Draws are folded from the client *id*, so a client's fate does not depend on the layout.
  A straggler does a uniform number of steps in ``{1, ..., I - 1}``.
  """
  local_steps = cfg.plan.local_steps
  steps_all = jnp.full(ids.shape, local_steps, jnp.int32)
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
  return mask & survives, steps.astype(jnp.int32)
