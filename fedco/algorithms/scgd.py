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

from fedco import _validate, estimators, extend


class SCGDState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  u: Any
  opt_state: optax.OptState


class SCGDMState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  u: Any
  m: Any
  opt_state: optax.OptState


@extend.register(settings={"local_scgd": dict(learning_rate=0.1, gamma=0.9)})
@extend.factory(static=("local_steps", "optimizer"))
def local_scgd(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  gamma: float = 0.9,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Local-SCGD (the baseline of paper 003): local steps with a moving-average inner tracker.

  Solves the **local-inner** problem :math:`F(x) = \frac{1}{K}\sum_k [f_k(g_k(x)) +
  h_k(x)]` (MAML's meta-learning in paper 003). Each client tracks its inner value with a
  moving average :math:`u` and steps

  .. math::

    u \leftarrow (1 - \gamma)\, u + \gamma\, g_k(x; \zeta), \qquad
    z = J_{g_k}(x; \zeta)^\top \nabla f_k(u; \xi) + \nabla h_k(x), \qquad
    x \leftarrow x - \eta z,

  and every :math:`p` steps the server averages both :math:`x` and :math:`u` over the
  clients (``d + p'`` floats per client per round, ``p'`` the inner value's size). The
  first update fills :math:`u` with :math:`g_k(x_0; \zeta_0)` (the runtime averages it over
  the clients first). :math:`\gamma = 1` is ComFedL's fresh inner value.
  Paper 003's settings: sinusoid (E3) :math:`\eta = 0.01`, :math:`\gamma = 0.9`; Omniglot
  (E4) :math:`\eta = 0.1`, :math:`\gamma = 0.99`; :math:`p = 5`.

  Args:
    learning_rate: the step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.01.
    local_steps: :math:`p \ge 1`, steps between averaging (default 5).
    gamma: the tracker rate :math:`\gamma \in (0, 1]` (default 0.9, E3's).
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="local"``) whose plan averages ``u`` with
    the model every round (``every_round=("u",)``, ``at_init=("u",)``).

  Raises:
    ValueError: if ``gamma`` is not in ``(0, 1]``, ``learning_rate`` is not positive,
      ``local_steps`` is not a positive int, or both ``learning_rate`` and an optax
      transform ``optimizer`` are given.

  Examples:
    One round of one client at Omniglot's settings on a client's mean-variance portfolio
    (``kind="local"``), whose objective falls:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.local_scgd(0.1, 5, gamma=0.99)
    >>> opt.problem_kind, opt.plan.every_round  # u is averaged with x
    ('local', ('u',))
    >>> problem = fedco.problems.portfolio(lam=1.0, kind="local")
    >>> batch = {"r": jnp.array([[1.0, 0.5], [0.6, -0.2], [0.2, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> objective = lambda x: oracles["outer_fn"](oracles["inner_fn"](x))
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x)
    >>> for _ in range(opt.plan.local_steps):
    ...   step, state = opt.update(None, state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    >>> print(f"{float(objective(x)):.4f}")  # from 0
    -0.2528
  """
  _validate.open_unit("gamma", gamma, closed_right=True)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  tracker = estimators.moving_average(gamma)
  plan = extend.make_plan(local_steps, every_round=("u",), at_init=("u",))

  def init(params, *, inner_value=None):
    u = extend.pending_or(inner_value, tracker.init)
    return SCGDState(jnp.zeros([], jnp.int32), u, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("local_scgd", inner_fn, outer_fn)
    state = extend.fill_pending(state, params, inner_fn)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = tracker.update(state.u, sample, None)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, SCGDState(state.count + 1, u, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "local_scgd", "local")


@extend.register(settings={"local_scgdm": dict(learning_rate=1.0, beta=0.1, alpha=0.8, gamma=0.7)})
@extend.factory(static=("local_steps", "optimizer"))
def local_scgdm(
  learning_rate: extend.ScalarOrSchedule = 1.0,
  local_steps: int = 5,
  *,
  beta: float = 0.01,
  alpha: float = 0.8,
  gamma: float = 0.7,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Local-SCGDM (paper 003, Algorithm 1): local compositional steps with momentum.

  Solves the **local-inner** problem :math:`F(x) = \frac{1}{K}\sum_k [f_k(g_k(x)) +
  h_k(x)]` (federated MAML in paper 003). Each client keeps an inner tracker :math:`u` and
  a momentum :math:`m`:

  .. math::

    \text{step } 0:&\quad u = g_k(x; \zeta), \quad z = J_{g_k}(x; \zeta)^\top
      \nabla f_k(u; \xi), \quad m = z, \\
    \text{step } t \ge 1:&\quad u \leftarrow (1 - \gamma\eta)\, u + \gamma\eta\,
      g_k(x; \zeta), \quad z = J_{g_k}(x; \zeta)^\top \nabla f_k(u; \xi), \\
    &\quad m \leftarrow (1 - \alpha\eta)\, m + \alpha\eta\, z, \\
    \text{every step}:&\quad x \leftarrow x - \beta\eta\, m,

  (:math:`z` also gets :math:`\nabla h_k(x)` when the problem has that term), and when
  :math:`(t + 1) \bmod p = 0` the server averages :math:`u`, :math:`m` and :math:`x` over
  the clients: three things are sent, ``p' + 2d`` floats per client per round (``p'`` the
  inner value's size). Paper settings: sinusoid (E3) :math:`\eta = 1, \beta = 0.01,
  \alpha = 0.8, \gamma = 0.7, p = 5`; Omniglot (E4) :math:`\eta = 1, \beta = 0.1,
  \alpha = 0.9, \gamma = 0.99`.

  Args:
    learning_rate: :math:`\eta > 0`, a number (default 1.0, the paper's). It also sets the
      tracker and momentum rates :math:`\gamma\eta` and :math:`\alpha\eta`, so it is used
      with any ``optimizer``; a schedule is refused here but works under
      :func:`fedco.inject_hyperparams`.
    local_steps: :math:`p \ge 1`, steps between averaging :math:`u`, :math:`m` and
      :math:`x` (default 5).
    beta: :math:`\beta > 0`, the parameter step :math:`x \leftarrow x - \beta\eta\, m`
      (default 0.01, E3's).
    alpha: the momentum rate :math:`\alpha > 0` with :math:`\alpha\eta \in (0, 1)`
      (default 0.8).
    gamma: the tracker rate :math:`\gamma > 0` with :math:`\gamma\eta \in (0, 1)`
      (default 0.7).
    optimizer: the step that receives :math:`m`: ``None`` (``optax.sgd(beta * eta)``), a
      factory of the rate (called with ``beta * eta``) or an optax transform with its own
      rate (``learning_rate`` still sets the other rates).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="local"``) whose plan averages ``u`` and
    ``m`` with the model every round (``every_round=("u", "m")``).

  Raises:
    ValueError: if ``learning_rate``, ``beta``, ``alpha`` or ``gamma`` is not a positive
      number, :math:`\alpha\eta` or :math:`\gamma\eta` is not in ``(0, 1)``, or
      ``local_steps`` is not a positive int.

  Examples:
    One round of one client at the sinusoid's settings on a client's mean-variance
    portfolio (``kind="local"``), whose objective falls:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.local_scgdm(1.0, 5, beta=0.01, alpha=0.8, gamma=0.7)
    >>> opt.problem_kind, opt.plan.every_round  # u and m are averaged with x
    ('local', ('u', 'm'))
    >>> problem = fedco.problems.portfolio(lam=1.0, kind="local")
    >>> batch = {"r": jnp.array([[1.0, 0.5], [0.6, -0.2], [0.2, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> objective = lambda x: oracles["outer_fn"](oracles["inner_fn"](x))
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x)
    >>> for _ in range(opt.plan.local_steps):
    ...   step, state = opt.update(None, state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    >>> print(f"{float(objective(x)):.4f}")  # from 0
    -0.0271
  """
  _validate.positive("learning_rate", learning_rate)
  _validate.positive("beta", beta)
  _validate.positive("alpha", alpha)
  _validate.positive("gamma", gamma)
  a_rate = _validate.open_unit("alpha * learning_rate", alpha * learning_rate)
  g_rate = _validate.open_unit("gamma * learning_rate", gamma * learning_rate)
  opt = extend.param_optimizer(beta * learning_rate, optimizer, default=1.0, shared_rate=True)
  plan = extend.make_plan(local_steps, every_round=("u", "m"), at_init=("u", "m"))

  def init(params, *, inner_value=None):
    u = extend.pending_or(inner_value, lambda v: v)
    m = jax.tree.map(jnp.zeros_like, extend.strong(params))
    return SCGDMState(jnp.zeros([], jnp.int32), u, m, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("local_scgdm", inner_fn, outer_fn)
    state = extend.fill_pending(state, params, inner_fn)
    first = state.count == 0
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    u = extend.select(first, sample, estimators.moving_average(g_rate).update(state.u, sample))
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, u), updates)
    m = extend.select(
      first, z, jax.tree.map(lambda a, b: (1 - a_rate) * a + a_rate * b, state.m, z)
    )
    step, opt_state = opt.update(m, state.opt_state, params)
    return step, SCGDMState(state.count + 1, u, m, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "local_scgdm", "local")
