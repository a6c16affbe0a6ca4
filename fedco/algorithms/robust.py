"""Robust federated baselines (SPEC 3): q-FedAvg (q-FFL), DRFA / DRFL and AFL.

All three train a plain (non-compositional) client loss ``h_k`` with local SGD; they differ in
how the server weighs clients.

q-FedAvg (Li et al. 2020), per sampled client, with ``F_k`` the loss of the round's model on
the client's whole training set and ``x_k`` its model after local SGD with rate ``lr``::

    dW_k = (x - x_k) / lr                    (Lipschitz constant L = 1/lr)
    Delta_k = F_k^q dW_k
    h_k = q F_k^(q-1) ||dW_k||^2 + F_k^q / lr
    x = x - sum_k Delta_k / sum_k h_k

``q = 0`` is FedAvg with uniform weights.

DRFA / DRFL (Deng et al. 2020): mixture weights ``lambda`` on the simplex, initialised to the
clients' sample fractions. A round: ``m`` clients sampled uniformly run ``tau`` local SGD steps;
each also keeps its model after a random step ``k'`` in ``{1 .. tau-1}`` (one ``k'`` per
round); the server steps ``x = x - sum_{i in S} (N/m) lambda_i (x - x_i)``, forms the snapshot
``x' = mean_i`` of the step-``k'`` models, asks a fresh uniform set of ``m`` clients for one
mini-batch loss of ``x'``, sets ``v_i = (N/m) loss_i`` for them (0 for the others) and
``lambda = Proj_simplex(lambda + gamma_lambda tau v)``.

AFL (Mohri et al. 2019): ``lambda`` on the simplex (uniform at first); every round each
client reports its loss ``F_k`` at the round's model and takes one gradient step; the server
steps on the ``lambda``-weighted loss, ``x = x - sum_k (N/m) lambda_k (x - x_k)``, then
``lambda = Proj_simplex(lambda + eta_lambda F)`` (``F_k = 0`` for clients not sampled).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate
from fedco.algorithms import base


class LossState(NamedTuple):
  """Local SGD plus the client's loss ``F_k`` at the round's model."""

  count: jnp.ndarray
  loss: jnp.ndarray
  opt_state: optax.OptState


class SnapshotState(NamedTuple):
  """Local SGD plus the model after the round's random step ``k'`` (DRFA)."""

  count: jnp.ndarray
  snapshot: Any
  opt_state: optax.OptState


class WeightsState(NamedTuple):
  """The server's mixture weights ``lambda`` over all clients."""

  weights: jnp.ndarray


def _lambda_step(server, lam, client_values, info):
  """``x - sum_{i in S} (N/m) lambda_i (x - x_i)`` over the round's surviving clients."""
  coef = (info.num_clients / info.ids.shape[0]) * lam[info.ids] * info.alive_mask
  return jax.tree.map(
    lambda a, b: a - jnp.tensordot(coef.astype(a.dtype), a[None] - b, axes=1),
    server["params"],
    client_values["params"],
  )


def _local_sgd_with_loss(opt, name):
  def init(params, *, inner_value=None):
    del inner_value
    return LossState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32), opt.init(params))

  def update(updates, state, params=None, **unused):
    del unused
    base.require("updates (the gradient of the client loss)", updates, name)
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, LossState(state.count + 1, state.loss, opt_state)

  return init, update


