r"""Meta-learning and personalisation baselines (SPEC 3): Per-FedAvg / FedMAML, TR-MAML, Ditto.

All three are baselines of paper 001's personalised-FL experiment (E2). The first two run on
:mod:`fedco.problems.maml` problems (local-inner): one example is an *episode* holding all of
a client's task slots, the inner value ``g(w; e)`` is the **table** of adapted parameters
(leaves ``[T, *param_shape]``, slot ``t`` = ``w - a grad L_t(w; support_t)``) and the outer is
``f(y; e) = sum_t w_t L_t(y[t]; query_t)``. Ditto runs on a plain problem.

Per-FedAvg / FedMAML (Fallah et al. 2020; Chen et al. 2018)
-----------------------------------------------------------
SPEC 3, one local step on three independent batches ``D``, ``D'``, ``D''``::

    w~ = w - a grad f(w; D)                       (adaptation, the inner step)
    g  = grad f(w~; D')                           (query gradient at the adapted point)
    w  = w - b (I - a Hess f(w; D'')) g           (meta step)

and every ``local_steps`` steps the server averages ``w`` (plain averaging, uniform weights).
In fedco terms, with the runtime's three independently drawn batches (``inner_fn`` = ``D``,
``outer_fn`` = ``D'``, ``next_inner_fn`` = ``D''``):

1. ``y = inner_fn(w)``: the table of adapted parameters on ``D``'s support sets.
2. ``G = grad outer_fn(y)``: the table of query gradients, ``G[t] = w_t grad L_t(y[t]; D')``
   (the outer weights ``w_t`` are already inside ``G``; unweighted slots are exactly 0).
3. The direction ``z``, by ``variant``:

   * ``"exact"``: ``z = J_{g}(w; D'')^T G = sum_t (I - a H_t(w; D'')) G[t]``, one
     ``jax.vjp`` of ``next_inner_fn`` at ``w`` (a Hessian-vector product per slot through a
     function that calls ``jax.grad``; the Hessian is never formed). This works on any
     local-inner problem; on a MAML problem with ``inner_steps > 1`` it is the chained
     product of the steps' factors, i.e. the exact MAML gradient.
   * ``"first_order"``: drop the Hessian, ``z = sum_t G[t]`` (the table summed over its slot
     axis; an inner value shaped like the parameters, without a slot axis, is used as is).
   * ``"hessian_free"``: ``(I - a H_t) v ~= (g_t(w + delta v; D'') - g_t(w - delta v; D''))
     / (2 delta)`` with ``v = G[t]`` and ``g_t`` slot ``t`` of ``next_inner_fn``, summed over
     ``t``. For one-step MAML, ``g_t(w) = w - a grad L_t(w)``, this is exactly Per-FedAvg's
     Hessian-free estimate ``v - a (grad L_t(w + delta v) - grad L_t(w - delta v))/(2 delta)``
     (the ``w`` terms cancel). It is a *directional* derivative ``J_{g_t} v``, which equals
     the needed ``J_{g_t}^T v`` because ``I - a H_t`` is symmetric; with ``inner_steps > 1``
     the Jacobian is a product of non-commuting factors and the estimate is ``J v``, not
     ``J^T v``. **Cost**: ``next_inner_fn`` adapts every slot of the table, and slot ``t``
     needs its own perturbation, so a table of ``T`` slots costs ``2 T`` evaluations of
     ``next_inner_fn`` (``vmap``-ed; ``2 T^2`` task adaptations, first-order only) where the
     exact variant costs one forward and one backward pass (``T`` adaptations plus ``T``
     Hessian-vector products). Its error is ``O(delta^2)`` plus float32 rounding of about
     ``1e-7 |w| / delta`` per entry.

4. ``w = w - b (z + grad h(w))`` (``b = learning_rate``, or any optax ``optimizer``).

The inner step ``a`` is the problem's ``inner_lr`` (``fedco.problems.maml(apply_fn,
inner_lr)``); the algorithm never needs it, so it takes no ``inner_lr`` argument. **Choice**:
SPEC 3 names FedMAML and Per-FedAvg as one algorithm; :func:`fedmaml` is :func:`per_fedavg`
with the label ``"fedmaml"`` (paper 001's E2 setting "FedMAML 0.1/0.1" is
``fedmaml(learning_rate=0.1)`` on ``maml(apply_fn, inner_lr=0.1)``).

TR-MAML (Collins et al. 2020), federated: task = client
-------------------------------------------------------
Task-robust MAML minimises ``max_{p in simplex} sum_k p_k F_k(w)`` with ``F_k`` client
``k``'s MAML loss. A round, with ``m`` of the ``K`` clients sampled into ``S``:

1. every client in ``S`` starts from the server model ``x`` and runs ``local_steps`` steps
   ``w = w - b (J_g(w; D)^T grad f(g(w; D); D') + grad h(w))`` (ComFedL-MAML / Local-BSGD's
   step: the VJP of ``inner_fn``, the same batch for the value and the Jacobian);
2. at its first step (``local_step == 0``, so at ``x``) it records its adapted loss
   ``e_k = f(g(x; D); D') (+ h(x; D'))`` on that step's batches, and sends ``e_k`` with its
   model ``x_k`` (the plan's ``report``);
3. the server steps ``x = x - sum_{k in S} (K/m) p_k (x - x_k)`` (DRFA's form; with
   ``m = K`` this is the ``p``-weighted average ``sum_k p_k x_k``), and
   ``p = Proj_simplex(p + weights_lr * v)`` with ``v_k = (K/m) e_k`` for ``k in S``, 0 for the
   others (an unbiased estimate of the full loss vector).

``p`` starts uniform over all ``K`` clients and lives in the aggregator state
(``result.state.server_opt_state.p``). Clients that drop out of a round
(``RoundInfo.alive``) count neither in the model step nor in ``v``.

Ditto (Li, Hu, Beirami, Smith 2021)
-----------------------------------
On a plain problem (``updates = grad h_k(x)``, the client loss gradient). The global model is
plain FedAvg: ``x = x - eta grad h_k(x; xi)`` per local step and server averaging. Every
client also keeps a personal model ``v_k`` (initialised to the initial parameters), and every
step::

    anchor = x                      at the round's first step (the model the round started from)
    v_k = v_k - eta_p (grad F_k(v_k; xi) + lam (v_k - anchor))

with ``grad F_k(v_k; xi) = jax.grad(extra_fn)(v_k)``, the client loss on this step's batch
(the batch ``updates`` was computed on). Personal models are never sent (the plan
communicates only the parameters); they persist across rounds on the client, also through
rounds the client is not sampled in, and are read from ``result.state.clients.personal``.
**Choice**: the server mean is weighted by client sample counts (``weighting="samples"``,
the default of :func:`fedco.fedavg`, SPEC 3's "plain FedAvg"; Ditto leaves the global
solver's aggregation to FedAvg); ``weighting="uniform"`` is offered. ``personal_lr``
defaults to ``learning_rate`` (paper 001: 0.2 for both). The optax ``optimizer``, when
given, replaces the *global* SGD step only; the personal step is the SPEC's SGD.

References:
  Fallah, Mokhtari, Ozdaglar, "Personalized federated learning with theoretical guarantees:
  a model-agnostic meta-learning approach" (NeurIPS 2020). Chen, Luo, Dong, Li, He,
  "Federated meta-learning with fast convergence and efficient communication" (2018).
  Collins, Mokhtari, Shakkottai, "Task-robust model-agnostic meta-learning" (NeurIPS 2020).
  Li, Hu, Beirami, Smith, "Ditto: fair and robust federated learning through
  personalization" (ICML 2021).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators, extend
from fedco.algorithms import personal
from fedco.algorithms.moml import tracker_layout

VARIANTS = ("exact", "first_order", "hessian_free")


# ---- Per-FedAvg / FedMAML ----------------------------------------------------------------


class PerFedAvgState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  opt_state: optax.OptState


def _check_layout(y, params, variant):
  """The first-order and Hessian-free directions need a parameter-shaped (or table) inner."""
  layout = tracker_layout(y, params)
  if variant != "exact" and layout == "other":
    raise ValueError(
      f"per_fedavg(variant={variant!r}) needs an inner value shaped like the parameters, "
      "optionally with a leading task-slot axis (a fedco.problems.maml problem); got "
      f"{jax.tree.map(jnp.shape, y)} for parameters {jax.tree.map(jnp.shape, params)}. "
      "Use variant='exact' for other inner maps."
    )
  return layout


def _axpy(params, scale, v):
  """``params + scale * v`` leafwise."""
  return jax.tree.map(lambda p, d: p + scale * d, params, v)


def _hessian_free(next_inner_fn, params, cotangent, layout, delta):
  """``sum_t (g_t(w + delta v_t) - g_t(w - delta v_t)) / (2 delta)``, ``v_t = cotangent[t]``."""
  if layout == "params":
    plus = next_inner_fn(_axpy(params, delta, cotangent))
    minus = next_inner_fn(_axpy(params, -delta, cotangent))
    return jax.tree.map(lambda a, b: (a - b) / (2 * delta), plus, minus)
  # table: slot t's perturbation is G[t]; evaluate all T perturbations at once (leaves
  # [T, T, ...]: perturbation, slot) and keep slot t of the t-th evaluation
  plus = jax.vmap(lambda v: next_inner_fn(_axpy(params, delta, v)))(cotangent)
  minus = jax.vmap(lambda v: next_inner_fn(_axpy(params, -delta, v)))(cotangent)

  def diagonal_sum(a, b):
    idx = jnp.arange(a.shape[0])
    return jnp.sum(a[idx, idx] - b[idx, idx], axis=0) / (2 * delta)

  return jax.tree.map(diagonal_sum, plus, minus)


@extend.register(settings={"per_fedavg": dict(learning_rate=0.1)})
@extend.factory(static=("local_steps", "optimizer"))
def per_fedavg(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  variant: str = "exact",
  delta: float = 1e-3,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Per-FedAvg (Fallah et al. 2020; = FedMAML, Chen et al. 2018): local MAML steps, averaged.

  The Per-FedAvg / FedMAML baseline of SPEC 3 (paper 001's personalised-FL experiment,
  E2) for local-inner problems :math:`F(x) = \frac{1}{K}\sum_k [f_k(g_k(x)) + h_k(x)]`,
  in practice :func:`fedco.problems.maml`: the inner value :math:`g(w; D)` is the table of
  adapted parameters :math:`g_t(w) = w - a \nabla L_t(w; D_t)` over the client's task slots
  and the outer is :math:`f(y; D') = \sum_t \omega_t L_t(y_t; D'_t)`. Each local step uses
  the runtime's three independent batches :math:`D` (``inner_fn``), :math:`D'`
  (``outer_fn``) and :math:`D''` (``next_inner_fn``):

  .. math::

     G &= \nabla_y f(g(w; D); D')
       \quad \text{(query gradients at the adapted parameters)}, \\
     z &= J_g(w; D'')^\top G = \sum_t (I - a \nabla^2 L_t(w; D''_t))\, G_t
       \quad (\text{exact}), \\
     z &= \sum_t G_t \quad (\text{first order}), \\
     z &\approx \sum_t \frac{g_t(w + \delta G_t; D'') - g_t(w - \delta G_t; D'')}{2\delta}
       \quad (\text{Hessian-free}), \\
     w &\leftarrow w - b\, (z + \nabla h(w)).

  ``"exact"`` is one ``jax.vjp`` of ``next_inner_fn`` (Hessian-vector products; the
  Hessian is never formed) and, with several inner steps, the exact MAML gradient.
  ``"hessian_free"`` is Per-FedAvg's finite-difference estimate: exact up to
  :math:`O(\delta^2)` and float32 rounding for one inner step (with several it estimates
  :math:`J_g v`, not :math:`J_g^\top v`), and it costs :math:`2T` evaluations of
  ``next_inner_fn`` for a table of :math:`T` slots (see the module docstring). The inner
  step :math:`a` is the problem's (``fedco.problems.maml(apply_fn, inner_lr=a)``), so the
  algorithm takes none. Every ``local_steps`` steps the server averages the models with
  uniform weights.

  Communication: only the parameters, ``d`` floats each way per sampled client per round.
  Client state ``PerFedAvgState(count, opt_state)``: nothing beyond the optimizer.

  Args:
    learning_rate: the meta step :math:`b > 0` or an optax schedule; ``None``: 0.1 (paper
      001 E2).
    local_steps: local steps per round, a positive int (paper 001 E2: :math:`\tau = 5`).
    variant: ``"exact"`` (default; second order, any local-inner problem),
      ``"first_order"`` or ``"hessian_free"`` (these two need an inner value shaped like the
      parameters, optionally with a leading task-slot axis).
    delta: the finite-difference step :math:`\delta > 0` of ``"hessian_free"`` (SPEC:
      ``1e-3``); unused by the other variants.
    optimizer: the parameter step: ``None`` (``optax.sgd(b)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="local"``) named ``"per_fedavg"``, whose
    plan averages only the parameters, uniformly.

  Raises:
    ValueError: ``variant`` is not one of the three, ``delta`` or the learning rate is not
      positive, or both ``learning_rate`` and an optax transform ``optimizer`` are given;
      from ``init`` / ``update``, ``"first_order"`` or ``"hessian_free"`` on an inner value
      not shaped like the parameters (use ``"exact"`` there).

  Examples:
    Two tasks :math:`L_t(w) = \frac{1}{2}\|w - c_t\|^2` (the same on every batch) with
    inner step :math:`a = 0.1`: the Hessian is :math:`I`, so the exact direction is the
    first-order one times :math:`1 - a = 0.9`, and the Hessian-free one matches it:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> centers = jnp.array([[1.0, 2.0], [3.0, 0.0]])  # c_t, one row per task
    >>> loss = lambda w, c: 0.5 * jnp.sum((w - c) ** 2)
    >>> inner_fn = lambda w: jnp.stack([w - 0.1 * jax.grad(loss)(w, c) for c in centers])
    >>> outer_fn = lambda y: 0.5 * (loss(y[0], centers[0]) + loss(y[1], centers[1]))
    >>> def first_step(alg, w):
    ...   updates, _ = alg.update(None, alg.init(w), w, inner_fn=inner_fn,
    ...                           outer_fn=outer_fn, next_inner_fn=inner_fn)
    ...   return updates
    >>> for variant in ("exact", "first_order", "hessian_free"):
    ...   alg = fedco.per_fedavg(1.0, variant=variant)  # b = 1: the step is -z
    ...   updates = jax.jit(lambda w: first_step(alg, w))(jnp.zeros(2))
    ...   print(variant, [round(v, 3) for v in updates.tolist()])
    exact [1.62, 0.81]
    first_order [1.8, 0.9]
    hessian_free [1.62, 0.81]
  """
  _validate.one_of("variant", variant, VARIANTS)
  delta = _validate.positive("delta", delta)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
  plan = extend.make_plan(local_steps)

  def init(params, *, inner_value=None):
    if inner_value is not None:
      _check_layout(inner_value, params, variant)
    return PerFedAvgState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, next_inner_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = extend.oracles(
      "per_fedavg", inner_fn, outer_fn, next_inner_fn
    )
    y = inner_fn(params)  # w~ = w - a grad f(w; D), every slot
    layout = _check_layout(y, params, variant)
    grad_y = jax.grad(outer_fn)(y)  # G = grad f(w~; D')
    if variant == "exact":  # (I - a Hess f(w; D'')) G
      _, pullback = estimators.inner_vjp(next_inner_fn, params)
      z = pullback(grad_y)
    elif variant == "first_order":
      z = grad_y if layout == "params" else jax.tree.map(lambda a: jnp.sum(a, axis=0), grad_y)
    else:
      z = _hessian_free(next_inner_fn, params, grad_y, layout, delta)
    z = extend.add_grads(z, updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, PerFedAvgState(state.count + 1, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "per_fedavg", "local")


@extend.register(settings={"fedmaml": dict(learning_rate=0.1)})
@extend.factory(static=("local_steps", "optimizer"))
def fedmaml(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  variant: str = "exact",
  delta: float = 1e-3,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedMAML (Chen et al. 2018): :func:`per_fedavg` under the label ``"fedmaml"``.

  **Choice**: SPEC 3 names FedMAML and Per-FedAvg (Fallah et al. 2020) as one algorithm,
  so this is :func:`per_fedavg` with the same arguments and the name ``"fedmaml"`` (in
  logs, metrics and experiment configs): local MAML steps
  :math:`w \leftarrow w - b\,(J_g(w; D'')^\top \nabla f(g(w; D); D') + \nabla h(w))` on a
  local-inner (MAML) problem, with uniform model averaging every ``local_steps`` steps.
  Only the parameters are communicated (``d`` floats each way per sampled client per
  round); clients keep no state beyond the optimizer. Paper 001's E2 setting "FedMAML
  0.1/0.1" is ``fedmaml(0.1)`` on ``fedco.problems.maml(apply_fn, inner_lr=0.1)``.

  Args:
    learning_rate: the meta step :math:`b > 0` or an optax schedule; ``None``: 0.1 (paper
      001 E2).
    local_steps: local steps per round, a positive int (paper 001 E2: :math:`\tau = 5`).
    variant: ``"exact"`` (default), ``"first_order"`` or ``"hessian_free"``, as in
      :func:`per_fedavg`.
    delta: the finite-difference step :math:`\delta > 0` of ``"hessian_free"`` (SPEC:
      ``1e-3``).
    optimizer: the parameter step: ``None`` (``optax.sgd(b)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="local"``) named ``"fedmaml"``; its steps
    are :func:`per_fedavg`'s.

  Raises:
    ValueError: as :func:`per_fedavg`.

  Examples:
    Paper 001's rates (inner step 0.1, meta step 0.1) on two tasks
    :math:`L_t(w) = \frac{1}{2}\|w - c_t\|^2`: the first step from :math:`w = 0` is
    :func:`per_fedavg`'s exact step with :math:`b = 1` (``[1.62, 0.81]``) times 0.1:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> centers = jnp.array([[1.0, 2.0], [3.0, 0.0]])  # c_t, one row per task
    >>> loss = lambda w, c: 0.5 * jnp.sum((w - c) ** 2)
    >>> inner_fn = lambda w: jnp.stack([w - 0.1 * jax.grad(loss)(w, c) for c in centers])
    >>> outer_fn = lambda y: 0.5 * (loss(y[0], centers[0]) + loss(y[1], centers[1]))
    >>> alg = fedco.fedmaml(0.1)
    >>> alg.name, alg.plan.local_steps, alg.plan.every_round  # only x is averaged
    ('fedmaml', 5, ())
    >>> step_fn = jax.jit(lambda w: alg.update(None, alg.init(w), w, inner_fn=inner_fn,
    ...                                        outer_fn=outer_fn, next_inner_fn=inner_fn))
    >>> updates, _ = step_fn(jnp.zeros(2))
    >>> [round(v, 4) for v in updates.tolist()]
    [0.162, 0.081]
  """
  alg = per_fedavg(learning_rate, local_steps, variant=variant, delta=delta, optimizer=optimizer)
  return alg.replace(name="fedmaml")


# ---- TR-MAML -----------------------------------------------------------------------------


class TRMAMLState(NamedTuple):
  """Client state: step counter, the adapted loss ``e_k`` at the round's model, optimizer."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  loss: jnp.ndarray
  opt_state: optax.OptState


class TRMAMLServerState(NamedTuple):
  """The server's task (client) weights ``p`` on the simplex over all ``K`` clients."""

  p: jnp.ndarray


@extend.register(settings={"tr_maml": dict(learning_rate=0.1, weights_lr=0.08)})
@extend.factory(static=("local_steps", "optimizer"))
def tr_maml(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  weights_lr: float = 0.08,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""TR-MAML (Collins et al. 2020) in federated form: task-robust MAML with task = client.

  Task-robust MAML minimises the worst mixture of the clients' MAML losses,
  :math:`\min_x \max_{p \in \Delta_K} \sum_k p_k F_k(x)` with
  :math:`F_k(x) = f_k(g_k(x)) + h_k(x)` (SPEC 3), on local-inner (MAML) problems such as
  :func:`fedco.problems.maml`. In a round with the set :math:`S` of :math:`m` of the
  :math:`K` clients sampled, every client in :math:`S` starts from the server model
  :math:`x` and takes ``local_steps`` steps (ComFedL-MAML's step: the VJP of ``inner_fn``,
  the same batch for the value and the Jacobian), recording at its first step its adapted
  loss :math:`e_k`:

  .. math::

     w &\leftarrow w - b\, (J_g(w; D)^\top \nabla f(g(w; D); D') + \nabla h(w)), \\
     e_k &= f(g(x; D); D') + h(x; D') \quad \text{(first step, } w = x \text{)}.

  The server then steps the model and the client weights :math:`p` (uniform at first):

  .. math::

     x &\leftarrow x - \sum_{k \in S} \frac{K}{m}\, p_k\, (x - x_k), \\
     p &\leftarrow \mathrm{Proj}_{\Delta_K}(p + \eta_p v), \qquad
       v_k = \frac{K}{m} e_k \ (k \in S), \ 0 \text{ otherwise},

  so :math:`v` is unbiased for the full loss vector and, with :math:`m = K`, :math:`x` is
  the :math:`p`-weighted average of the clients' models. Clients that drop out of a round
  count in neither sum.

  Communication: each sampled client sends its model and :math:`e_k` (the plan's
  ``report=("loss",)``: ``d + 1`` floats up) and receives ``d``. Client state
  ``TRMAMLState(count, loss, opt_state)``; the server state ``TRMAMLServerState(p)`` holds
  :math:`p` (``result.state.server_opt_state.p`` after :func:`fedco.simulate`).

  Args:
    learning_rate: the client's meta step :math:`b > 0` or an optax schedule; ``None``: 0.1
      (paper 001 E2, with inner step 0.05 in the problem).
    local_steps: local steps per round, a positive int (paper 001 E2: :math:`\tau = 5`).
    weights_lr: the step :math:`\eta_p > 0` of the weights :math:`p` (paper 001 E2: 0.08).
    optimizer: the parameter step: ``None`` (``optax.sgd(b)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="local"``) whose ``server`` is a
    :class:`fedco.algorithms.ServerAggregator` holding :math:`p`.

  Raises:
    ValueError: ``weights_lr`` or the learning rate is not positive, or both
      ``learning_rate`` and an optax transform ``optimizer`` are given.

  Examples:
    A client records its adapted loss :math:`e_k` at the round's model; then the server
    step on two clients' uploads moves :math:`p` toward the one with the larger loss:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco.algorithms import RoundInfo
    >>> loss = lambda w, c: 0.5 * jnp.sum((w - c) ** 2)  # one task, L(w) = |w - c|^2 / 2
    >>> inner_fn = lambda w: w - 0.1 * jax.grad(loss)(w, jnp.array([1.0, 2.0]))
    >>> outer_fn = lambda y: loss(y, jnp.array([1.0, 2.0]))
    >>> alg = fedco.tr_maml(0.1, local_steps=5, weights_lr=0.1)
    >>> alg.plan.report  # sent up with the model
    ('loss',)
    >>> step_fn = jax.jit(lambda w: alg.update(None, alg.init(w), w, inner_fn=inner_fn,
    ...                                        outer_fn=outer_fn, local_step=0))
    >>> _, state = step_fn(jnp.zeros(2))
    >>> round(float(state.loss), 4)  # e_k = 0.9^2 * |c|^2 / 2
    2.025
    >>> info = RoundInfo(ids=jnp.array([0, 1]), weights=jnp.array([0.5, 0.5]),
    ...                  counts=jnp.array([4, 4]), num_clients=2,
    ...                  key=jax.random.PRNGKey(0), client_losses=None)
    >>> server = {"params": jnp.zeros(2)}
    >>> p = alg.server.init(server, info.counts)  # uniform over the K = 2 clients
    >>> models = jnp.array([[1.0, 0.0], [0.0, 1.0]])  # x_k, one row per client
    >>> uploads = {"params": models, "loss": jnp.array([0.5, 2.0])}
    >>> server, p = jax.jit(lambda u: alg.server.update(server, p, u, info))(uploads)
    >>> [round(v, 3) for v in server["params"].tolist()], [round(v, 3) for v in p.p.tolist()]
    ([0.5, 0.5], [0.425, 0.575])
  """
  eta_p = _validate.positive("weights_lr", weights_lr)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.1)
  plan = extend.make_plan(local_steps, report=("loss",))
  steps = plan.local_steps

  def init(params, *, inner_value=None):
    del inner_value
    return TRMAMLState(jnp.zeros([], jnp.int32), jnp.zeros([], jnp.float32), opt.init(params))

  def update(
    updates,
    state,
    params=None,
    *,
    inner_fn=None,
    outer_fn=None,
    extra_fn=None,
    local_step=None,
    **unused,
  ):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("tr_maml", inner_fn, outer_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    value, grad_y = jax.value_and_grad(outer_fn)(sample)
    if extra_fn is not None:
      value = value + extra_fn(params)
    z = extend.add_grads(pullback(grad_y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    start = extend.at_round_start(local_step, state.count, steps)
    loss = jnp.where(start, jnp.asarray(value, state.loss.dtype), state.loss)
    return step, TRMAMLState(state.count + 1, loss, opt_state)

  def server_init(server, counts):
    del server
    k = counts.shape[0]
    return TRMAMLServerState(jnp.full((k,), 1.0 / k, jnp.float32))

  def server_update(server, state, client_values, info):
    n, m = info.num_clients, info.ids.shape[0]
    p, alive = state.p, info.alive_mask
    coef = (n / m) * p[info.ids] * alive
    x = jax.tree.map(
      lambda a, b: a - jnp.tensordot(coef.astype(a.dtype), a[None] - b, axes=1),
      server["params"],
      client_values["params"],
    )
    e = jnp.where(alive, client_values["loss"], 0.0).astype(p.dtype)
    v = jnp.zeros((n,), p.dtype).at[info.ids].set((n / m) * e)
    return {**server, "params": x}, TRMAMLServerState(extend.project_simplex(p + eta_p * v))

  return extend.Algorithm(
    init, update, plan, extend.ServerAggregator(server_init, server_update), "tr_maml", "local"
  )


# ---- Ditto -------------------------------------------------------------------------------


class DittoState(NamedTuple):
  """Client state: the personal model ``v_k``, the round's global model ``anchor``."""

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  personal: Any
  anchor: Any
  opt_state: optax.OptState


@extend.register(settings={"ditto": dict(learning_rate=0.1, lam=0.1)})
@extend.factory(static=("local_steps", "optimizer"))
def ditto(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  lam: float = 0.1,
  personal_lr: Optional[float] = None,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Ditto (Li, Hu, Beirami, Smith 2021): FedAvg for the global model plus personal models.

  The Ditto baseline of SPEC 3 (paper 001's personalised-FL experiment, E2) on a plain
  problem (only :math:`h_k`, the client loss). The global model is trained by plain FedAvg;
  every client also keeps a personal model :math:`v_k`, pulled toward the global model the
  round started from. Per local step, on one batch :math:`\xi` (``updates`` is
  :math:`\nabla h_k(x; \xi)` and ``extra_fn`` is :math:`h_k(\cdot; \xi)`):

  .. math::

     \bar{x} &= x \quad \text{at the round's first step (the anchor)}, \\
     v_k &\leftarrow v_k - \eta_p\, (\nabla h_k(v_k; \xi) + \lambda\, (v_k - \bar{x})), \\
     x &\leftarrow x - \eta\, \nabla h_k(x; \xi),

  and every ``local_steps`` steps the server averages :math:`x`. **Choice**: the server
  mean is weighted by client sample counts (``weighting="samples"``, the default of
  :func:`fedco.fedavg`, SPEC 3's "plain FedAvg"); ``"uniform"`` is offered. The optax
  ``optimizer``, when given, replaces the *global* SGD step only; the personal step is the
  SPEC's SGD.

  Communication: only the parameters, ``d`` floats each way per sampled client per round;
  personal models are never sent. Client state ``DittoState(count, personal, anchor,
  opt_state)``: :math:`v_k` starts at the initial parameters and persists across rounds,
  also through rounds the client is not sampled in (``result.state.clients.personal``
  after :func:`fedco.simulate`, leaves ``[K, ...]``).

  Args:
    learning_rate: the global model's local SGD rate :math:`\eta > 0` or an optax schedule;
      ``None``: 0.2 (paper 001 E2).
    local_steps: local steps per round, a positive int (paper 001 E2: :math:`\tau = 5`).
    lam: the proximal weight :math:`\lambda \ge 0` (paper 001 E2: 0.1; 0 makes :math:`v_k`
      plain local SGD on the client's own loss).
    personal_lr: the personal step :math:`\eta_p > 0`; ``None``: ``learning_rate`` (0.2
      when that is ``None`` too; paper 001 uses 0.2 for both). Give it when
      ``learning_rate`` is a schedule.
    weighting: the server mean, ``"samples"`` (FedAvg's, default) or ``"uniform"``.
    optimizer: the global model's step: ``None`` (``optax.sgd(eta)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="plain"``) whose plan averages only the
    parameters.

  Raises:
    ValueError: ``lam`` is negative, a rate is not positive (also a schedule
      ``learning_rate`` without ``personal_lr``), ``weighting`` is not one of the two, or
      both ``learning_rate`` and an optax transform ``optimizer`` are given; from
      ``update``, a problem without the client loss (no ``updates`` or ``extra_fn``).

  Examples:
    One client with :math:`h(x) = \frac{1}{2}\|x - (1, 2)\|^2`, two local steps from
    :math:`x = v = 0`: the global model heads for :math:`(1, 2)`, the personal model for
    :math:`((1, 2) + \lambda \bar{x}) / (1 + \lambda) = (0.5, 1)`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> problem = fedco.problems.plain(lambda x, e: 0.5 * jnp.sum((x - e["target"]) ** 2))
    >>> batch = {"target": jnp.array([[1.0, 2.0]])}  # one example
    >>> grad_h, oracles = fedco.oracle_args(problem, batch, batch)
    >>> alg = fedco.ditto(0.5, local_steps=2, lam=1.0)
    >>> @jax.jit
    ... def local_round(x):
    ...   state = alg.init(x)
    ...   for t in range(2):
    ...     updates, state = alg.update(grad_h(x), state, x, local_step=t, **oracles)
    ...     x = optax.apply_updates(x, updates)
    ...   return x, state.personal
    >>> x, personal = local_round(jnp.zeros(2))
    >>> [round(v, 3) for v in x.tolist()], [round(v, 3) for v in personal.tolist()]
    ([0.75, 1.5], [0.5, 1.0])
  """
  _validate.positive("lam", lam, allow_zero=True)
  eta_p = personal.own_rate("personal_lr", personal_lr, learning_rate, 0.2)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.2)
  plan = extend.make_plan(local_steps, weighting=weighting)
  steps = plan.local_steps

  def init(params, *, inner_value=None):
    del inner_value
    params = extend.strong(params)
    return DittoState(jnp.zeros([], jnp.int32), params, params, opt.init(params))

  def update(updates, state, params=None, *, extra_fn=None, local_step=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "ditto")
    extend.require("extra_fn", extra_fn, "ditto")
    anchor = extend.select(
      extend.at_round_start(local_step, state.count, steps), params, state.anchor
    )
    v = state.personal
    grad_v = jax.grad(extra_fn)(v)
    personal = jax.tree.map(lambda p, g, a: p - eta_p * (g + lam * (p - a)), v, grad_v, anchor)
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, DittoState(state.count + 1, personal, anchor, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "ditto", "plain")
