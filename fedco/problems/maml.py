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
  """The MAML building blocks for one model and loss.

  Attributes:
    apply_fn: ``(params, x) -> prediction`` for one input ``x``.
    inner_lr: the adaptation step ``a > 0``.
    inner_steps: adaptation steps (unrolled; ``>= 1``).
    first_order: stop the gradient through the inner gradients (``J_g = I``).
    loss: pointwise ``(prediction, target) -> scalar``; a task loss is its mean over points.
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
    return base.local_inner(self.inner, self.outer, outer_uses_data=True, name=name)

  def da_problem(self, gamma: float, shift: float = 0.0, name: str = "da_maml") -> base.Problem:
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
  """MAML (SPEC 4.4) over episodes (see the module docstring for the example layout).

  Args:
    apply_fn: ``(params, x) -> prediction`` for one input (e.g. ``MLP().apply``).
    inner_lr: adaptation step ``a``.
    inner_steps: unrolled adaptation steps.
    first_order: drop the second-order term (``J_g^T v = v``).
    loss: pointwise loss ``(prediction, target) -> scalar`` (default squared error).
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
  """DA-MAML (SPEC 4.5, paper 001 eq. 10): outer ``sum_t w_t exp((L_t - shift)/gamma)``.

  See the module docstring for the float32 range; ``shift`` divides the objective by
  ``exp(shift/gamma)`` and leaves its minimisers unchanged.
  """
  return MAML(apply_fn, inner_lr, inner_steps, first_order, loss).da_problem(gamma, shift, name)


def da_maml_value(losses: jax.Array, gamma: float, weights: Optional[jax.Array] = None):
  """``gamma log sum_t w_t exp(L_t / gamma)`` (log of DA-MAML's objective, times gamma),
  by log-sum-exp: finite for any ``L / gamma``. ``weights`` default to uniform."""
  losses = jnp.asarray(losses)
  if weights is None:
    weights = jnp.full(losses.shape[-1:], 1.0 / losses.shape[-1], losses.dtype)
  return gamma * jax.nn.logsumexp(losses / gamma, b=weights, axis=-1)
