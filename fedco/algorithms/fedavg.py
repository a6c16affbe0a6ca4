"""FedAvg: plain (for ordinary problems) and for compositional problems (paper 004, Alg. 1).

Plain FedAvg runs local SGD on the client loss ``h_k`` and the server averages the models,
weighted by sample counts (``weighting="samples"``) or uniformly.

FedAvg for compositional problems (the failing baseline of paper 004): each client keeps
``x_k`` and a local inner value ``y_k = g_k(x_k)`` and steps::

    x_k = x_k - eta (J_{g_k}(x_k)^T grad f(y_k) + grad h_k(x_k)),    y_k = g_k(x_k)

(the new ``y_k`` is evaluated on an independent sample ``zeta'`` at the new iterate). All
clients start from ``(x_bar_0, y_bar_0)``. Every ``I`` steps the models are averaged and

* Case I:   ``y_k = g_k(x_bar)`` (recomputed on the next step's sample, at ``x_bar``);
* Case II:  ``y_k = y_bar = mean_k y_k``;
* modified (Theorem 4.2): ``y_k = y_bar`` after *every* step.

Theorem 4.1: Cases I and II do not converge to a stationary point of ``Phi`` for ``I > 1``.
Minibatch SGD for CO (MBSGD, SPEC 2.7) syncs ``y_bar = mean_k g_k(x)`` before every step.

References:
  McMahan et al. 2017 (FedAvg); paper 004, Algorithm 1 and Theorems 4.1-4.2.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax.numpy as jnp
import optax

from fedco import _validate, estimators, extend

_CASES = ("I", "II", "modified")


class FedAvgState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  opt_state: optax.OptState


class FedAvgCOState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  y: Any
  opt_state: optax.OptState


@extend.register(settings={"fedavg": dict(learning_rate=0.1)})
@extend.factory(static=("local_steps", "optimizer"))
def fedavg(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedAvg (McMahan et al. 2017): local SGD on the client loss, then model averaging.

  The baseline for **plain** (non-compositional) problems :math:`\frac{1}{K}\sum_k h_k(x)`:
  it steps on ``updates`` :math:`= \nabla h_k(x; \xi)` alone (no oracles). Each round the
  sampled clients start from the server model :math:`\bar x` and take :math:`\tau` local
  steps, then the server averages:

  .. math::

    x_k \leftarrow x_k - \eta \nabla h_k(x_k; \xi) \ \ (\tau \text{ times}), \qquad
    \bar x = \sum_k w_k x_k,

  with :math:`w_k = n_k / \sum_j n_j` over the round's clients (``weighting="samples"``,
  the default) or :math:`1/m` (``"uniform"``). Only the model travels, ``d`` floats up and
  down per client per round. The papers' experiments use it as a baseline: E1 (paper
  000/001) :math:`\tau = 5`, :math:`\eta = 0.01`; E2 :math:`\eta = 0.1` with one
  fine-tuning step before evaluation. q-FedAvg with ``q = 0`` is FedAvg.

  Args:
    learning_rate: the local SGD rate :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.01.
    local_steps: :math:`\tau \ge 1`, local steps per round (default 5).
    weighting: the server's mean, ``"samples"`` (weighted by client data sizes, default) or
      ``"uniform"``.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``) that communicates only the
    model; its server averages.

  Raises:
    ValueError: if ``learning_rate`` is not positive, ``local_steps`` is not a positive
      int, ``weighting`` is not ``"samples"`` or ``"uniform"``, both ``learning_rate`` and
      an optax transform ``optimizer`` are given, or ``update`` gets ``updates=None``.

  Examples:
    One client's local steps at E1's settings on :math:`h(x) = \frac{1}{2}\|x - a\|^2`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.fedavg(0.01, 5)
    >>> opt.problem_kind, opt.plan.weighting, opt.plan.fields  # only the model is sent
    ('plain', 'samples', ())
    >>> loss = lambda x: 0.5 * jnp.sum((x - jnp.array([1.0, -2.0])) ** 2)
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x)
    >>> for _ in range(opt.plan.local_steps):
    ...   step, state = opt.update(jax.grad(loss)(x), state, x)
    ...   x = optax.apply_updates(x, step)
    >>> print(round(float(loss(x)), 4))  # from 2.5
    2.261
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = extend.make_plan(local_steps, weighting=weighting)

  def init(params, *, inner_value=None):
    del inner_value
    return FedAvgState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(updates, state, params=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "fedavg")
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, FedAvgState(state.count + 1, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "fedavg", "plain")


@extend.register(
  settings={
    f"fedavg_co_{case}": dict(learning_rate=0.1, case=case) for case in ("I", "II", "modified")
  }
)
@extend.factory(static=("local_steps", "optimizer"))
def fedavg_co(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  case: str = "II",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedAvg on global-inner compositional problems (paper 004, Algorithm 1): the failing baseline.

  On the **global-inner** problem :math:`\Phi(x) = h(x) + f(g(x))`,
  :math:`g = \frac{1}{K}\sum_k g_k`, each client keeps :math:`x_k` and a *local* inner value
  :math:`y_k` and steps

  .. math::

    x_k \leftarrow x_k - \eta \big(J_{g_k}(x_k; \zeta)^\top \nabla f(y_k; \xi)
      + \nabla h_k(x_k; \xi)\big), \qquad y_k \leftarrow g_k(x_k; \zeta'),

  the new :math:`y_k` on an independent sample at the new iterate. All clients start from
  :math:`(\bar x_0, \bar y_0)`. Every :math:`I` steps the models are averaged,
  :math:`x_k = \bar x`, and

  * Case I (``case="I"``): :math:`y_k = g_k(\bar x)` (recomputed at the round's first step,
    on that step's sample);
  * Case II (``case="II"``, the paper's FedAvg baseline in its experiments):
    :math:`y_k = \bar y = \frac{1}{K}\sum_k y_k`;
  * modified (``case="modified"``, Theorem 4.2): :math:`y_k = \bar y` after *every* step.

  Theorem 4.1: Cases I and II do not converge to a stationary point of :math:`\Phi` for
  :math:`I > 1`, because :math:`\nabla f(y_k)` of a client's own inner value is not
  :math:`\nabla f(g(x))`; E7 shows this on a two-client instance beside :func:`feddro`
  converging. Communication per client: the model every round, plus ``y`` (``p`` floats)
  once a round in Case II and after every step in the modified case. The algorithm's
  ``name`` is ``"fedavg_co_case1"``, ``"fedavg_co_case2"`` or ``"fedavg_co_modified"``.

  Args:
    learning_rate: the local step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.05.
    local_steps: :math:`I \ge 1`, local steps per round (default 5; E5 runs Case II with 5).
    case: ``"I"``, ``"II"`` (default) or ``"modified"``, as above.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="global"``) whose plan starts every
    client from :math:`\bar y_0` (``at_init=("y",)``) and shares ``y`` as the case says.

  Raises:
    ValueError: if ``case`` is not one of the three, ``learning_rate`` is not positive,
      ``local_steps`` is not a positive int, or both ``learning_rate`` and an optax
      transform ``optimizer`` are given.

  Examples:
    The three cases differ only in when ``y`` is shared:

    >>> import fedco
    >>> for case in ("I", "II", "modified"):
    ...   opt = fedco.fedavg_co(0.05, 5, case=case)
    ...   print(opt.name, opt.plan.every_step, opt.plan.every_round)
    fedavg_co_case1 () ()
    fedavg_co_case2 () ('y',)
    fedavg_co_modified ('y',) ()
  """
  _validate.one_of("case", case, _CASES)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.05)
  period = _validate.positive_int("local_steps", local_steps)
  if case == "I":
    plan = extend.make_plan(period, at_init=("y",))
  elif case == "II":
    plan = extend.make_plan(period, every_round=("y",), at_init=("y",))
  else:
    plan = extend.make_plan(period, every_step=("y",), at_init=("y",))
  name = {"I": "fedavg_co_case1", "II": "fedavg_co_case2", "modified": "fedavg_co_modified"}[case]

  def init(params, *, inner_value=None):
    y = extend.pending_or(inner_value, lambda v: v)
    return FedAvgCOState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(
    updates,
    state,
    params=None,
    *,
    inner_fn=None,
    outer_fn=None,
    next_inner_fn=None,
    local_step=None,
    **unused,
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = extend.oracles(name, inner_fn, outer_fn, next_inner_fn)
    state = extend.fill_pending(state, params, inner_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    y = state.y
    if case == "I":  # after averaging, y_k = g_k(x_bar): refresh at the round's first step
      # keyed on the runtime's local step (a straggler's count lags); count in a user loop
      first = extend.at_round_start(local_step, state.count, period)
      y = extend.select(first & (state.count > 0), sample, y)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    y_new = next_inner_fn(optax.apply_updates(params, step))
    return step, FedAvgCOState(state.count + 1, y_new, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), name, "global")


class MBSGDState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  y: Any
  opt_state: optax.OptState


@extend.register(settings={"mbsgd": dict(learning_rate=0.1)})
@extend.factory(static=("optimizer",))
def mbsgd(
  learning_rate: Optional[extend.ScalarOrSchedule] = None, *, optimizer: extend.Optimizer = None
) -> extend.Algorithm:
  r"""Minibatch SGD for compositional problems (MBSGD, SPEC 2.7): one synchronised step a round.

  A baseline of paper 004 for the **global-inner** problem :math:`\Phi(x) = h(x) + f(g(x))`,
  :math:`g = \frac{1}{K}\sum_k g_k` (Ghadimi & Lan's minibatch SGD, customised for CO).
  Every round is one step at the server model :math:`x`:

  .. math::

    \bar y = \frac{1}{K}\sum_k g_k(x; \zeta_k), \qquad
    z_k = J_{g_k}(x; \zeta_k')^\top \nabla f(\bar y) + \nabla h_k(x), \qquad
    x \leftarrow x - \eta \frac{1}{K}\sum_k z_k.

  ``y`` is a ``round_start`` field of the plan: at the start of every round the runtime has
  each client evaluate :math:`g_k` at the server model on a fresh batch and sets ``y`` to
  the mean before the step; averaging the one-step models :math:`x - \eta z_k` is the step
  on :math:`\bar z`. This is :func:`feddro` with :math:`I = 1` and a fresh ``y``.
  Communication per client per round: ``p`` floats up and down for :math:`\bar y`, then the
  model. In a user's own loop the caller plays the server: set
  ``state = fedco.algorithms.set_fields(state, y=y_bar)`` (e.g. ``inner_fn(params)``)
  before each ``update``. The paper's experiments (E5) tune :math:`\eta` over
  ``{0.001, 0.01, 0.05, 0.1}`` with batches of 16 per client.

  Args:
    learning_rate: the step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.05.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="global"``) with one local step per round
    and ``round_start=("y",)``.

  Raises:
    ValueError: if ``learning_rate`` is not positive, or both ``learning_rate`` and an
      optax transform ``optimizer`` are given.

  Examples:
    The caller sets :math:`\bar y` before each step (here one client: :math:`\bar y =
    g(x)`) on the mean-variance portfolio:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.mbsgd(0.05)
    >>> opt.plan.local_steps, opt.plan.round_start
    (1, ('y',))
    >>> problem = fedco.problems.portfolio(lam=1.0)
    >>> batch = {"r": jnp.array([[1.0, 0.5], [0.6, -0.2], [0.2, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> inner_fn, outer_fn = oracles["inner_fn"], oracles["outer_fn"]
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x, inner_value=inner_fn(x))
    >>> for _ in range(3):
    ...   state = fedco.algorithms.set_fields(state, y=inner_fn(x))  # the server's y_bar
    ...   step, state = opt.update(None, state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    ...   print(f"{float(outer_fn(inner_fn(x))):.4f}")
    -0.0273
    -0.0540
    -0.0803
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.05)
  plan = extend.make_plan(1, round_start=("y",), at_init=("y",))

  def init(params, *, inner_value=None):
    y = extend.pending_or(inner_value, lambda v: v)
    return MBSGDState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("mbsgd", inner_fn, outer_fn)
    state = extend.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, MBSGDState(state.count + 1, state.y, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "mbsgd", "global")
