"""FedDRO and DS-FedDRO (paper 004, Algorithms 2 and 3): global-inner federated CO.

FedDRO, per step and client (``y_bar`` is shared by all clients)::

    z = grad h_k(x_k; xi) + J_{g_k}(x_k; zeta)^T grad f(y_bar)
    x_k_new = x_k - eta z
    y_k = (1 - beta)(y_bar - g_k(x_k; zeta')) + g_k(x_k_new; zeta')     (hybrid, one zeta')
    y_bar = mean_k y_k, sent to every client                              (every step)
    if (t + 1) mod I == 0:  x_k = mean_k x_k                               (every round)

Init (Choice, SPEC 2.5): ``x_k = x_bar_0``; ``y_bar_0`` is the mean over clients of one
mini-batch ``g_k(x_bar_0)``. Sends ``p`` floats every step and ``d`` every ``I`` steps.

DS-FedDRO, per step and client (Choice, SPEC 2.6: the gradient uses the client's own ``y_k``,
since nothing is shared between syncs)::

    z = grad h_k(x_k; xi) + J_{g_k}(x_k; zeta)^T grad f(y_k)
    x_k = x_k - eta z
    y_k = (1 - beta) y_k + beta g_k(x_k; zeta')                           (at the new iterate)

and every ``I`` steps the server applies SGD to the pseudo-gradients (two-sided rates)::

    x = x - gamma_x mean_k (x - x_k),    y = y - gamma_y mean_k (y - y_k),

after which every client restarts from ``(x, y)``. Sends ``d + p`` floats per round only.

Theory: FedDRO ``eta = O(sqrt(K/T))``, ``beta = c eta``, ``I = O(T^(1/4)/K^(3/4))``.
The theorems return ``x_bar`` at a uniformly random step; the runtime reports the last
average and keeps a uniformly random round's average as ``random_params``.

References:
  Khanduri et al., "On federated compositional optimization: algorithms, analysis, and
  guarantees" (paper 004; also 002).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators
from fedco.algorithms import base


class FedDROState(NamedTuple):
  count: jnp.ndarray
  y: Any
  opt_state: optax.OptState


@base.register(settings={"feddro": dict(learning_rate=0.1, beta=0.5)})
@base.factory(static=("local_steps", "optimizer"))
def feddro(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.5,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """FedDRO (paper 004, Algorithm 2).

  Args:
    learning_rate: ``eta > 0`` or a schedule; ``None``: 0.05.
    local_steps: ``I``, steps between model averaging.
    beta: hybrid-tracker momentum in ``(0, 1]``.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the
      learning rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  ``init(params)`` leaves ``y`` pending; the first ``update`` sets ``y = g(x_0; zeta_0)``
  (the runtime sets every client's ``y`` to ``y_bar_0`` instead, SPEC 2.5).
  """
  _validate.open_unit("beta", beta, closed_right=True)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.05)
  tracker = estimators.hybrid(beta)
  plan = base.make_plan(local_steps, every_step=("y",), at_init=("y",))

  def init(params, *, inner_value=None):
    y = base.pending_or(inner_value, tracker.init)
    return FedDROState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, next_inner_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = base.oracles("feddro", inner_fn, outer_fn, next_inner_fn)
    state = base.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    new_params = optax.apply_updates(params, step)
    y = tracker.update(state.y, next_inner_fn(new_params), next_inner_fn(params))
    return step, FedDROState(state.count + 1, y, opt_state)

  return base.Algorithm(init, update, plan, base.averaging_server(), "feddro", "global")


@base.register(settings={"ds_feddro": dict(learning_rate=0.1, beta=0.5)})
@base.factory(static=("local_steps", "optimizer"))
def ds_feddro(
  learning_rate: Optional[base.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.5,
  server_lr_x: float = 1.3,
  server_lr_y: float = 1.4,
  optimizer: base.Optimizer = None,
) -> base.Algorithm:
  """DS-FedDRO (paper 004, Algorithm 3): two-sided learning rates, nothing sent between rounds.

  Args:
    learning_rate: local ``eta > 0`` or a schedule; ``None``: 0.05.
    local_steps: ``I``.
    beta: moving-average rate in ``(0, 1]``.
    server_lr_x: ``gamma_x > 0`` (paper: 1.3).
    server_lr_y: ``gamma_y > 0`` (paper: 1.4).
    optimizer: the local parameter step, as in :func:`feddro`.
  """
  _validate.open_unit("beta", beta, closed_right=True)
  _validate.positive("server_lr_x", server_lr_x)
  _validate.positive("server_lr_y", server_lr_y)
  opt = base.param_optimizer(learning_rate, optimizer, default=0.05)
  tracker = estimators.moving_average(beta)
  plan = base.make_plan(local_steps, every_round=("y",), at_init=("y",))
  server = optax.multi_transform(
    {"x": optax.sgd(server_lr_x), "y": optax.sgd(server_lr_y)},
    lambda tree: {
      k: jax.tree.map(lambda _, k=k: "x" if k == "params" else "y", v) for k, v in tree.items()
    },
  )

  def init(params, *, inner_value=None):
    y = base.pending_or(inner_value, tracker.init)
    return FedDROState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, next_inner_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = base.oracles("ds_feddro", inner_fn, outer_fn, next_inner_fn)
    state = base.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = base.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    y = tracker.update(state.y, next_inner_fn(optax.apply_updates(params, step)), None)
    return step, FedDROState(state.count + 1, y, opt_state)

  return base.Algorithm(init, update, plan, server, "ds_feddro", "global")
