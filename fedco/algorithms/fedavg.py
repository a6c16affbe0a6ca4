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

from fedco import _validate, estimators
from fedco.algorithms import base

_CASES = ("I", "II", "modified")


class FedAvgState(NamedTuple):
  count: jnp.ndarray
  opt_state: optax.OptState


class FedAvgCOState(NamedTuple):
  count: jnp.ndarray
  y: Any
  opt_state: optax.OptState


@base.register(settings={"fedavg": dict(learning_rate=0.1)})
@base.factory(static=("local_steps", "optimizer"))
def fedavg(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  weighting: str = "samples",
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """Plain FedAvg on a non-compositional problem (steps on ``updates = grad h``).

  Args:
    learning_rate: local SGD rate ``> 0`` or a schedule; ``None``: 0.01.
    local_steps: local steps per round.
    weighting: ``"samples"`` (server mean weighted by client data sizes) or ``"uniform"``.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = base.make_plan(local_steps, weighting=weighting)

  def init(params, *, inner_value=None):
    del inner_value
    return FedAvgState(jnp.zeros([], jnp.int32), opt.init(params))

  def update(updates, state, params=None, **unused):
    del unused
    base.require("updates (the gradient of the client loss)", updates, "fedavg")
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, FedAvgState(state.count + 1, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "fedavg", "plain")


@base.register(
  settings={
    f"fedavg_co_{case}": dict(learning_rate=0.1, case=case) for case in ("I", "II", "modified")
  }
)
@base.factory(static=("local_steps", "optimizer"))
def fedavg_co(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  case: str = "II",
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """FedAvg for global-inner compositional problems, Cases I, II and modified (paper 004).

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.05.
    local_steps: ``I``.
    case: ``"I"``, ``"II"`` or ``"modified"`` (see the module docstring).
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  _validate.one_of("case", case, _CASES)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.05)
  period = _validate.positive_int("local_steps", local_steps)
  if case == "I":
    plan = base.make_plan(period, at_init=("y",))
  elif case == "II":
    plan = base.make_plan(period, every_round=("y",), at_init=("y",))
  else:
    plan = base.make_plan(period, every_step=("y",), at_init=("y",))
  name = {"I": "fedavg_co_case1", "II": "fedavg_co_case2", "modified": "fedavg_co_modified"}[case]

  def init(params, *, inner_value=None):
    y = base.pending_or(inner_value, lambda v: v)
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
    inner_fn, outer_fn, next_inner_fn = base.oracles(name, inner_fn, outer_fn, next_inner_fn)
    state = base.fill_pending(state, params, inner_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    y = state.y
    if case == "I":  # after averaging, y_k = g_k(x_bar): refresh at the round's first step
      # keyed on the runtime's local step (a straggler's count lags); count in a user loop
      first = base.at_round_start(local_step, state.count, period)
      y = base.select(first & (state.count > 0), sample, y)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    y_new = next_inner_fn(optax.apply_updates(params, step))
    return step, FedAvgCOState(state.count + 1, y_new, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), name, "global")


class MBSGDState(NamedTuple):
  count: jnp.ndarray
  y: Any
  opt_state: optax.OptState


@base.register(settings={"mbsgd": dict(learning_rate=0.1)})
@base.factory(static=("optimizer",))
def mbsgd(
  learning_rate: Optional[base.ScalarOrSchedule] = None, *, optimizer: base.Optimizer = None
) -> base.Algorithm:
  """Minibatch SGD for CO (SPEC 2.7), one step per round::

      y_bar = mean_k g_k(x; zeta_k)                   (clients evaluate, server averages)
      z_k = J_{g_k}(x; zeta_k')^T grad f(y_bar) + grad h_k(x)
      x = x - eta mean_k z_k                          (server averages)

  ``y`` is a ``round_start`` field of the plan: at the start of every round the runtime has
  each client evaluate ``g_k`` at the server model and sets ``y`` to the mean, before the
  step. Averaging the one-step models ``x - eta z_k`` is ``x - eta z_bar``. This is FedDRO
  with ``I = 1`` and a fresh ``y``. In a user's own loop the caller plays the server: set
  ``state = fedco.algorithms.set_fields(state, y=y_bar)`` (e.g. ``inner_fn(params)``) before
  each ``update``.

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.05.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  opt = base.param_optimizer(learning_rate, optimizer, default=0.05)
  plan = base.make_plan(1, round_start=("y",), at_init=("y",))

  def init(params, *, inner_value=None):
    y = base.pending_or(inner_value, lambda v: v)
    return MBSGDState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("mbsgd", inner_fn, outer_fn)
    state = base.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, MBSGDState(state.count + 1, state.y, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "mbsgd", "global")
