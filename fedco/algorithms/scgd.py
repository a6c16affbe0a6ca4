"""Local-SCGD and Local-SCGDM (paper 003): local-inner with moving-average trackers.

Local-SCGD (baseline), per step::

    u = (1 - gamma) u + gamma g(x; zeta)
    z = J_g(x; zeta)^T grad f(u; xi) + grad h(x)
    x = x - eta z

and every ``p`` steps ``x`` and ``u`` are averaged over clients.

Local-SCGDM (Algorithm 1), per client::

    step 0:   u = g(x; zeta);  z = J_g(x; zeta)^T grad f(u; xi);  m = z
    step t>0: u = (1 - gamma eta) u + gamma eta g(x; zeta)
              z = J_g(x; zeta)^T grad f(u; xi)
              m = (1 - alpha eta) m + alpha eta z
    every step: x = x - beta eta m
    if (t + 1) mod p == 0: average u, m and x over all clients (three things are sent).

References:
  Gao et al., "Local stochastic compositional gradient descent with momentum" (paper 003).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators
from fedco.algorithms import base


class SCGDState(NamedTuple):
  count: jnp.ndarray
  u: Any
  opt_state: optax.OptState


class SCGDMState(NamedTuple):
  count: jnp.ndarray
  u: Any
  m: Any
  opt_state: optax.OptState


@base.register(settings={"local_scgd": dict(learning_rate=0.1, gamma=0.9)})
@base.factory(static=("local_steps", "optimizer"))
def local_scgd(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  gamma: float = 0.9,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """Local-SCGD: moving-average tracker ``u`` with rate ``gamma``, ``x`` and ``u`` averaged.

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.01.
    local_steps: ``p``, steps between averaging.
    gamma: tracker rate in ``(0, 1]``.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).
  """
  _validate.open_unit("gamma", gamma, closed_right=True)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.01)
  tracker = estimators.moving_average(gamma)
  plan = base.make_plan(local_steps, every_round=("u",), at_init=("u",))

  def init(params, *, inner_value=None):
    u = base.pending_or(inner_value, tracker.init)
    return SCGDState(jnp.zeros([], jnp.int32), u, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("local_scgd", inner_fn, outer_fn)
    state = base.fill_pending(state, params, inner_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = tracker.update(state.u, sample, None)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, SCGDState(state.count + 1, u, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "local_scgd", "local")


@base.register(settings={"local_scgdm": dict(learning_rate=1.0, beta=0.1, alpha=0.8, gamma=0.7)})
@base.factory(static=("local_steps", "optimizer"))
def local_scgdm(
  learning_rate: base.ScalarOrSchedule = 1.0,
  local_steps: int = 5,
  *,
  beta: float = 0.01,
  alpha: float = 0.8,
  gamma: float = 0.7,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """Local-SCGDM (paper 003, Algorithm 1).

  Args:
    learning_rate: ``eta > 0``; it also sets the tracker and momentum rates
      ``gamma * eta`` and ``alpha * eta``, so it is used with any ``optimizer``.
    local_steps: ``p``, steps between averaging ``u``, ``m`` and ``x``.
    beta: ``beta > 0``; the parameter step is ``x = x - beta eta m``.
    alpha: momentum rate, ``alpha * eta`` in ``(0, 1)``.
    gamma: tracker rate, ``gamma * eta`` in ``(0, 1)``.
    optimizer: the step that receives ``m``: ``None`` (``sgd(beta * eta)``), a factory of
      the rate (called with ``beta * eta``) or an optax transform with its own rate.

  Paper settings: sinusoid ``eta=1, beta=0.01, alpha=0.8, gamma=0.7, p=5``; Omniglot
  ``eta=1, beta=0.1, alpha=0.9, gamma=0.99``.
  """
  _validate.positive("learning_rate", learning_rate)
  _validate.positive("beta", beta)
  _validate.positive("alpha", alpha)
  _validate.positive("gamma", gamma)
  a_rate = _validate.open_unit("alpha * learning_rate", alpha * learning_rate)
  g_rate = _validate.open_unit("gamma * learning_rate", gamma * learning_rate)
  opt = base.param_optimizer(beta * learning_rate, optimizer, default=1.0, shared_rate=True)
  plan = base.make_plan(local_steps, every_round=("u", "m"), at_init=("u", "m"))

  def init(params, *, inner_value=None):
    u = base.pending_or(inner_value, lambda v: v)
    m = jax.tree.map(jnp.zeros_like, base.strong(params))
    return SCGDMState(jnp.zeros([], jnp.int32), u, m, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("local_scgdm", inner_fn, outer_fn)
    state = base.fill_pending(state, params, inner_fn)
    first = state.count == 0
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = base.select(first, sample, estimators.moving_average(g_rate).update(state.u, sample))
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    m = base.select(first, z, jax.tree.map(lambda a, b: (1 - a_rate) * a + a_rate * b, state.m, z))
    step, opt_state = opt.update(m, state.opt_state, params)
    return step, SCGDMState(state.count + 1, u, m, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "local_scgdm", "local")
