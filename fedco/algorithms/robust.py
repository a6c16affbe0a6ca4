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

References:
  Li, Sanjabi, Beirami, Smith, "Fair resource allocation in federated learning" (ICLR 2020).
  Deng, Kamani, Mahdavi, "Distributionally robust federated averaging" (NeurIPS 2020).
  Mohri, Sivek, Suresh, "Agnostic federated learning" (ICML 2019).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, extend


class LossState(NamedTuple):
  """Local SGD plus the client's loss ``F_k`` at the round's model."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  loss: jnp.ndarray
  opt_state: optax.OptState


class SnapshotState(NamedTuple):
  """Local SGD plus the model after the round's random step ``k'`` (DRFA)."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  snapshot: Any
  opt_state: optax.OptState


class WeightsState(NamedTuple):
  """The server's mixture weights ``lambda`` over all clients."""

  weights: jnp.ndarray


def _lambda_step(server, lam, client_values, info):
  """``x - sum_{i in S} (N/m) lambda_i (x - x_i)`` over the round's surviving clients;
  under a run's aggregation rule, ``x + c RoundInfo.center(x_i - x, (N/m) lambda_i / c)``
  with ``c = sum_{i in S} (N/m) lambda_i``."""
  coef = (info.num_clients / info.ids.shape[0]) * lam[info.ids] * info.alive_mask
  if info.combine is not None:
    total = jnp.sum(coef)
    changes = jax.tree.map(lambda b, a: b - a[None], client_values["params"], server["params"])
    center = info.center(changes, coef / jnp.maximum(total, jnp.finfo(coef.dtype).tiny))
    return jax.tree.map(lambda a, c: a + total.astype(a.dtype) * c, server["params"], center)
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
    extend.require("updates (the gradient of the client loss)", updates, name)
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, LossState(state.count + 1, state.loss, opt_state)

  return init, update


