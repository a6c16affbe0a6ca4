"""A round's local training: each sampled client's steps from the round's broadcast state.

Two ways, chosen by ``RunConfig.client_chunk`` (decision 101):

* :func:`vmapped_steps` (``client_chunk=None``, the default): one ``lax.scan`` over the
  plan's ``local_steps`` with every slot ``vmap``-ed (laid along the mesh), averaging the
  plan's ``every_step`` fields after each step. Clients with fewer steps (stragglers,
  ``local_epochs``) are masked: they run the loop's length and keep what they had.
* :func:`chunked_steps` (an int ``c``): the round's clients sorted by their step counts and
  run ``c`` at a time (``lax.map`` with ``batch_size=c``), each a ``lax.while_loop`` over its
  own steps (under ``vmap`` a chunk runs to its longest client, masked), then put back in
  slot order. Only for plans without ``every_step`` fields (clients independent within a
  round), on one device.

A client's step is :func:`client_step` either way, fed the same keys, so both give the same
results up to float round-off.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from fedco.algorithms.base import get_field, set_fields
from fedco.runtime.batching import draw, epoch_draw, oracle_args
from fedco.runtime.mesh import place

# Folded into a client's step key (``fold_in(fold_in(k_round, client id), local step)``) for
# ``update``'s ``client_key``: apart from the split that draws the step's batches.
CLIENT_STREAM = 0x636C6E74
# Folded into a client's round key (``fold_in(k_round, client id)``) for its epochs'
# shuffles under ``local_epochs``: beyond any local step index.
EPOCH_STREAM = 0x65706F63


def mean(tree, w):
  return jax.tree.map(lambda a: jnp.tensordot(w.astype(a.dtype), a, axes=1), tree)


def broadcast(tree, m):
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (m,) + jnp.shape(a)), tree)


def client_step(cfg, round_key, local_step, params, cstate, ckey, view):
  """One client's local step: draw its batches and call the algorithm's ``update``.

  ``ckey`` is the client's round key; the step's key is ``fold_in(ckey, local_step)``.
  Under ``local_epochs`` the inner and outer batch are the step's slice of the client's
  epochs (:func:`~fedco.runtime.batching.epoch_draw`); the next-inner batch is drawn with
  replacement as always."""
  key = jax.random.fold_in(ckey, local_step)
  kg, kf, kn = jax.random.split(key, 3)
  if cfg.paired_batches:  # same key and size: the outer batch is the inner batch's rows
    kf = kg
  max_count = cfg.layout.max_count
  if cfg.local_epochs is None:
    bg, wg = draw(kg, view, cfg.batch_size, max_count)
    bf, wf, rows = draw(kf, view, cfg.outer_batch_size, max_count, return_rows=True)
  else:
    epoch_key = jax.random.fold_in(ckey, EPOCH_STREAM)
    bf, wf, rows = epoch_draw(
      epoch_key, view, cfg.batch_size, max_count, local_step, return_rows=True
    )
    bg, wg = bf, wf
  bn, wn = draw(kn, view, cfg.batch_size, max_count)
  grad_h_fn, kwargs = oracle_args(cfg.problem, bg, bf, bn, (wg, wf, wn))
  grad_h = None if grad_h_fn is None else grad_h_fn(params)
  kwargs.update(round_key=round_key, client_key=jax.random.fold_in(key, CLIENT_STREAM))
  return cfg.algorithm.update(
    grad_h, cstate, params, local_step=local_step, example_rows=rows, **kwargs
  )


def vmapped_steps(cfg, k_round, k_up, params, cst, ust, ckeys, views, alive, steps, w, ids):
  """The plan's ``local_steps`` as one ``lax.scan`` of every slot's step (``vmap``):
  ``(params, cst, ust)``. A slot takes step ``t`` when it is ``alive`` and ``t < steps``
  (else it keeps what it had); ``every_step`` fields are averaged (weights ``w``, through
  the uplink when it handles them) after each step."""
  plan, slots, mesh, up = cfg.plan, cfg.layout.slots, cfg.mesh, cfg.uplink
  step_fn = cfg.layout.step_map(functools.partial(client_step, cfg), 3)
  step_channel = () if up is None else up.fields(plan.every_step)

  def local_step(carry, t):
    params, cst, ust = carry
    before = cst
    sending = alive & (t < steps) if cfg.varied_steps else alive  # who sends this step's
    updates, new_cst = step_fn(k_round, t, params, cst, ckeys, views)
    new_params = optax.apply_updates(params, updates)
    if cfg.varied_steps:  # dropped clients and finished ones keep what they had
      keep = lambda new, old: jnp.where(
        sending.reshape(sending.shape + (1,) * (new.ndim - 1)), new, old
      )
      new_params = jax.tree.map(keep, new_params, params)
      new_cst = jax.tree.map(keep, new_cst, cst)
    params, cst = new_params, new_cst
    if plan.every_step:
      means = {}
      for i, f in enumerate(plan.every_step):
        if f in step_channel:  # the delta from the y_bar the step started from
          reference = jax.tree.map(lambda a: a[0], get_field(before, f))
          k = jax.random.fold_in(jax.random.fold_in(k_up, 1 + i), t)
          means[f], ust = up.send_mean(f, get_field(cst, f), reference, w, ust, k, ids, sending)
        else:
          means[f] = mean(get_field(cst, f), w)
      cst = set_fields(cst, **{f: broadcast(v, slots) for f, v in means.items()})
    return place((params, cst), mesh) + (ust,), None

  carry, _ = jax.lax.scan(local_step, (params, cst, ust), jnp.arange(plan.local_steps))
  return carry


def chunked_steps(cfg, k_round, params, cst, ckeys, views, steps):
  """Each slot's ``steps`` (``0`` for a dropped client) of :func:`client_step`, the slots
  sorted by ``steps`` and run ``cfg.client_chunk`` at a time, each client a
  ``lax.while_loop`` over its own steps: ``(params, cst)`` in slot order. Needs a plan
  without ``every_step`` fields (clients independent within the round)."""
  order = jnp.argsort(steps, stable=True)  # chunks of clients of similar length
  sort = lambda tree: jax.tree.map(lambda a: a[order], tree)

  def one(client):
    params, cst, ckey, start, count, n = client
    view = views._replace(start=start, count=count)

    def body(carry):
      t, params, cst = carry
      updates, cst = client_step(cfg, k_round, t, params, cst, ckey, view)
      return t + 1, optax.apply_updates(params, updates), cst

    _, params, cst = jax.lax.while_loop(
      lambda carry: carry[0] < n, body, (jnp.zeros([], jnp.int32), params, cst)
    )
    return params, cst

  clients = sort((params, cst, ckeys, views.start, views.count, steps))
  out = jax.lax.map(one, clients, batch_size=cfg.client_chunk)
  inverse = jnp.argsort(order)
  return jax.tree.map(lambda a: a[inverse], out)
