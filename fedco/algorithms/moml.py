r"""Local-MOML: memory-based MAML (Wang et al. 2021) with local steps (SPEC 3, E3 baseline).

One memory ``u_i`` per task, kept on the client that owns the task. Each step, for the tasks
``i`` of the sampled meta-batch::

    u_i = (1 - beta) u_i + beta (w - a grad L_i(w; train))       (memory of adapted params)
    w   = w - eta * mean_i grad_u L_i(u_i; val)                  (first-order through u)

and every ``local_steps`` steps the server averages ``w`` (plain averaging; memories are never
sent, so a round costs ``d`` floats each way per client).

fedco form: on :mod:`fedco.problems.maml` problems the inner value ``g(w; e)`` is the table of
adapted parameters over the client's task slots (leaves ``[T, *param_shape]``), so the state's
``u`` (same structure) *is* the per-client table of task memories, and the outer is
``f(y; e) = sum_t w_t L_t(y[t]; val_t)`` with ``w_t = 0`` for tasks outside the meta-batch.

* **Which tasks were sampled.** ``update`` only sees the oracles, so a slot counts as
  sampled when the outer sample depends on it: ``grad f(u_old; xi)`` is non-zero on that
  slot. Slots the outer batch does not weigh have an exactly zero gradient and keep their
  memory. (A sampled task whose query gradient is exactly zero would keep its memory too; it
  contributes nothing to the step either way.)
* **Direction.** ``first_order=True`` (SPEC 3): ``z = sum_t grad_y f(u)[t]``
  ``= sum_t w_t grad L_t(u_t; val)``; this needs the inner value to have the parameters'
  structure, with or without the leading slot axis. ``first_order=False`` is MOML's
  second-order direction ``J_g(w)^T grad f(u)`` (``sum_t (I - a H_t) grad L_t(u_t)``, a
  Hessian-vector product through the inner sample) and works on any local-inner problem.
* **Initial memory**: the runtime's first inner sample ``g(x_0; zeta_0)`` of each client (not
  averaged over clients: the plan communicates no state).

References:
  Wang, Yuan, Wu, Ji, Yang, "Memory-based optimization methods for model-agnostic
  meta-learning" (2021), the Local-MOML baseline of paper 003 Sec. 5.1.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate, estimators, extend


class MOMLState(NamedTuple):
  count: jnp.ndarray  # type: ignore[assignment]  # NamedTuple field shadows tuple.count
  u: Any
  opt_state: optax.OptState


def tracker_layout(u, params) -> str:
  """``"table"`` (leaves ``[T, *param_shape]``), ``"params"`` (param-shaped) or ``"other"``."""
  # jaxlib's PyTreeDef (a C extension) has no stubs
  if jax.tree.structure(u) != jax.tree.structure(params):  # type: ignore[operator]
    return "other"
  pairs = list(zip(jax.tree.leaves(u), jax.tree.leaves(params)))
  if all(jnp.shape(a) == jnp.shape(p) for a, p in pairs):
    return "params"
  lead = {jnp.shape(a)[0] for a, _ in pairs if jnp.ndim(a) >= 1}
  if (
    all(jnp.ndim(a) == jnp.ndim(p) + 1 and jnp.shape(a)[1:] == jnp.shape(p) for a, p in pairs)
    and len(lead) == 1
  ):
    return "table"
  return "other"


def _slot_mask(grad_u, layout):
  """Per slot (``[T]``), or one scalar: does the outer sample depend on the slot."""
  if layout == "table":
    per_leaf = [jnp.any(g.reshape(g.shape[0], -1) != 0, axis=1) for g in jax.tree.leaves(grad_u)]
  else:
    per_leaf = [jnp.any(g != 0) for g in jax.tree.leaves(grad_u)]
  return jnp.any(jnp.stack(per_leaf), axis=0)


# the portfolio's inner is not shaped like the parameters: MOML's full J_g^T direction
@extend.register(settings={"local_moml": dict(learning_rate=0.1, beta=0.7, first_order=False)})
@extend.factory(static=("local_steps", "optimizer"))
def local_moml(
  learning_rate: Optional[extend.ScalarOrSchedule] = None,
  local_steps: int = 5,
  *,
  beta: float = 0.7,
  first_order: bool = True,
  optimizer: extend.Optimizer = None,
) -> extend.Algorithm:
  r"""Local-MOML: memory-based MAML with local steps and model averaging (Wang et al. 2021).

  The Local-MOML baseline of paper 003 (Sec. 5.1, E3; SPEC 3) for local-inner problems
  :math:`F(x) = \frac{1}{K}\sum_k [f_k(g_k(x)) + h_k(x)]`, in practice
  :func:`fedco.problems.maml`, whose inner value :math:`g(w; e)` is the table of adapted
  parameters over the client's task slots (leaves ``[T, *param_shape]``). Each client keeps
  one memory :math:`u_t` per task slot (the state's ``u``, shaped like the inner value), and
  at every step refreshes the memories of the tasks the outer batch weighs, then steps on
  the query losses at the memories:

  .. math::

     u_t &\leftarrow (1 - \beta)\, u_t + \beta\, (w - a \nabla L_t(w; D_t^{tr}))
       \quad \text{for the sampled tasks } t, \\
     w &\leftarrow w - \eta\, (z + \nabla h(w)), \qquad
       z = \sum_t \omega_t \nabla L_t(u_t; D_t^{val}),

  with :math:`\omega_t` the outer batch's task weights (``task_weight``) and :math:`a` the
  problem's ``inner_lr``. That :math:`z` is SPEC 3's first-order direction
  (``first_order=True``); ``first_order=False`` is MOML's second-order
  :math:`z = J_g(w)^\top \nabla f(u) = \sum_t (I - a H_t)\, \omega_t \nabla L_t(u_t)`
  (a Hessian-vector product through the inner sample), which works on any local-inner
  problem. A slot counts as sampled when the outer gradient on it is non-zero; unsampled
  slots keep their memory (see the module docstring). Every ``local_steps`` steps the
  server averages the models with uniform weights.

  Communication: the plan sends only the parameters (``d`` floats each way per client per
  round). Client state ``MOMLState(count, u, opt_state)``: the memories ``u`` never leave
  the client; they start from its first inner sample :math:`g(x_0; \zeta_0)`.

  Args:
    learning_rate: the meta step :math:`\eta > 0` or an optax schedule; ``None``: 0.01
      (paper 003's sinusoid setting, E3).
    local_steps: steps between model averages, a positive int (paper 003: :math:`p = 5`).
    beta: the memory rate :math:`\beta \in (0, 1]` (paper 003 sinusoid: 0.7); 1 keeps no
      memory (each step uses the fresh adapted parameters).
    first_order: ``True`` (default): SPEC 3's first-order direction through the memories,
      which needs an inner value shaped like the parameters, with or without a leading
      task-slot axis; ``False``: MOML's second-order direction :math:`J_g^\top \nabla f(u)`,
      for any local-inner problem.
    optimizer: the parameter step: ``None`` (``optax.sgd(eta)``), a factory of the learning
      rate (``optax.adam``) or an optax transform with its own rate (then no
      ``learning_rate``).

  Returns:
    A :class:`fedco.Algorithm` (``problem_kind="local"``) whose plan averages only the
    parameters, uniformly, every ``local_steps`` steps.

  Raises:
    ValueError: ``beta`` is not in :math:`(0, 1]`, ``first_order`` is not a bool, the
      learning rate is not positive, or both ``learning_rate`` and an optax transform
      ``optimizer`` are given; from ``init`` / ``update``, ``first_order=True`` on an inner
      value that is not shaped like the parameters (with or without a slot axis).

  Examples:
    Two tasks :math:`L_t(w) = \frac{1}{2}\|w - c_t\|^2` (the same on support and query
    sets); the memories are a ``[T, d]`` table, refreshed half-way (:math:`\beta = 0.5`)
    toward the adapted parameters at the new model :math:`w = (1, 1)`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> centers = jnp.array([[1.0, 2.0], [3.0, 0.0]])  # c_t, one row per task
    >>> loss = lambda w, c: 0.5 * jnp.sum((w - c) ** 2)
    >>> inner_fn = lambda w: jnp.stack([w - 0.1 * jax.grad(loss)(w, c) for c in centers])
    >>> outer_fn = lambda y: 0.5 * (loss(y[0], centers[0]) + loss(y[1], centers[1]))
    >>> alg = fedco.local_moml(0.1, local_steps=5, beta=0.5)
    >>> alg.plan.every_round  # only the parameters are averaged: u stays on the client
    ()
    >>> w0 = jnp.zeros(2)
    >>> state = alg.init(w0, inner_value=jax.jit(inner_fn)(w0))  # u = g(w0)
    >>> step_fn = jax.jit(lambda w, s: alg.update(None, s, w, inner_fn=inner_fn,
    ...                                           outer_fn=outer_fn))
    >>> updates, state = step_fn(jnp.ones(2), state)
    >>> [[round(v, 3) for v in row] for row in state.u.tolist()]
    [[0.55, 0.65], [0.75, 0.45]]
    >>> [round(v, 3) for v in updates.tolist()]  # -eta * sum_t 0.5 (u_t - c_t)
    [0.135, 0.045]
  """
  _validate.open_unit("beta", beta, closed_right=True)
  if not isinstance(first_order, bool):
    raise ValueError(f"first_order must be a bool, got {first_order!r}")
  opt = extend.param_optimizer(learning_rate, optimizer, default=0.01)
  plan = extend.make_plan(local_steps)

  def checked_layout(u, params):
    layout = tracker_layout(u, params)
    if first_order and layout == "other":
      raise ValueError(
        "local_moml(first_order=True) needs an inner value shaped like the parameters, "
        "optionally with a leading task-slot axis (a fedco.problems.maml problem); got "
        f"{jax.tree.map(jnp.shape, u)} for parameters {jax.tree.map(jnp.shape, params)}. "
        "Use first_order=False for other inner maps."
      )
    return layout

  def init(params, *, inner_value=None):
    u = extend.pending_or(inner_value, lambda v: v)
    if inner_value is not None:
      checked_layout(u, params)
    return MOMLState(jnp.zeros([], jnp.int32), u, opt.init(params))

  def update(updates, state, params=None, *, inner_fn=None, outer_fn=None, **unused):
    del unused
    inner_fn, outer_fn, _ = extend.oracles("local_moml", inner_fn, outer_fn)
    state = extend.fill_pending(state, params, inner_fn)
    layout = checked_layout(state.u, params)
    sample, pullback = estimators.inner_vjp(inner_fn, params)
    grad_f = jax.grad(outer_fn)
    sampled = _slot_mask(grad_f(state.u), layout)

    def refresh(old, new):
      mask = sampled.reshape(sampled.shape + (1,) * (old.ndim - sampled.ndim))
      return jnp.where(mask, (1 - beta) * old + beta * new, old)

    u = jax.tree.map(refresh, state.u, sample)
    v = grad_f(u)
    if not first_order:
      z = pullback(v)
    elif layout == "table":
      z = jax.tree.map(lambda a: jnp.sum(a, axis=0), v)
    else:
      z = v
    z = extend.add_grads(z, updates)
    step, opt_state = opt.update(z, state.opt_state, params)
    return step, MOMLState(state.count + 1, u, opt_state)

  return extend.Algorithm(init, update, plan, extend.averaging_server(), "local_moml", "local")
