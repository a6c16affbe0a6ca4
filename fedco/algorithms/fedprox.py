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

  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
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
  r"""FedProx (Li et al. 2020): FedAvg whose local steps are pulled towards the round's model.

  A baseline for **plain** problems :math:`\frac{1}{K}\sum_k h_k(x)`. Every round each
  client approximately minimises its loss plus a proximal term around the round's model
  :math:`x`,

  .. math::

    \min_y\ h_k(y) + \frac{\mu}{2}\|y - x\|^2, \qquad\text{by}\qquad
    y \leftarrow y - \eta\big(\nabla h_k(y; \xi) + \mu (y - x)\big)

  for ``local_steps`` steps from :math:`y = x`, and the server averages the clients'
  :math:`y`. With ``updates`` :math:`= \nabla h_k(y; \xi)` a local step is::

    anchor = y                                   at the round's first step (y = x there)
    y = y - eta (updates + mu (y - anchor))

  The anchor is recorded at the round's first step (:func:`fedco.extend.at_round_start`),
  so a straggler's last steps and a client sampled again rounds later use the right
  :math:`x`. :math:`\mu = 0` is FedAvg, step for step. Only the model travels (``d`` floats
  up and down per client per round). **Choices**: the paper's inexact local solver is
  ``local_steps`` SGD steps; the server mean is weighted by data sizes (the paper samples
  clients proportionally to their data and averages uniformly: this weighting in
  expectation).

  Args:
    learning_rate: the local SGD rate :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.01 (:func:`fedco.fedavg`'s).
    local_steps: local steps per round, :math:`\ge 1` (default 5).
    mu: the proximal weight :math:`\mu \ge 0` (default 0.01; 0 is FedAvg; the paper tunes
      it over ``{0.001, 0.01, 0.1, 1}``).
    weighting: the server mean, ``"samples"`` (default, as FedAvg's) or ``"uniform"``.
    optimizer: the local step on :math:`\nabla h_k + \mu (y - x)`: ``None``
      (``optax.sgd(eta)``), a factory of the learning rate (``optax.adam``) or an optax
      transform with its own rate (then no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="plain"``) that communicates only the
    model; its server averages.

  Raises:
    ValueError: if ``mu`` is negative, ``learning_rate`` is not positive, ``local_steps``
      is not a positive int, ``weighting`` is unknown, both ``learning_rate`` and an optax
      transform ``optimizer`` are given, or ``update`` gets ``updates=None``.

  Examples:
    One round of one client from :math:`x = 0` on :math:`h(y) = \frac{1}{2}\|y - a\|^2`:
    the proximal term keeps the local model nearer the round's model:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> loss = lambda y: 0.5 * jnp.sum((y - jnp.array([1.0, -2.0])) ** 2)
    >>> for mu in (0.0, 1.0):
    ...   opt = fedco.fedprox(0.1, 5, mu=mu)
    ...   y = jnp.zeros(2)
    ...   state = opt.init(y)
    ...   for _ in range(opt.plan.local_steps):
    ...     step, state = opt.update(jax.grad(loss)(y), state, y)
    ...     y = optax.apply_updates(y, step)
    ...   print(mu, [round(float(v), 4) for v in y])
    0.0 [0.4095, -0.819]
    1.0 [0.3362, -0.6723]
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
