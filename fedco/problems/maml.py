r"""MAML and DA-MAML as local-inner compositional problems (SPEC 4.4, 4.5).

MAML (paper 001 eq. 7, paper 003 eq. 8) on client ``k`` with tasks ``t``::

    F_k(w) = E_t L_t( g_t(w); D_t^val ),    g_t(w) = E_xi [ w - a grad L_t(w; xi) ],  xi ~ D_t^train

and DA-MAML (paper 001 eq. 10) replaces the outer by ``exp(L_t(.; D_t^val) / gamma)``.

The per-task composition (the design choice)
--------------------------------------------
fedco forms an inner value as the *mean over the examples of a batch* and applies the outer
to that mean. Taking one task as an example would give ``f(mean_t g_t)``: every task's query
loss evaluated at the *task-averaged* adapted parameters, which is not MAML's
``mean_t f_t(g_t)``. The runtime also draws the inner batch and the outer batch
independently (SPEC 2.1's ``B`` and ``B~``), so the outer's query sets need not belong to the
inner's tasks. Both are solved by making the inner value a **table over the client's task
slots** and one example an **episode** that holds every slot:

* an example (episode) is a dict with ``support_x [T, S, ...]``, ``support_y [T, S, ...]``,
  ``query_x [T, Q, ...]``, ``query_y [T, Q, ...]`` and optionally ``task_weight [T]``
  (the outer weight of each slot, summing to 1; 0 = the task is not in this meta-batch;
  default uniform ``1/T``). Slot ``t`` always holds the *same* task of the client (the
  client's ``t``-th task), so the task identity is the slot index;
* ``inner(w; episode)`` is the stacked pytree of adapted parameters, leaves ``[T, *shape]``
  (``p = T d``): ``g(w; e)[t] = w - a grad L_t(w; support_t)``;
* ``outer(y; episode) = sum_t task_weight[t] L_t(y[t]; query_t)`` (``outer_uses_data=True``).

Then ``f(g(w))`` over one episode is exactly ``mean_t L_t^query(adapted_t(w))`` (a test checks
``J_g^T grad f = jax.grad`` of that direct MAML loss), a mini-batch of episodes averages each
slot's adapted parameters over *the same task's* support draws (the ``E_xi`` inside ``g_t``
of eq. 8), and the expectation over tasks stays outside, in ``f``. Because the slots are task
identities, an independently drawn outer episode evaluates each task at its own adapted
parameters, and trackers (Local-SCGD(M)'s ``u``, Local-MOML's memories) become one memory per
task, which is what paper 003 Sec. 5.1 uses ("a separate inner state ``u_i`` for each task").
The cost is that every inner sample adapts all ``T`` of the client's tasks, also those the
outer meta-batch does not use (their cotangent is zero).

Jacobian: ``J_g^T v = v - a H v`` with ``H`` the Hessian of the support loss (one step;
several steps chain the factors), computed by ``jax.vjp`` through a function that calls
``jax.grad``: a Hessian-vector product, never a materialised Hessian. ``first_order=True``
stops the gradient through the inner gradient, so ``J_g^T v = v`` (first-order MAML).

DA-MAML's outer is ``sum_t w_t exp((L_t - shift) / gamma)``, computed as
``exp(logsumexp((L_t - shift)/gamma, b=w))``: one exponential of a log-space weighted mean, so
no per-task term overflows on its own. Range (float32): the value and the gradient
``w_t exp((L_t - shift)/gamma)/gamma grad L_t`` are finite while
``log sum_t w_t exp((L_t - shift)/gamma) < 88.7`` (about ``max_t (L_t - shift)/gamma < 88``);
``shift`` (a constant, e.g. near the typical loss) rescales the objective by
``exp(-shift/gamma)`` without moving its minimisers, and :func:`da_maml_value` reports
``gamma log sum_t w_t exp(L_t/gamma)`` in log space for any ratio. The exp is applied to the
episode's query loss: eq. 10 exactly when the query set is the task's whole validation set,
otherwise the plug-in estimate, as in ComFedL's step (SPEC 2.1).

The model is any ``apply_fn(params, x)`` of ONE input (a flax ``Module.apply``) with params
any pytree; the pointwise loss defaults to the squared error.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.problems import base

PyTree = Any
FIELDS = ("support_x", "support_y", "query_x", "query_y")


def squared_error(prediction, target):
  """``||prediction - target||^2`` for one point."""
  return jnp.sum((jnp.asarray(prediction) - jnp.asarray(target)) ** 2)


@dataclasses.dataclass(frozen=True, eq=False)
class MAML:
  r"""The MAML building blocks for one model and loss (SPEC 4.4, 4.5).

  A task loss is the mean pointwise loss, :math:`L(w; \{(x_s, y_s)\}) = \frac{1}{S}
  \sum_s \mathrm{loss}(\mathrm{apply}(w, x_s), y_s)`; adaptation is ``inner_steps``
  unrolled steps :math:`w \leftarrow w - a \nabla L(w; \mathrm{support})`. On an episode
  (a dict of ``support_x [T, S, ...]``, ``support_y [T, S, ...]``, ``query_x [T, Q, ...]``,
  ``query_y [T, Q, ...]`` and optionally ``task_weight [T]``; see :mod:`fedco.problems.maml`)
  the methods give the per-task table the problems are built from:

  * ``inner(w, episode)``: :math:`g(w; e)[t] = \mathrm{adapt}_t(w)`, leaves
    ``[T, *param_shape]``;
  * ``outer(table, episode)``: :math:`f(y; e) = \sum_t w_t L_t(y[t]; \mathrm{query}_t)`;
  * ``da_outer(gamma, shift)``: DA-MAML's :math:`\sum_t w_t \exp((L_t - s)/\gamma)`;
  * ``task_loss``, ``adapt``, ``query_losses``, ``direct_loss`` (the MAML loss written
    directly) and ``adapted_losses`` (the query losses after some steps);
  * ``problem(name)`` and ``da_problem(gamma, shift, name)``: what :func:`maml` and
    :func:`da_maml` return.

  Attributes:
    apply_fn: ``apply_fn(params, x) -> prediction`` for ONE input ``x`` (e.g. a flax
      ``Module.apply``); ``params`` any pytree.
    inner_lr: the adaptation step :math:`a > 0`.
    inner_steps: adaptation steps (unrolled; ``>= 1``); default 1.
    first_order: stop the gradient through the inner gradients (:math:`J_g = I`,
      first-order MAML); default ``False`` (exact Hessian-vector products).
    loss: pointwise ``loss(prediction, target) -> scalar``; default the squared error
      :math:`\|p - t\|^2`.

  Raises:
    ValueError: if ``apply_fn`` or ``loss`` is not callable, ``inner_lr`` is not ``> 0``,
      ``inner_steps`` is not a positive integer or ``first_order`` is not a bool.

  Examples:
    One adaptation step lowers both tasks' query losses of a linear model
    :math:`w x` started at :math:`w = 0`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> meta = fedco.problems.MAML(lambda w, x: w * x, inner_lr=0.1)
    >>> xs = jnp.array([[1.0, 2.0], [1.0, -1.0]])  # T = 2 task slots, 2 points each
    >>> slope = jnp.array([[2.0], [-1.0]])  # task t is y = slope_t x
    >>> episode = {
    ...   "support_x": xs, "support_y": slope * xs,
    ...   "query_x": xs + 0.5, "query_y": slope * (xs + 0.5),
    ... }
    >>> losses = jax.jit(meta.adapted_losses, static_argnames="steps")
    >>> print([round(v, 4) for v in losses(jnp.array(0.0), episode, steps=0).tolist()])
    [17.0, 1.25]
    >>> print([round(v, 4) for v in losses(jnp.array(0.0), episode, steps=1).tolist()])
    [4.25, 0.8]
  """

  apply_fn: Callable[..., jax.Array]
  inner_lr: float
  inner_steps: int = 1
  first_order: bool = False
  loss: Callable[..., jax.Array] = squared_error

  def __post_init__(self):
    if not callable(self.apply_fn):
      raise ValueError(f"apply_fn must be callable, got {self.apply_fn!r}")
    if not callable(self.loss):
      raise ValueError(f"loss must be callable, got {self.loss!r}")
    _validate.positive("inner_lr", self.inner_lr)
    _validate.positive_int("inner_steps", self.inner_steps)
    if not isinstance(self.first_order, bool):
      raise ValueError(f"first_order must be a bool, got {self.first_order!r}")

  # ---- one task --------------------------------------------------------------------------

  def task_loss(self, params, x, y) -> jax.Array:
    """``L(params; {(x_s, y_s)}) = mean_s loss(apply(params, x_s), y_s)``."""
    preds = jax.vmap(lambda xi: self.apply_fn(params, xi))(x)
    return jnp.mean(jax.vmap(self.loss)(preds, y))

  def adapt(
    self,
    params,
    x,
    y,
    *,
    steps: Optional[int] = None,
    inner_lr: Optional[float] = None,
    first_order: Optional[bool] = None,
  ):
    """``steps`` unrolled steps ``w = w - a grad L(w; x, y)`` (defaults: the problem's)."""
    steps = self.inner_steps if steps is None else steps
    lr = self.inner_lr if inner_lr is None else inner_lr
    first_order = self.first_order if first_order is None else first_order
    grad_fn = jax.grad(self.task_loss)
    for _ in range(steps):
      g = grad_fn(params, x, y)
      if first_order:
        g = jax.lax.stop_gradient(g)
      params = jax.tree.map(lambda p, d: p - lr * d, params, g)
    return params

  # ---- one episode (all of a client's task slots) ---------------------------------------

  def inner(self, params, episode) -> PyTree:
    """``g(w; e)``: adapted parameters of every task slot, leaves ``[T, *param_shape]``."""
    return jax.vmap(lambda x, y: self.adapt(params, x, y))(
      episode["support_x"], episode["support_y"]
    )

  def query_losses(self, table, episode) -> jax.Array:
    """``[T]``: each slot's query loss at its own entry of the parameter table."""
    return jax.vmap(self.task_loss)(table, episode["query_x"], episode["query_y"])

  def outer(self, table, episode) -> jax.Array:
    """``f(y; e) = sum_t w_t L_t(y[t]; query_t)``."""
    return jnp.sum(task_weights(episode) * self.query_losses(table, episode))

  def da_outer(self, gamma, shift=0.0):
    """DA-MAML's outer ``sum_t w_t exp((L_t - shift)/gamma)`` (log-space weighted mean)."""

    def outer(table, episode):
      z = (self.query_losses(table, episode) - shift) / gamma
      return jnp.exp(jax.nn.logsumexp(z, b=task_weights(episode)))

    return outer

  def direct_loss(self, params, episode) -> jax.Array:
    """The MAML loss written directly, ``sum_t w_t L_t(adapt_t(w); query_t)``."""
    return self.outer(self.inner(params, episode), episode)

  def adapted_losses(
    self, params, episode, *, steps: Optional[int] = None, inner_lr: Optional[float] = None
  ) -> jax.Array:
    """``[T]`` query losses after ``steps`` adaptation steps (``steps=0``: before)."""
    steps = self.inner_steps if steps is None else steps
    table = jax.vmap(
      lambda x, y: self.adapt(params, x, y, steps=steps, inner_lr=inner_lr, first_order=True)
    )(episode["support_x"], episode["support_y"])
    return self.query_losses(table, episode)

  # ---- problems --------------------------------------------------------------------------

  def problem(self, name: str = "maml") -> base.Problem:
    """The local-inner MAML problem ``(inner, outer)`` over episodes (see :func:`maml`)."""
    return base.local_inner(self.inner, self.outer, outer_uses_data=True, name=name)

  def da_problem(self, gamma: float, shift: float = 0.0, name: str = "da_maml") -> base.Problem:
    """The local-inner DA-MAML problem ``(inner, da_outer)`` (see :func:`da_maml`)."""
    _validate.positive("gamma", gamma)
    shift = _validate.real("shift", shift)
    return base.local_inner(
      self.inner, self.da_outer(gamma, shift), outer_uses_data=True, name=name
    )


def task_weights(episode) -> jax.Array:
  """The episode's ``task_weight`` ``[T]``, or the uniform ``1/T``."""
  if "task_weight" in episode:
    return jnp.asarray(episode["task_weight"])
  t = jnp.shape(episode["support_x"])[0]
  return jnp.full((t,), 1.0 / t, jnp.float32)


def maml(
  apply_fn,
  inner_lr: float,
  *,
  inner_steps: int = 1,
  first_order: bool = False,
  loss=squared_error,
  name: str = "maml",
) -> base.Problem:
  r"""MAML (SPEC 4.4; paper 001 eq. 7, paper 003 eq. 8) over episodes, a local-inner problem.

  On client :math:`k` with tasks :math:`t`,

  .. math::

    F_k(w) = \mathbb{E}_t\, L_t\big(g_t(w); D_t^{\mathrm{val}}\big), \qquad
    g_t(w) = \mathbb{E}_{\xi \sim D_t^{\mathrm{train}}} \big[w - a \nabla L_t(w; \xi)\big],

  with one example an *episode* holding every task slot of the client (a dict of
  ``support_x [T, S, ...]``, ``support_y [T, S, ...]``, ``query_x [T, Q, ...]``,
  ``query_y [T, Q, ...]`` and optionally ``task_weight [T]``, the outer weights :math:`w_t`
  summing to 1, default :math:`1/T`; slot :math:`t` always holds the client's
  :math:`t`-th task). Per episode :math:`e`:

  * ``inner(params, e) -> pytree``: the table of adapted parameters, leaves
    ``[T, *param_shape]``, :math:`g(w; e)[t] = w - a \nabla L_t(w; \mathrm{support}_t)`
    (``inner_steps`` unrolled steps);
  * ``outer(y, e) -> scalar`` (data-dependent): :math:`\sum_t w_t L_t(y[t];
    \mathrm{query}_t)`.

  So :math:`f(g(w))` on one episode is the MAML loss, and :math:`J_g^\top v = v - a H v`
  is an exact Hessian-vector product through ``jax.vjp`` of a function that calls
  ``jax.grad`` (``first_order=True`` drops the :math:`a H v` term). Why a table over task
  slots rather than one task per example is explained in :mod:`fedco.problems.maml`.

  Args:
    apply_fn: ``apply_fn(params, x) -> prediction`` for ONE input (e.g. ``MLP().apply``).
    inner_lr: the adaptation step :math:`a > 0`.
    inner_steps: unrolled adaptation steps (``>= 1``); default 1.
    first_order: drop the second-order term (:math:`J_g^\top v = v`); default ``False``.
    loss: pointwise ``loss(prediction, target) -> scalar``; default the squared error.
    name: a label used in metrics and logs; default ``"maml"``.

  Returns:
    A local-inner :class:`Problem` with ``outer_uses_data=True``.

  Raises:
    ValueError: if ``apply_fn`` or ``loss`` is not callable, ``inner_lr`` is not ``> 0``,
      ``inner_steps`` is not a positive integer or ``first_order`` is not a bool.

  Examples:
    One client's objective on a batch of one episode is the mean query loss after
    adaptation (the losses 4.25 and 0.8 of :class:`MAML`'s example):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.maml(lambda w, x: w * x, inner_lr=0.1)
    >>> xs = jnp.array([[1.0, 2.0], [1.0, -1.0]])  # T = 2 task slots, 2 points each
    >>> slope = jnp.array([[2.0], [-1.0]])  # task t is y = slope_t x
    >>> episode = {
    ...   "support_x": xs, "support_y": slope * xs,
    ...   "query_x": xs + 0.5, "query_y": slope * (xs + 0.5),
    ... }
    >>> batch = jax.tree.map(lambda a: a[None], episode)  # a leading example axis
    >>> objective = jax.jit(problem.client_objective)(jnp.array(0.0), batch, jnp.ones(1))
    >>> print(round(float(objective), 4))
    2.525
  """
  return MAML(apply_fn, inner_lr, inner_steps, first_order, loss).problem(name)


def da_maml(
  apply_fn,
  inner_lr: float,
  gamma: float,
  *,
  shift: float = 0.0,
  inner_steps: int = 1,
  first_order: bool = False,
  loss=squared_error,
  name: str = "da_maml",
) -> base.Problem:
  r"""DA-MAML (SPEC 4.5, paper 001 eq. 10) over episodes, a local-inner problem.

  :func:`maml` with the outer replaced by an exponential of the query loss,

  .. math::

    f(y; e) = \sum_t w_t \exp\big((L_t(y[t]; \mathrm{query}_t) - s) / \gamma\big),

  computed as one exponential of a log-space weighted mean, so no per-task term overflows
  on its own. The same inner map and episode layout as :func:`maml`:
  ``inner(params, e) -> pytree`` of adapted parameters ``[T, *param_shape]`` and the
  data-dependent ``outer(y, e) -> scalar`` above. The value and gradient are finite in
  float32 while :math:`\log \sum_t w_t \exp((L_t - s)/\gamma) < 88.7` (about
  :math:`\max_t (L_t - s)/\gamma < 88`); the shift :math:`s` divides the objective by
  :math:`\exp(s/\gamma)` and leaves its minimisers unchanged. Report the value with
  :func:`da_maml_value`, which is finite for any ratio. On an episode the exp applies to
  the query loss: eq. 10 exactly when the query set is the task's whole validation set,
  otherwise the plug-in estimate, as in ComFedL's step (SPEC 2.1).

  Args:
    apply_fn: ``apply_fn(params, x) -> prediction`` for ONE input.
    inner_lr: the adaptation step :math:`a > 0`.
    gamma: the temperature :math:`\gamma > 0`; smaller weighs the worst task more.
    shift: the constant :math:`s` (a finite real, e.g. near the typical loss); default 0.
    inner_steps: unrolled adaptation steps (``>= 1``); default 1.
    first_order: drop the second-order term; default ``False``.
    loss: pointwise ``loss(prediction, target) -> scalar``; default the squared error.
    name: a label used in metrics and logs; default ``"da_maml"``.

  Returns:
    A local-inner :class:`Problem` with ``outer_uses_data=True``.

  Raises:
    ValueError: as :func:`maml`, and if ``gamma`` is not ``> 0`` or ``shift`` is not a
      finite real.

  Examples:
    On :func:`maml`'s episode (adapted query losses 4.25 and 0.8),
    :math:`\gamma \log f + s` is :func:`da_maml_value` of those losses:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.problems.da_maml(lambda w, x: w * x, inner_lr=0.1, gamma=2.0)
    >>> xs = jnp.array([[1.0, 2.0], [1.0, -1.0]])  # T = 2 task slots, 2 points each
    >>> slope = jnp.array([[2.0], [-1.0]])  # task t is y = slope_t x
    >>> episode = {
    ...   "support_x": xs, "support_y": slope * xs,
    ...   "query_x": xs + 0.5, "query_y": slope * (xs + 0.5),
    ... }
    >>> batch = jax.tree.map(lambda a: a[None], episode)
    >>> objective = jax.jit(problem.client_objective)(jnp.array(0.0), batch, jnp.ones(1))
    >>> print(round(float(objective), 4), round(float(2.0 * jnp.log(objective)), 4))
    4.9324 3.1916
    >>> print(round(float(fedco.problems.da_maml_value(jnp.array([4.25, 0.8]), 2.0)), 4))
    3.1916
  """
  return MAML(apply_fn, inner_lr, inner_steps, first_order, loss).da_problem(gamma, shift, name)


def da_maml_value(losses: jax.Array, gamma: float, weights: Optional[jax.Array] = None):
  r"""DA-MAML's value in log space, :math:`\gamma \log \sum_t w_t \exp(L_t / \gamma)`.

  :math:`\gamma` times the log of :func:`da_maml`'s objective with no shift, computed by
  log-sum-exp: finite for any :math:`L / \gamma`. It lies between the weighted mean loss
  (:math:`\gamma \to \infty`) and the largest (:math:`\gamma \to 0`).

  Args:
    losses: ``[..., T]`` task losses :math:`L_t` (e.g. :meth:`MAML.adapted_losses`);
      reduced over the last axis.
    gamma: the temperature :math:`\gamma > 0` (not checked here).
    weights: optional ``[T]`` task weights :math:`w_t` summing to 1; ``None`` (the
      default) is uniform :math:`1/T`.

  Returns:
    A ``[...]`` array (a scalar for ``[T]`` losses).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> losses = jnp.array([1.0, 2.0, 3.0])
    >>> print(round(float(fedco.problems.da_maml_value(losses, 1.0)), 4))
    2.309
    >>> weights = jnp.array([0.5, 0.25, 0.25])
    >>> print(round(float(fedco.problems.da_maml_value(losses, 1.0, weights)), 4))
    2.1075
    >>> print(round(float(fedco.problems.da_maml_value(jnp.array([1e4, 0.0]), 1.0)), 1))
    9999.3
  """
  losses = jnp.asarray(losses)
  if weights is None:
    weights = jnp.full(losses.shape[-1:], 1.0 / losses.shape[-1], losses.dtype)
  return gamma * jax.nn.logsumexp(losses / gamma, b=weights, axis=-1)
