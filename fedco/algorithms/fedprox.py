r"""FedProx (Li et al. 2020): FedAvg whose local steps see a proximal term.

On a plain problem (``updates = grad h_k(y)``). Every round each client approximately
minimises its local objective with the proximal term around the round's model ``x``::

    min_y  h_k(y) + (mu / 2) ||y - x||^2

by ``local_steps`` SGD steps from ``y = x``::

    y = y - eta (grad h_k(y; xi) + mu (y - x))

and the server averages the clients' ``y``. The anchor ``x`` is the model the round started
from: the client records it at the round's first step (:func:`fedco.extend.at_round_start`),
so a straggler's last steps and a client sampled again rounds later use the right ``x``.
``mu = 0`` is plain FedAvg, step for step.

**Choices**: the paper's inexact local solver is ``local_steps`` SGD steps (its experiments'
solver; every client does the same number, the runtime's stragglers do fewer). The server
mean is weighted by client data sizes (``weighting="samples"``, :func:`fedco.fedavg`'s
default: the paper samples clients with probability proportional to their data and
averages them uniformly, which is this weighting in expectation); ``"uniform"`` is offered.

Reference:
  Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated optimization in heterogeneous
  networks" (MLSys 2020), Algorithm 2.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import extend


class FedProxState(NamedTuple):
  """Client state: the round's model ``anchor`` (``x`` of the proximal term)."""

  count: jnp.ndarray
  anchor: Any
  opt_state: optax.OptState


@extend.register(settings={"fedprox": dict(learning_rate=0.1, mu=0.01)})
@extend.factory(static=("local_steps", "optimizer"))
def fedprox(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  mu: float = 0.01,
  weighting: str = "samples",
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  """FedProx on a plain problem (see the module docstring).

  Per local step, with ``updates = grad h_k(y; xi)``::

      anchor = y                                   at the round's first step (y = x there)
      y = y - eta (updates + mu (y - anchor))

  and the server averages ``y`` every ``local_steps`` steps.

  Args:
    learning_rate: local SGD rate ``eta > 0`` or a schedule; ``None``: 0.01
      (:func:`fedco.fedavg`'s).
    local_steps: local steps per round.
    mu: the proximal weight ``mu >= 0`` (0: FedAvg; the paper tunes it over
      ``{0.001, 0.01, 0.1, 1}``).
    weighting: the server mean, ``"samples"`` (default, as FedAvg's) or ``"uniform"``.
    optimizer: the local step on ``grad h_k + mu (y - x)``: ``None`` (``optax.sgd(eta)``), a
      factory of the learning rate (``optax.adam``) or an optax transform with its own rate
      (then no ``learning_rate``).
  """
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  mu = extend.positive("mu", mu, allow_zero=True)
  plan = extend.make_plan(local_steps, weighting=weighting)
  steps = plan.local_steps

  def init(params, *, inner_value=None):
    del inner_value
    return FedProxState(
      jnp.zeros([], jnp.int32), jax.tree.map(jnp.asarray, params), opt.init(params)
    )

  def update(updates, state, params=None, *, local_step=None, **unused):
    del unused
    extend.require("updates (the gradient of the client loss)", updates, "fedprox")
    anchor = extend.select(
      extend.at_round_start(local_step, state.count, steps), params, state.anchor
    )
    direction = jax.tree.map(lambda g, y, a: g + mu * (y - a), updates, params, anchor)
    step, opt_state = opt.update(direction, state.opt_state, params)
    return step, FedProxState(state.count + 1, anchor, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "fedprox", "plain")