@extend.register(settings={"qfedavg": dict(learning_rate=0.1, q=0.2)})
@extend.factory(static=("local_steps", "optimizer"))
def qfedavg(
  learning_rate: Optional[float] = None,
  local_steps: int = 5,
  *,
  q: float = 0.2,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020): fair FL by the q-FFL objective.

  The q-FedAvg baseline of SPEC 3 (papers 000/001's DRO-FL experiments, E1 and E1b) on a
  plain problem (only the client losses :math:`h_k`). It minimises
  :math:`\sum_k \frac{p_k}{q + 1} F_k^{q + 1}(x)`, which for :math:`q > 0` weighs clients
  with larger losses more. Each sampled client records :math:`F_k`, the loss of the
  round's model :math:`x` on its whole training set, and runs ``local_steps`` steps of local
  SGD with rate :math:`\mathrm{lr}` to :math:`x_k`; the server (Lipschitz estimate
  :math:`L = 1/\mathrm{lr}`) then steps

  .. math::

     \Delta w_k &= (x - x_k) / \mathrm{lr}, \qquad
       \Delta_k = F_k^q\, \Delta w_k, \qquad
       h_k = q F_k^{q - 1} \|\Delta w_k\|^2 + F_k^q / \mathrm{lr}, \\
     x &\leftarrow x - \frac{\sum_{k \in S} \Delta_k}{\sum_{k \in S} h_k}.

  :math:`q = 0` is FedAvg with uniform weights. Losses are floored at ``1e-10`` (for
  :math:`F^{q-1}`); clients that drop out of a round count in neither sum, and a round
  nobody survives leaves :math:`x` unchanged.

  Communication: each sampled client sends its model and :math:`F_k` (``d + 1`` floats up:
  the plan's ``round_start_loss=("loss",)`` and ``report=("loss",)``) and receives ``d``.
  Client state ``LossState(count, loss, opt_state)``; the server keeps no state.

  Args:
    learning_rate: the local SGD rate :math:`\mathrm{lr} > 0` (a number, not a schedule);
      ``None``: 0.01 (paper 001 E1). The server's Lipschitz estimate is
      :math:`L = 1/\mathrm{lr}` whatever the local step, so ``learning_rate`` may be given
      beside an ``optimizer`` transform.
    local_steps: local steps per round, a positive int (paper 001 E1: :math:`\tau = 5`).
    q: the fairness exponent :math:`q \ge 0` (paper 001 E1: 0.2; grid
      :math:`\{0.1, 0.2, 0.5, 1, 2\}`; 0 is uniform FedAvg).
    optimizer: the local parameter step: ``None`` (``optax.sgd(lr)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate.

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose ``server`` is a
    :class:`fedco.algorithms.ServerAggregator`.

  Raises:
    ValueError: ``learning_rate`` is not positive or ``q`` is negative.

  Examples:
    The server step on two clients' models after local SGD with :math:`\mathrm{lr} = 0.1`,
    whose round-start losses are 1 and 4: :math:`q = 0` averages the models, :math:`q = 1`
    moves toward the client with the larger loss:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import RoundInfo
    >>> fedco.qfedavg(0.1).plan.report  # F_k goes up with the model
    ('loss',)
    >>> info = RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                  counts=jnp.array([4, 4]), num_clients=2,
    ...                  key=jax.random.PRNGKey(0), client_losses=None)
    >>> server = {"params": jnp.zeros(2)}
    >>> models = jnp.array([[0.1, 0.0], [0.0, 0.1]])  # x_k, one row per client
    >>> uploads = {"params": models, "loss": jnp.array([1.0, 4.0])}
    >>> for q in (0.0, 1.0):
    ...   alg = fedco.qfedavg(0.1, q=q)
    ...   state = alg.server.init(server, info.counts)
    ...   new, _ = jax.jit(lambda u: alg.server.update(server, state, u, info))(uploads)
    ...   print(q, [round(v, 4) for v in new["params"].tolist()])
    0.0 [0.05, 0.05]
    1.0 [0.0192, 0.0769]
  """
  lr = _validate.positive("learning_rate", 0.01 if learning_rate is None else learning_rate)
  _validate.positive("q", q, allow_zero=True)
  opt = extend.param_optimizer(lr, optimizer, default=0.01, shared_rate=True)
  init, update = _local_sgd_with_loss(opt, "qfedavg")
  plan = extend.make_plan(local_steps, round_start_loss=("loss",), report=("loss",))

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

  return extend.Algorithm(
    init, update, plan, extend.ServerAggregator(server_init, server_update), "qfedavg", "plain"
  )


@extend.register(settings={"drfa": dict(learning_rate=0.1, weights_lr=0.08)})
@extend.factory(static=("local_steps", "optimizer"))
def drfa(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  weights_lr: float = 0.08,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""DRFA / DRFL (Deng, Kamani, Mahdavi 2020): distributionally robust federated averaging.

  The DRFA (DRFL) baseline of SPEC 3 (papers 000/001's DRO-FL experiments, E1 and E1b) on
  a plain problem: :math:`\min_x \max_{\lambda \in \Delta_N} \sum_i \lambda_i F_i(x)` over
  the :math:`N` clients' losses. :math:`\lambda` starts at the clients' sample fractions. A
  round: :math:`m` clients sampled uniformly (the set :math:`S`) run
  :math:`\tau` = ``local_steps`` local SGD steps from :math:`x`; each also keeps its model
  after a random step :math:`k' \in \{1, \dots, \tau - 1\}` (one :math:`k'` per round,
  shared by the clients). The server then steps

  .. math::

     x &\leftarrow x - \sum_{i \in S} \frac{N}{m}\, \lambda_i\, (x - x_i), \qquad
       x' = \frac{1}{|S|} \sum_{i \in S} x_i^{(k')}, \\
     \lambda &\leftarrow \mathrm{Proj}_{\Delta_N}(\lambda + \gamma_\lambda\, \tau\, v),
       \qquad v_i = \frac{N}{m}\, \ell_i(x') \ (i \in U), \ 0 \text{ otherwise},

  where a fresh uniform set :math:`U` of :math:`m` clients reports one mini-batch loss
  :math:`\ell_i(x')` of the snapshot :math:`x'` (the aggregator's loss queries,
  ``queries_losses=True``). Clients that drop out of a round count in neither the model
  step nor the snapshot.

  Communication: each sampled client sends its model and its step-:math:`k'` snapshot
  (the plan's ``report=("snapshot",)``: ``2d`` floats up) and receives ``d``; the loss
  queries send :math:`x'` to the :math:`m` queried clients and one float back from each
  (outside the plan, so privacy refuses DRFA). Client state
  ``SnapshotState(count, snapshot, opt_state)``; the server state ``WeightsState(weights)``
  holds :math:`\lambda`.

  Args:
    learning_rate: the local SGD rate :math:`> 0` or an optax schedule; ``None``: 0.01
      (paper 001 E1).
    local_steps: :math:`\tau \ge 2` (the snapshot step :math:`k'` is drawn from
      :math:`\{1, \dots, \tau - 1\}`; paper 001 E1: :math:`\tau = 5`).
    weights_lr: :math:`\gamma_\lambda > 0` (paper 001: 0.08; grid
      :math:`\{0.008, 0.08, 0.8\}`).
    optimizer: the local parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose ``server`` is a
    :class:`fedco.algorithms.ServerAggregator` that queries client losses.

  Raises:
    ValueError: ``local_steps < 2``, ``weights_lr`` or the learning rate is not positive,
      or both ``learning_rate`` and an optax transform ``optimizer`` are given.

  Examples:
    The server step on two clients holding 3 and 1 examples (:math:`\lambda` starts at
    :math:`(0.75, 0.25)`) whose snapshot losses are 1 and 3: the model is the
    :math:`\lambda`-weighted average (all clients sampled) and :math:`\lambda` moves toward
    the client with the larger loss:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import RoundInfo
    >>> alg = fedco.drfa(0.1, local_steps=2, weights_lr=0.08)
    >>> alg.plan.report  # sent up with the model
    ('snapshot',)
    >>> snapshot_losses = lambda x, ids, key: jnp.array([1.0, 3.0])[ids]  # l_i(x')
    >>> info = RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                  counts=jnp.array([3, 1]), num_clients=2,
    ...                  key=jax.random.PRNGKey(0), client_losses=snapshot_losses)
    >>> server = {"params": jnp.zeros(2)}
    >>> weights = alg.server.init(server, info.counts)
    >>> models = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # one row per client
    >>> uploads = {"params": models, "snapshot": models}
    >>> server, weights = jax.jit(lambda u: alg.server.update(server, weights, u, info))(uploads)
    >>> [round(v, 3) for v in server["params"].tolist()]
    [0.75, 0.25]
    >>> [round(v, 3) for v in weights.weights.tolist()]  # Proj(lambda + 0.08 * 2 * (1, 3))
    [0.59, 0.41]
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  tau = _validate.positive_int("local_steps", local_steps, minimum=2)
  gamma = _validate.positive("weights_lr", weights_lr)
  plan = extend.make_plan(tau, report=("snapshot",))

  def init(params, *, inner_value=None):
    del inner_value
    params = extend.strong(params)
    return SnapshotState(jnp.zeros([], jnp.int32), params, opt.init(params))

  def update(updates, state, params=None, *, round_key=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "drfa")
    extend.require("round_key", round_key, "drfa")
    step, opt_state = opt.update(updates, state.opt_state, params)
    snap_step = jax.random.randint(round_key, (), 1, tau)  # k' in {1 .. tau-1}
    take = (state.count % tau) + 1 == snap_step
    snapshot = extend.select(take, optax.apply_updates(params, step), state.snapshot)
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
    snapshot = extend.weighted_client_mean(client_values["snapshot"], alive / survivors)
    k_ids, k_loss = jax.random.split(info.key)
    queried = jnp.sort(jax.random.permutation(k_ids, n)[:m])
    losses = info.client_losses(snapshot, queried, k_loss)
    v = jnp.zeros((n,), lam.dtype).at[queried].set((n / m) * losses)
    lam = extend.project_simplex(lam + gamma * tau * v)
    return {**server, "params": x_new}, WeightsState(lam)

  return extend.Algorithm(
    init,
    update,
    plan,
    extend.ServerAggregator(server_init, server_update, queries_losses=True, combines=True),
    "drfa",
    "plain",
  )


@extend.register(settings={"afl": dict(learning_rate=0.1, weights_lr=0.1)})
@extend.factory(static=("optimizer",))
def afl(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  *,
  weights_lr: float = 0.1,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""AFL (Mohri, Sivek, Suresh 2019): agnostic federated learning, one step per round.

  The AFL baseline of SPEC 3 (E1b, the agnostic-FL setting on UCI Adult) on a plain
  problem: :math:`\min_x \max_{\lambda \in \Delta_N} \sum_k \lambda_k F_k(x)` over the
  :math:`N` clients' losses, by stochastic gradient descent-ascent. :math:`\lambda` starts
  uniform. Every round each sampled client (the set :math:`S` of :math:`m`) reports
  :math:`F_k`, the loss of the round's model :math:`x` on its whole training set, and takes
  one gradient step to :math:`x_k`; the server steps on the :math:`\lambda`-weighted loss,
  then ascends on :math:`\lambda`:

  .. math::

     x &\leftarrow x - \sum_{k \in S} \frac{N}{m}\, \lambda_k\, (x - x_k), \\
     \lambda &\leftarrow \mathrm{Proj}_{\Delta_N}(\lambda + \eta_\lambda F),
       \qquad F_k = 0 \text{ for clients not sampled (or dropped out)}.

  Communication: each sampled client sends its model and :math:`F_k` (the plan's
  ``round_start_loss=("loss",)`` and ``report=("loss",)``: ``d + 1`` floats up) and
  receives ``d``. Client state ``LossState(count, loss, opt_state)``; the server state
  ``WeightsState(weights)`` holds :math:`\lambda`.

  Args:
    learning_rate: the model step :math:`> 0` or an optax schedule; ``None``: 0.01 (E1b's
      config uses 0.1).
    weights_lr: :math:`\eta_\lambda > 0`, the ascent step on :math:`\lambda` (E1b's config:
      0.1).
    optimizer: the local parameter step: ``None`` (``optax.sgd(learning_rate)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``, one local step per round) whose
    ``server`` is a :class:`fedco.algorithms.ServerAggregator`.

  Raises:
    ValueError: ``weights_lr`` or the learning rate is not positive, or both
      ``learning_rate`` and an optax transform ``optimizer`` are given.

  Examples:
    The server step on two clients whose losses at the round's model are 1 and 3, from
    uniform :math:`\lambda`: the model is the average of theirs, and :math:`\lambda` moves
    toward the client with the larger loss:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import RoundInfo
    >>> alg = fedco.afl(0.1, weights_lr=0.1)
    >>> alg.plan.local_steps, alg.plan.report
    (1, ('loss',))
    >>> info = RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                  counts=jnp.array([4, 4]), num_clients=2,
    ...                  key=jax.random.PRNGKey(0), client_losses=None)
    >>> server = {"params": jnp.zeros(2)}
    >>> weights = alg.server.init(server, info.counts)  # uniform
    >>> models = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # x_k, one row per client
    >>> uploads = {"params": models, "loss": jnp.array([1.0, 3.0])}
    >>> server, weights = jax.jit(lambda u: alg.server.update(server, weights, u, info))(uploads)
    >>> [round(v, 3) for v in server["params"].tolist()]
    [0.5, 0.5]
    >>> [round(v, 3) for v in weights.weights.tolist()]  # Proj(0.5 + 0.1 * (1, 3))
    [0.4, 0.6]
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  eta = _validate.positive("weights_lr", weights_lr)
  init, update = _local_sgd_with_loss(opt, "afl")
  plan = extend.make_plan(1, round_start_loss=("loss",), report=("loss",))

  def server_init(server, counts):
    del server
    return WeightsState(jnp.full(counts.shape, 1.0 / counts.shape[0], jnp.float32))

  def server_update(server, state, client_values, info):
    lam, alive = state.weights, info.alive_mask
    x_new = _lambda_step(server, lam, client_values, info)
    losses = (
      jnp.zeros((info.num_clients,), lam.dtype).at[info.ids].set(client_values["loss"] * alive)
    )
    return {**server, "params": x_new}, WeightsState(extend.project_simplex(lam + eta * losses))

  return extend.Algorithm(
    init,
    update,
    plan,
    extend.ServerAggregator(server_init, server_update, combines=True),
    "afl",
    "plain",
  )
