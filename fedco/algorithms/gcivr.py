r"""GCIVR (Haddadpour et al. 2022), parallel form: SARAH-type recursive estimates of the inner
value, its Jacobian and the non-compositional gradient, with an Adagrad step (SPEC 3).

Problem ``Phi(x) = h(x) + f(g(x))`` (global-inner). GCIVR keeps three estimates at the
current iterate: ``y ~ g(x)``, ``J ~ J_g(x)`` (the ``p x d`` Jacobian; ``p`` is small for the
fairness problem, ``2G + 1 = 7``) and ``v ~ grad h(x)``. With ``q`` the checkpoint period
and ``S`` a sample::

    d_t     = J_t^T grad f(y_t) + v_t
    x_{t+1} = x_t - Adagrad(d_t)
    if t mod q == 0 (checkpoint):   y_{t+1} = g(x_{t+1}; S),  J_{t+1} = J_g(x_{t+1}; S),
                                    v_{t+1} = grad h(x_{t+1}; S)
    else (SARAH / SPIDER):          y_{t+1} = y_t + g(x_{t+1}; S) - g(x_t; S)
                                    J_{t+1} = J_t + J_g(x_{t+1}; S) - J_g(x_t; S)
                                    v_{t+1} = v_t + grad h(x_{t+1}; S) - grad h(x_t; S)

(one sample ``S`` evaluated at both points; ``g`` and ``J_g`` use the step's next-inner
batch, ``grad h`` the step's outer batch).

**Parallel form** (paper 004 Sec. 6: "a parallel version of the centralized algorithms where
the overall gradient computation is K times larger"): every client evaluates its terms on
its own batch and ``y``, ``J`` and ``v`` are averaged over the clients after *every* step
(plan ``every_step = ("y", "J", "v")``), so the estimates are those of centralized GCIVR
with a batch of ``K b`` rows. The direction uses only these shared estimates, so every
client takes the same step and keeps the same ``x`` and Adagrad state; the runtime's model
averaging every ``local_steps`` steps (default 1) is then a no-op. Communication: ``p + p d
+ d`` floats per client per step, plus ``d`` per round.

**Choices** (the runtime offers no separate large-batch oracle):

* the estimates are refreshed for the *next* iterate right after the step, inside the same
  ``update``, so the runtime's every-step averaging lands before they are used;
* step 0 is the initial checkpoint: it computes ``y, J, v`` at ``x_0`` and does not move
  (GCIVR starts from a checkpoint estimate at ``x_0``);
* a checkpoint uses the step's ``K b`` rows, not the full data (GCIVR's finite-sum theory
  takes ``S`` = all ``m`` rows at checkpoints); between checkpoints the SARAH recursion
  carries the variance reduction;
* all constraints every step (GCIVR's sampling of a subset of constraints reduces to the
  full set for the ``G = 3`` groups of the fairness problem);
* Adagrad with PyTorch's defaults (the GCIVR code uses ``torch.optim.Adagrad``): zero
  initial accumulator, ``x -= lr d / sqrt(sum_t d_t^2 + eps)`` with ``eps = 1e-10``
  (``optax.adagrad(lr, initial_accumulator_value=0, eps=1e-10)``).

References:
  F. Haddadpour, M. M. Kamani, M. Mahdavi, A. Karbasi. "Learning distributionally robust
  models at scale via composite optimization", ICLR 2022 (GCIVR). J. Zhang, L. Xiao, "A
  stochastic composite gradient method with incremental variance reduction", NeurIPS 2019
  (CIVR).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree

from fedco import _validate, extend


class GCIVRState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  y: Any  # inner value estimate (the inner map's pytree)
  J: Any  # Jacobian estimate of the flattened inner value: leaves [p, *param.shape]
  v: Any  # grad h estimate, shaped like params
  opt_state: optax.OptState


def adagrad(learning_rate) -> optax.GradientTransformation:
  """Adagrad with PyTorch's defaults (zero initial accumulator, ``eps = 1e-10``)."""
  _validate.rate("learning_rate", learning_rate)
  return optax.adagrad(learning_rate, initial_accumulator_value=0.0, eps=1e-10)