@base.register(settings={"qfedavg": dict(learning_rate=0.1, q=0.2)})
@base.factory(static=("local_steps", "optimizer"))
def qfedavg(
  learning_rate: Optional[float] = None,
  local_steps: int = 5,
  *,
  q: float = 0.2,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """q-FedAvg (q-FFL).

  Args:
    learning_rate: local SGD rate ``lr > 0``; ``None``: 0.01. The server's Lipschitz
      estimate is ``L = 1 / lr`` whatever the local step, so ``learning_rate`` may be
      given beside an ``optimizer`` transform.
    local_steps: local steps per round.
    q: fairness exponent ``q >= 0`` (0 is uniform FedAvg).
    optimizer: the local parameter step: ``None`` (``optax.sgd(lr)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate.
  """
  lr = _validate.positive("learning_rate", 0.01 if learning_rate is None else learning_rate)
  _validate.positive("q", q, allow_zero=True)
  opt = base.param_optimizer(lr, optimizer, default=0.01, shared_rate=True)
  init, update = _local_sgd_with_loss(opt, "qfedavg")
  plan = base.make_plan(local_steps, round_start_loss=("loss",), report=("loss",))

  def server_init(server, counts):
    del server, counts
    return optax.EmptyState()

  def server_update(server, state, client_values, info):
    alive = info.alive_mask.astype(jnp.float32)
    x = server["params"]
    losses = jnp.maximum(client_values["loss"], 1e-10)  # F^(q-1) needs F > 0
    dw = jax.tree.map(lambda a, b: (a[None] - b) / lr, x, client_values["params"])
    sq_norm = sum(jnp.sum(l.reshape(l.shape[0], -1) ** 2, axis=1) for l in jax.tree.leaves(dw))
    fq = alive * losses**q
    delta = jax.tree.map(lambda d: jnp.tensordot(fq.astype(d.dtype), d, axes=1), dw)
    h = jnp.sum(alive * (q * losses ** (q - 1.0) * sq_norm) + fq / lr)
    h = jnp.where(h > 0, h, 1.0)  # nobody survived: delta is 0 and x stays
    return {**server, "params": jax.tree.map(lambda a, d: a - d / h, x, delta)}, state

  return base.Algorithm(
    init, update, plan, base.ServerAggregator(server_init, server_update), "qfedavg", "plain"
  )


@base.register(settings={"drfa": dict(learning_rate=0.1, weights_lr=0.08)})
@base.factory(static=("local_steps", "optimizer"))
def drfa(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  weights_lr: float = 0.08,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """DRFA / DRFL (Deng et al. 2020; paper 001 uses ``weights_lr = gamma_lambda = 0.08``).

  Args:
    learning_rate: local SGD rate ``> 0`` or a schedule; ``None``: 0.01.
    local_steps: ``tau >= 2`` (the snapshot step ``k'`` is drawn from ``{1 .. tau-1}``).
    weights_lr: ``gamma_lambda > 0``.
    optimizer: the local parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  tau = _validate.positive_int("local_steps", local_steps, minimum=2)
  gamma = _validate.positive("weights_lr", weights_lr)
  plan = base.make_plan(tau, report=("snapshot",))

  def init(params, *, inner_value=None):
    del inner_value
    params = base.strong(params)
    return SnapshotState(jnp.zeros([], jnp.int32), params, opt.init(params))

  def update(updates, state, params=None, *, round_key=None, **unused):
    del unused
    base.require("updates (the gradient of the client loss)", updates, "drfa")
    base.require("round_key", round_key, "drfa")
    step, opt_state = opt.update(updates, state.opt_state, params)
    snap_step = jax.random.randint(round_key, (), 1, tau)  # k' in {1 .. tau-1}
    take = (state.count % tau) + 1 == snap_step
    snapshot = base.select(take, optax.apply_updates(params, step), state.snapshot)
    return step, SnapshotState(state.count + 1, snapshot, opt_state)

  def server_init(server, counts):
    del server
    c = counts.astype(jnp.float32)
    return WeightsState(c / jnp.sum(c))

  def server_update(server, state, client_values, info):
    n, m = info.num_clients, info.ids.shape[0]
    lam, alive = state.weights, info.alive_mask
    x_new = _lambda_step(server, lam, client_values, info)
    survivors = jnp.maximum(jnp.sum(alive), 1)
    snapshot = base.weighted_client_mean(client_values["snapshot"], alive / survivors)
    k_ids, k_loss = jax.random.split(info.key)
    queried = jnp.sort(jax.random.permutation(k_ids, n)[:m])
    losses = info.client_losses(snapshot, queried, k_loss)
    v = jnp.zeros((n,), lam.dtype).at[queried].set((n / m) * losses)
    lam = base.project_simplex(lam + gamma * tau * v)
    return {**server, "params": x_new}, WeightsState(lam)

  return base.Algorithm(
    init,
    update,
    plan,
    base.ServerAggregator(server_init, server_update, queries_losses=True),
    "drfa",
    "plain",
  )


@base.register(settings={"afl": dict(learning_rate=0.1, weights_lr=0.1)})
@base.factory(static=("optimizer",))
def afl(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  *,
  weights_lr: float = 0.1,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """Agnostic federated learning (one local step per round).

  Args:
    learning_rate: the model step ``> 0`` or a schedule; ``None``: 0.01.
    weights_lr: ``eta_lambda > 0``.
    optimizer: the local parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  eta = _validate.positive("weights_lr", weights_lr)
  init, update = _local_sgd_with_loss(opt, "afl")
  plan = base.make_plan(1, round_start_loss=("loss",), report=("loss",))

  def server_init(server, counts):
    del server
    return WeightsState(jnp.full(counts.shape, 1.0 / counts.shape[0], jnp.float32))

  def server_update(server, state, client_values, info):
    lam, alive = state.weights, info.alive_mask
    x_new = _lambda_step(server, lam, client_values, info)
    losses = (
      jnp.zeros((info.num_clients,), lam.dtype).at[info.ids].set(client_values["loss"] * alive)
    )
    return {**server, "params": x_new}, WeightsState(base.project_simplex(lam + eta * losses))

  return base.Algorithm(
    init, update, plan, base.ServerAggregator(server_init, server_update), "afl", "plain"
  )
