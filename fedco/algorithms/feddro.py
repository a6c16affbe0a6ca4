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

from fedco import _validate, estimators, extend


class FedDROState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  y: Any
  opt_state: optax.OptState


@extend.register(settings={"feddro": dict(learning_rate=0.1, beta=0.5)})
@extend.factory(static=("local_steps", "optimizer"))
def feddro(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.5,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""FedDRO (paper 004, Algorithm 2): local steps with a hybrid inner tracker shared every step.

  Solves the **global-inner** problem :math:`\Phi(x) = h(x) + f(g(x))` with
  :math:`g = \frac{1}{K}\sum_k g_k` and :math:`h = \frac{1}{K}\sum_k h_k` (sample-level DRO,
  fairness, the mean-variance portfolio), where FedAvg's local inner values are biased and
  do not converge (paper 004, Theorem 4.1). Each client keeps :math:`x_k` and, at every
  step, uses the clients' shared inner estimate :math:`\bar y`:

  .. math::

    z_k &= \nabla h_k(x_k; \xi) + J_{g_k}(x_k; \zeta)^\top \nabla f(\bar y), \qquad
    x_k^+ = x_k - \eta z_k, \\
    y_k &= (1 - \beta)\big(\bar y - g_k(x_k; \zeta')\big) + g_k(x_k^+; \zeta'), \qquad
    \bar y = \frac{1}{K}\sum_k y_k \ \text{(every step)},

  a hybrid (STORM-type) tracker with one sample :math:`\zeta'` at both points, and every
  :math:`I` steps the server averages the models, :math:`x_k = \frac{1}{K}\sum_k x_k`.
  **Choice** (SPEC 2.5): all clients start from :math:`\bar x_0` and
  :math:`\bar y_0 = \frac{1}{K}\sum_k g_k(\bar x_0; \zeta_0)`, one mini-batch each.

  Communication: ``y`` (``p`` floats, the inner value's size) up and back after every
  step, the model (``d`` floats) every :math:`I` steps; a run's ledger counts ``y`` as
  ``p * I`` floats per client per round. Theory (Theorem 4.3): :math:`\eta =
  O(\sqrt{K/T})`, :math:`\beta = c\,\eta`, :math:`I = O(T^{1/4}/K^{3/4})`, with linear
  speedup in :math:`K`; it returns :math:`\bar x` at a uniformly random step, which
  :func:`fedco.simulate` keeps as ``result.random_params`` (``result.params`` is the last
  average). The paper's experiments (Sec. 6) tune :math:`\eta` over
  ``{0.001, 0.01, 0.05, 0.1}`` (divided by 10 after 90 rounds) with batches of 16 per
  client and :math:`I = 1` (ablation ``I in {1, 2, 4, 8, 16, 32}``); they do not give
  :math:`\beta` (fedco's experiments use 0.5).

  ``init(params)`` leaves ``y`` pending; the first ``update`` sets ``y = g(x_0; zeta_0)``
  (the runtime sets every client's ``y`` to :math:`\bar y_0` instead). In a user's own
  loop (one client) :math:`\bar y = y`.

  Args:
    learning_rate: the local step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.05.
    local_steps: :math:`I \ge 1`, local steps between model averages (default 5).
    beta: the hybrid tracker's momentum :math:`\beta \in (0, 1]` (default 0.5);
      :math:`\beta = 1` drops the memory, :math:`y_k = g_k(x_k^+; \zeta')`.
    optimizer: the parameter step on :math:`z_k`: ``None`` (``optax.sgd(eta)``), a factory
      of the learning rate (``optax.adam``) or an optax transform with its own rate (then
      no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="global"``) whose plan averages ``y``
    after every step (``every_step=("y",)``, ``at_init=("y",)``) and whose server averages
    the models.

  Raises:
    ValueError: if ``beta`` is not in ``(0, 1]``, ``learning_rate`` is not positive,
      ``local_steps`` is not a positive int, or both ``learning_rate`` and an optax
      transform ``optimizer`` are given.

  Examples:
    Three steps of one client on the mean-variance portfolio
    :math:`f(a, b) = -a + \lambda (b - a^2)` of :math:`g(x) = (E[r^\top x],
    E[(r^\top x)^2])`, whose objective falls:

    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.feddro(0.05, 5, beta=0.5)
    >>> opt.problem_kind, opt.plan.every_step, opt.plan.local_steps  # y every step
    ('global', ('y',), 5)
    >>> problem = fedco.problems.portfolio(lam=1.0)
    >>> batch = {"r": jnp.array([[1.0, 0.5], [0.6, -0.2], [0.2, 1.0]])}
    >>> _, oracles = fedco.oracle_args(problem, batch, batch)
    >>> objective = lambda x: oracles["outer_fn"](oracles["inner_fn"](x))
    >>> x = jnp.zeros(2)
    >>> state = opt.init(x)
    >>> for _ in range(3):
    ...   step, state = opt.update(None, state, x, **oracles)
    ...   x = optax.apply_updates(x, step)
    ...   print(f"{float(objective(x)):.4f}")
    -0.0273
    -0.0540
    -0.0803
  """
  _validate.open_unit("beta", beta, closed_right=True)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.05)
  tracker = estimators.hybrid(beta)
  plan = extend.make_plan(local_steps, every_step=("y",), at_init=("y",))

  def init(params, *, inner_value=None):
    y = extend.pending_or(inner_value, tracker.init)
    return FedDROState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, next_inner_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = extend.oracles("feddro", inner_fn, outer_fn, next_inner_fn)
    state = extend.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    new_params = optax.apply_updates(params, step)
    y = tracker.update(state.y, next_inner_fn(new_params), next_inner_fn(params))
    return step, FedDROState(state.count + 1, y, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "feddro", "global")


@extend.register(settings={"ds_feddro": dict(learning_rate=0.1, beta=0.5)})
@extend.factory(static=("local_steps", "optimizer"))
def ds_feddro(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.5,
  server_lr_x: float = 1.3,
  server_lr_y: float = 1.4,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""DS-FedDRO (paper 004, Algorithm 3): two-sided learning rates, nothing sent between rounds.

  Solves the same **global-inner** problem as :func:`feddro`, :math:`\Phi(x) = h(x) +
  f(g(x))` with :math:`g = \frac{1}{K}\sum_k g_k`, but shares nothing during a round: each
  client tracks the inner value with its own moving average :math:`y_k` and steps

  .. math::

    z_k &= \nabla h_k(x_k; \xi) + J_{g_k}(x_k; \zeta)^\top \nabla f(y_k), \qquad
    x_k \leftarrow x_k - \eta z_k, \\
    y_k &\leftarrow (1 - \beta)\, y_k + \beta\, g_k(x_k; \zeta') \quad
    \text{(at the new iterate)}.

  Every :math:`I` steps the server takes SGD steps on the pseudo-gradients (FedOpt with
  server SGD),

  .. math::

    x \leftarrow x - \gamma_x \frac{1}{K}\sum_k (x - x_k), \qquad
    y \leftarrow y - \gamma_y \frac{1}{K}\sum_k (y - y_k),

  and every client restarts from :math:`(x, y)`; :math:`\gamma_x = \gamma_y = 1` is plain
  averaging. **Choice** (SPEC 2.6): the local gradient uses the client's own :math:`y_k`,
  since nothing is shared between syncs. Communication: ``d + p`` floats up and down per
  client per round (model and ``y``), none between rounds. Theory (Theorem 5.2, under an
  extra assumption): :math:`\eta = O(\sqrt{1/(IT)})`, :math:`\beta = c\,\eta`,
  :math:`\gamma_x = O(\sqrt{K/T})`, :math:`\gamma_y = c\,\gamma_x`, :math:`I =
  O(\sqrt{T/K})`. The paper's experiments (Sec. 6) tune :math:`\eta` as for
  :func:`feddro` and use :math:`\gamma_x = 1.3`, :math:`\gamma_y = 1.4`.

  Args:
    learning_rate: the local step size :math:`\eta > 0` (a number or an optax schedule);
      ``None``: 0.05.
    local_steps: :math:`I \ge 1`, local steps per round (default 5).
    beta: the moving-average rate :math:`\beta \in (0, 1]` (default 0.5; 1 keeps only the
      newest sample).
    server_lr_x: the server's model rate :math:`\gamma_x > 0` (default 1.3, the paper's).
    server_lr_y: the server's tracker rate :math:`\gamma_y > 0` (default 1.4, the paper's).
    optimizer: the local parameter step, as in :func:`feddro`: ``None``
      (``optax.sgd(eta)``), a factory of the learning rate or an optax transform with its
      own rate (then no ``learning_rate``).

  Returns:
    An :class:`~fedco.Algorithm` (``problem_kind="global"``) whose plan aggregates ``y``
    with the model once a round (``every_round=("y",)``, ``at_init=("y",)``) and whose
    server is ``optax.multi_transform`` of ``optax.sgd(server_lr_x)`` on ``"params"`` and
    ``optax.sgd(server_lr_y)`` on ``"y"``.

  Raises:
    ValueError: if ``beta`` is not in ``(0, 1]``, a rate is not positive, ``local_steps``
      is not a positive int, or both ``learning_rate`` and an optax transform
      ``optimizer`` are given.

  Examples:
    The plan sends ``y`` once a round, and the server's step on the pseudo-gradients
    ``server - mean_k client`` has the two rates:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> opt = fedco.ds_feddro(0.05, 5, beta=0.5, server_lr_x=1.3, server_lr_y=1.4)
    >>> opt.plan.every_step, opt.plan.every_round
    ((), ('y',))
    >>> server = {"params": jnp.zeros(2), "y": jnp.zeros(2)}
    >>> pseudo = {"params": jnp.array([1.0, -1.0]), "y": jnp.array([1.0, -1.0])}
    >>> updates, _ = opt.server.update(pseudo, opt.server.init(server))
    >>> {k: [round(float(v), 4) for v in u] for k, u in updates.items()}
    {'params': [-1.3, 1.3], 'y': [-1.4, 1.4]}
  """
  _validate.open_unit("beta", beta, closed_right=True)
  _validate.positive("server_lr_x", server_lr_x)
  _validate.positive("server_lr_y", server_lr_y)
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.05)
  tracker = estimators.moving_average(beta)
  plan = extend.make_plan(local_steps, every_round=("y",), at_init=("y",))
  server = optax.multi_transform(
    {"x": optax.sgd(server_lr_x), "y": optax.sgd(server_lr_y)},
    lambda tree: {
      k: jax.tree.map(lambda _, k=k: "x" if k == "params" else "y", v) for k, v in tree.items()
    },
  )

  def init(params, *, inner_value=None):
    y = extend.pending_or(inner_value, tracker.init)
    return FedDROState(jnp.zeros([], jnp.int32), y, opt.init(params))

  def update(
    updates, state, params=None, *, inner_fn=None, outer_fn=None, next_inner_fn=None, **unused
  ):
    del unused
    inner_fn, outer_fn, next_inner_fn = extend.oracles(
      "ds_feddro", inner_fn, outer_fn, next_inner_fn
    )
    state = extend.fill_pending(state, params, inner_fn)
    _, pullback = estimators.inner_vjp(inner_fn, params)
    z = extend.add_grads(estimators.compositional_grad(pullback, outer_fn, state.y), updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    y = tracker.update(state.y, next_inner_fn(optax.apply_updates(params, step)), None)
    return step, FedDROState(state.count + 1, y, opt_state)

  return extend.Algorithm(init, update, plan, server, "ds_feddro", "global")