@extend.register(settings={"gcivr": dict(learning_rate=0.1, refresh_every=5)})
@extend.factory(static=("local_steps", "refresh_every", "optimizer"))
def gcivr(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 1,
  *,
  refresh_every: int = 10,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""GCIVR (Haddadpour et al. 2022), parallel form: recursive estimates and an Adagrad step.

  A baseline of paper 004 (E6, fairness on Adult) for the **global-inner** problem
  :math:`\Phi(x) = h(x) + f(g(x))`, :math:`g = \frac{1}{K}\sum_k g_k`. It keeps three
  estimates at the current iterate, :math:`y \approx g(x)`, :math:`J \approx J_g(x)` (the
  ``p x d`` Jacobian; ``p = 2G + 1 = 7`` on the fairness problem) and :math:`v \approx
  \nabla h(x)`, and with checkpoint period :math:`q` and one sample :math:`S` evaluated at
  both points:

  .. math::

    d_t &= J_t^\top \nabla f(y_t) + v_t, \qquad x_{t+1} = x_t - \mathrm{Adagrad}(d_t), \\
    y_{t+1} &= g(x_{t+1}; S), \ J_{t+1} = J_g(x_{t+1}; S), \
      v_{t+1} = \nabla h(x_{t+1}; S) \quad \text{if } t \bmod q = 0, \\
    y_{t+1} &= y_t + g(x_{t+1}; S) - g(x_t; S) \ \text{(and alike for } J, v)
      \quad \text{otherwise (SARAH)}.

  **Parallel form** (paper 004 Sec. 6): every client evaluates its terms on its own batch
  and ``y``, ``J`` and ``v`` are averaged over the clients after *every* step, so they are
  centralized GCIVR's estimates on ``K b`` rows; every client then takes the same step and
  model averaging is a no-op. Communication: ``p + p d + d`` floats per client per step,
  plus ``d`` per round. **Choices** (module docstring): step 0 only computes the estimates
  at :math:`x_0` (it does not move); a checkpoint uses the step's ``K b`` rows, not the
  full data; all constraints every step; Adagrad with PyTorch's defaults (zero initial
  accumulator, ``eps = 1e-10``), as GCIVR's code. E6 runs it with GCIVR's settings:
  rate 0.01, :math:`q = 10`, one local step.

  Args:
    learning_rate: the Adagrad rate :math:`> 0` (a number or an optax schedule); ``None``:
      0.01 (GCIVR's code).
    local_steps: steps between model averaging (default 1; a no-op for GCIVR, whose
      clients stay in step; kept for the runtime's round structure).
    refresh_every: :math:`q \ge 1`, steps between checkpoint (fresh) estimates (default
      10); 1 is plain mini-batch compositional Adagrad.
    optimizer: the parameter step: ``None`` (the Adagrad above), a factory of the learning
      rate or an optax transform with its own rate (then no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="global"``) whose plan averages ``y``,
    ``J`` and ``v`` after every step (``every_step=("y", "J", "v")``).

  Raises:
    ValueError: if ``refresh_every`` or ``local_steps`` is not a positive int,
      ``learning_rate`` is not positive, or both ``learning_rate`` and an optax transform
      ``optimizer`` are given.

  Examples:
    One client at E6's settings on the mean-variance portfolio: step 0 only estimates
    (the objective stays 0), then the objective falls. GCIVR's update takes Jacobians, so
    the step is jitted (the trackers are filled first, for a fixed state structure):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.gcivr(0.01, 1, refresh_every=10)
    >>> opt.plan.every_step
    ('y', 'J', 'v')
    >>> problem = fedco.problems.portfolio(lam=1.0)
    >>> batch = {"r": jnp.array([[1.0, 0.5], [0.6, -0.2], [0.2, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> objective = lambda x: oracles["outer_fn"](oracles["inner_fn"](x))
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x, inner_value=oracles["inner_fn"](x))
    >>> update = jax.jit(lambda x, state: opt.update(None, state, x, **oracles))
    >>> for _ in range(4):
    ...   step, state = update(x, state)
    ...   x = optax.apply_updates(x, step)
    ...   print(f"{float(objective(x)):.4f}")
    0.0000
    -0.0103
    -0.0176
    -0.0235
  """
  q = _validate.positive_int("refresh_every", refresh_every)
  opt = extend.param_optimizer(
    learning_rate, adagrad if optimizer is None else optimizer, default=0.01
  )
  plan = extend.make_plan(local_steps, every_step=("y", "J", "v"), at_init=("y", "J", "v"))

  def init(params, *, inner_value=None):
    params = extend.strong(params)
    y = extend.pending_or(inner_value, lambda v: v)
    J = extend.Pending("inner_jacobian")
    if inner_value is not None:
      J = extend.init_trackers(J, params, y)
    v = jax.tree.map(jnp.zeros_like, params)
    return GCIVRState(jnp.zeros([], jnp.int32), y, J, v, opt.init(params))

  def update(
    updates,
    state,
    params=None,
    *,
    inner_fn=None,
    outer_fn=None,
    next_inner_fn=None,
    extra_fn=None,
    **unused,
  ):
    del updates, unused  # the direction uses the shared estimates only
    inner_fn, outer_fn, next_inner_fn = extend.oracles("gcivr", inner_fn, outer_fn, next_inner_fn)
    state = extend.fill_pending(state, params, inner_fn)
    flat_inner = lambda x: ravel_pytree(next_inner_fn(x))[0]
    grad_f, _ = ravel_pytree(jax.grad(outer_fn)(state.y))
    direction = jax.tree.map(lambda j, v: jnp.tensordot(grad_f, j, axes=1) + v, state.J, state.v)
    step, opt_state = opt.update(direction, state.opt_state, params)
    first = state.count == 0
    step = jax.tree.map(lambda s: jnp.where(first, jnp.zeros_like(s), s), step)
    opt_state = extend.select(first, state.opt_state, opt_state)
    new_params = optax.apply_updates(params, step)

    refresh = state.count % q == 0

    def recurse(old, at_new, at_old):
      return extend.select(
        refresh, at_new, jax.tree.map(lambda a, n, o: a + n - o, old, at_new, at_old)
      )

    y = recurse(state.y, next_inner_fn(new_params), next_inner_fn(params))
    J = recurse(state.J, jax.jacrev(flat_inner)(new_params), jax.jacrev(flat_inner)(params))
    if extra_fn is None:
      v = state.v
    else:
      grad_h = jax.grad(extra_fn)
      v = recurse(state.v, grad_h(new_params), grad_h(params))
    return step, GCIVRState(state.count + 1, y, J, v, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "gcivr", "global")
