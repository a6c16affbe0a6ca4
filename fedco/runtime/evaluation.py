"""Evaluation inside the compiled round: the exact objective over every client's data, the
per-client losses, optional exact gradient norm and the user's ``metrics_fn``, on the rounds
``eval_every`` selects, round 1 and the run's last round (other rounds hold NaN placeholders
and skip the work)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def flat_examples(cfg, data):
  """The examples of the flat ``(row, owner)`` list that evaluation reads. Client-block
  data's flat list is every row in order: no gather (it would move rows)."""
  if cfg.layout.resident:
    return data.examples
  return jax.tree.map(lambda a: a[data.flat_rows], data.examples)


def client_objectives(cfg, params, data, flat):
  """``(objective, per-client losses)`` of ``params`` over every client's whole data."""
  return cfg.problem.evaluate(params, flat, data.flat_owner, data.flat_weights(), cfg.num_clients)


def maybe_metrics(
  cfg, completed, params, data, flat, final_round, metrics_data=None, due_round=None
):
  """Metrics after round ``completed``, or NaN placeholders on rounds that skip them.

  Due after round 1, every ``eval_every``-th round and ``final_round`` (the run's last, a
  traced integer, so runs of any length share one compiled chunk). ``due_round``: the round to
  decide by instead of ``completed``, one unbatched value for a sweep's runs, so the
  ``lax.cond`` stays a branch under their ``vmap`` (decision 116)."""
  completed = completed if due_round is None else due_round
  compute = lambda p: metrics(cfg, p, data, flat, metrics_data)
  if cfg.eval_every == 1:
    out = compute(params)
    return {**out, "evaluated": jnp.ones([], bool)} if out else {}
  shapes = jax.eval_shape(compute, params)
  if not shapes:
    return {}
  skip = lambda p: jax.tree.map(
    lambda s: (
      jnp.full(s.shape, jnp.nan, s.dtype)
      if jnp.issubdtype(s.dtype, jnp.inexact)
      else jnp.zeros(s.shape, s.dtype)
    ),
    shapes,
  )
  due = (completed == 1) | (completed % cfg.eval_every == 0) | (completed == final_round)
  out = jax.lax.cond(due, compute, skip, params)
  return {**out, "evaluated": due}


def metrics(cfg, params, data, flat, metrics_data=None):
  """The evaluated metrics of ``params`` (``metrics_fn(params, metrics_data)`` when the run
  has ``metrics_data``)."""
  out = {}
  if cfg.evaluate:
    objective = lambda p: client_objectives(cfg, p, data, flat)
    if cfg.exact_grad_norm:
      (obj, losses), grad = jax.value_and_grad(objective, has_aux=True)(params)
      out["grad_norm"] = optax.global_norm(grad)
    else:
      obj, losses = objective(params)
    out["objective"], out["client_losses"] = obj, losses
  if cfg.metrics_fn is not None:
    out.update(
      cfg.metrics_fn(params) if metrics_data is None else cfg.metrics_fn(params, metrics_data)
    )
  return out
