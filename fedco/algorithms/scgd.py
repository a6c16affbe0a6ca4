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

from typing import Any, NamedTuple

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


def local_scgd(learning_rate=0.01, gamma=0.9, local_steps: int = 5, *,
               optimizer=None) -> base.Algorithm:
  """Local-SCGD: moving-average tracker ``u`` with rate ``gamma``, ``x`` and ``u`` averaged.

  Args:
    learning_rate: ``eta > 0``.
    gamma: tracker rate in ``(0, 1]``.
    local_steps: ``p``, steps between averaging.
    optimizer: optional optax transform for the parameter step (default ``sgd(eta)``).
  """
  _validate.open_unit("gamma", gamma, closed_right=True)
  opt = base.param_optimizer(learning_rate, optimizer)
  tracker = estimators.moving_average(gamma)
  plan = base.make_plan(local_steps, every_round=("u",))

  def init(params, *, inner_value=None):
    u = tracker.init(base.require_inner_value(inner_value, "local_scgd"))
    return SCGDState(jnp.zeros([], jnp.int32), u, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("local_scgd", inner_fn, outer_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = tracker.update(state.u, sample, None)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, SCGDState(state.count + 1, u, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "local_scgd", "local")


def local_scgdm(learning_rate=1.0, beta=0.01, alpha=0.8, gamma=0.7, local_steps: int = 5, *,
                optimizer=None) -> base.Algorithm:
  """Local-SCGDM (paper 003, Algorithm 1).

  Args:
    learning_rate: ``eta > 0``.
    beta: ``beta > 0``; the parameter step is ``x = x - beta eta m``.
    alpha: momentum rate, ``alpha * eta`` in ``(0, 1)``.
    gamma: tracker rate, ``gamma * eta`` in ``(0, 1)``.
    local_steps: ``p``, steps between averaging ``u``, ``m`` and ``x``.
    optimizer: optional optax transform that receives ``m``; default ``sgd(beta * eta)``.
      ``eta`` still sets the tracker and momentum rates.

  Paper settings: sinusoid ``eta=1, beta=0.01, alpha=0.8, gamma=0.7, p=5``; Omniglot
  ``eta=1, beta=0.1, alpha=0.9, gamma=0.99``.
  """
  _validate.positive("learning_rate", learning_rate)
  _validate.positive("beta", beta)
  _validate.open_unit("alpha * learning_rate", _product(alpha, learning_rate))
  _validate.open_unit("gamma * learning_rate", _product(gamma, learning_rate))
  if optimizer is None:
    optimizer = optax.sgd(_product(beta, learning_rate))
  opt = base.param_optimizer(None, optimizer)
  a_rate = _product(alpha, learning_rate)
  g_rate = _product(gamma, learning_rate)
  plan = base.make_plan(local_steps, every_round=("u", "m"))

  def init(params, *, inner_value=None):
    u = base.require_inner_value(inner_value, "local_scgdm")
    m = jax.tree.map(jnp.zeros_like, params)
    return SCGDMState(jnp.zeros([], jnp.int32), u, m, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = base.oracles("local_scgdm", inner_fn, outer_fn)
    first = state.count == 0
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = base.select(first, sample, estimators.moving_average(g_rate).update(state.u, sample))
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    m = base.select(first, z, jax.tree.map(lambda a, b: (1 - a_rate) * a + a_rate * b,
                                           state.m, z))
    step, opt_state = opt.update(m, state.opt_state, params)
    return step, SCGDMState(state.count + 1, u, m, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "local_scgdm", "local")


def _product(a, b):
  if isinstance(a, (bool, str, type(None))) or isinstance(b, (bool, str, type(None))):
    raise ValueError(f"hyperparameters must be numbers, got {a!r} and {b!r}")
  return a * b
