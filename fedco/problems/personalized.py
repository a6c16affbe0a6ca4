r"""Personalized FL as MAML with one task per client (paper 001 Sec. 5.2, SPEC E2).

Each client is a task whose examples are single labelled points. With the per-example loss
``l(w; xi)`` and ``L_k = E_{xi ~ D_k} l``, MAML's client objective is::

    F_k(w) = L_k( w - a grad L_k(w) )

and its compositional form (paper 001 eq. 7) takes, per example, the inner map
``g(w; zeta) = w - a grad l(w; zeta)`` (so the batch mean is ``w - a grad L(w; B)``, the
adapted parameters on the support batch ``B``; ``p = d``) and the outer ``f_k(y; xi) =
l(y; xi)`` on an independent query batch. ``J_g(w)^T v = v - a H v`` with ``H`` the Hessian of
the support loss, by ``jax.vjp`` through ``jax.grad`` (never materialised).

DA-MAML (paper 001 eq. 10) puts ``exp(L_k(y)/gamma)`` outside: the outer link
``exp((L - shift)/gamma)`` of :class:`fedco.problems.Problem` applies it to the *mean* query
loss of the batch (the plug-in estimate, as ComFedL's step uses). ``shift`` rescales the
objective by ``exp(-shift/gamma)`` without moving its minimisers; float32 holds
``(L - shift)/gamma < 88``.

Unlike :mod:`fedco.problems.maml` (episodes of several tasks per client), there is no task
table: a client *is* its task, the inner value has the parameters' structure, and every
fedco algorithm for local-inner problems (ComFedL, Per-FedAvg, TR-MAML, ...) runs on it.
"""

from __future__ import annotations

from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.problems import base


def example_loss(apply_fn: Callable, loss: Callable) -> Callable:
  """``(params, example) -> loss(apply_fn(params, example["x"]), example["y"])``."""

  def fn(params, example):
    return loss(apply_fn(params, example["x"]), example["y"])

  return fn


def adapt(
  apply_fn: Callable, loss: Callable, params, batch, weights, inner_lr: float, steps: int = 1
):
  """``steps`` gradient steps of rate ``inner_lr`` on the weighted batch loss (personalisation)."""
  per_example = example_loss(apply_fn, loss)

  def batch_loss(p):
    return base.weighted_mean(jax.vmap(per_example, in_axes=(None, 0))(p, batch), weights)

  for _ in range(steps):
    grads = jax.grad(batch_loss)(params)
    params = jax.tree.map(lambda p, g: p - inner_lr * g, params, grads)
  return params


def personalized_maml(
  apply_fn: Callable,
  inner_lr: float,
  loss: Callable,
  *,
  first_order: bool = False,
  gamma: Optional[float] = None,
  shift: float = 0.0,
  name: Optional[str] = None,
) -> base.Problem:
  r"""MAML (``gamma=None``) or DA-MAML (``gamma > 0``) with one task per client.

  Personalized FL as MAML (paper 001 Sec. 5.2, SPEC E2): client :math:`k` is a task whose
  examples are single labelled points :math:`\xi = (x, y)`, with the per-example loss
  :math:`\ell(w; \xi) = \mathrm{loss}(\mathrm{apply}(w, x), y)` and
  :math:`L_k = \mathbb{E}_{\xi \sim D_k} \ell`. The local-inner objective is

  .. math::

    F(w) = \frac{1}{K} \sum_k \mathrm{link}\Big(L_k\big(w - a \nabla L_k(w)\big)\Big),
    \qquad \mathrm{link}(v) = v \ \text{(MAML)} \ \text{or}\
    \exp\big((v - s)/\gamma\big) \ \text{(DA-MAML)},

  from the per-example functions

  * ``inner(params, example) -> pytree``: :math:`g(w; \zeta) = w - a \nabla \ell(w;
    \zeta)`, with the parameters' structure (so a batch mean is the adapted parameters on
    the support batch, :math:`p = d`);
  * ``outer(y, example) -> scalar``: :math:`\ell(y; \xi)` on an independent query batch,
    its mean passed through the problem's ``outer_link`` (the plug-in estimate of
    :math:`\exp(L_k(y)/\gamma)`, as ComFedL's step uses).

  :math:`J_g^\top v = v - a H v` with :math:`H` the Hessian of the support loss, by
  ``jax.vjp`` through ``jax.grad`` (never materialised). The shift :math:`s` rescales the
  DA-MAML objective by :math:`\exp(-s/\gamma)` without moving its minimisers; float32
  holds :math:`(L - s)/\gamma < 88`. Unlike :func:`maml` (episodes of several tasks per
  client) there is no task table, so every local-inner algorithm (ComFedL, Per-FedAvg,
  TR-MAML, ...) runs on it.

  Args:
    apply_fn: ``apply_fn(params, x) -> prediction`` for ONE input.
    inner_lr: the adaptation step :math:`a > 0`.
    loss: pointwise ``loss(prediction, label) -> scalar`` (e.g.
      ``fedco.models.cross_entropy``).
    first_order: stop the gradient through the inner gradient (:math:`J_g = I`); default
      ``False``.
    gamma: DA-MAML's temperature :math:`\gamma > 0`; ``None`` (the default) is plain MAML.
    shift: DA-MAML's constant shift :math:`s` of the loss inside the exponential (a finite
      real); default 0, ignored by plain MAML.
    name: a label used in metrics and logs; ``None`` (the default) gives ``"maml"`` or
      ``"da_maml"``.

  Returns:
    A local-inner :class:`Problem` with ``outer_uses_data=True`` (and an ``outer_link``
    for DA-MAML) whose examples are dicts ``{"x": one input, "y": its label}``.

  Raises:
    ValueError: if ``apply_fn`` or ``loss`` is not callable, ``inner_lr`` or ``gamma`` is
      not ``> 0``, ``first_order`` is not a bool or ``shift`` is not a finite real.

  Examples:
    A linear model :math:`w x` on two clients (:math:`y = 2x` and :math:`y = -x`); exact
    evaluation adapts on each client's whole data and evaluates there:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> x = jnp.array([1.0, 2.0, 1.0, -1.0])
    >>> data = {"x": x, "y": jnp.array([2.0, 2.0, -1.0, -1.0]) * x}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> for gamma in (None, 2.0):
    ...   problem = fedco.problems.personalized_maml(
    ...     lambda w, x: w * x, 0.1, lambda p, y: (p - y) ** 2, gamma=gamma
    ...   )
    ...   evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    ...   objective, losses = evaluate(jnp.array(0.0), data, owner, weights, num_clients=2)
    ...   print(problem.name, round(float(objective), 4), [round(v, 4) for v in losses.tolist()])
    maml 1.57 [2.5, 0.64]
    da_maml 2.4337 [3.4903, 1.3771]
  """
  if not callable(apply_fn):
    raise ValueError(f"apply_fn must be callable, got {apply_fn!r}")
  if not callable(loss):
    raise ValueError(f"loss must be callable, got {loss!r}")
  _validate.positive("inner_lr", inner_lr)
  if not isinstance(first_order, bool):
    raise ValueError(f"first_order must be a bool, got {first_order!r}")
  if gamma is not None:
    _validate.positive("gamma", gamma)
  shift = _validate.real("shift", shift)
  per_example = example_loss(apply_fn, loss)

  def inner(params, example):
    grad_fn = jax.grad(per_example)
    if first_order:
      grads = jax.lax.stop_gradient(grad_fn(jax.lax.stop_gradient(params), example))
    else:
      grads = grad_fn(params, example)
    return jax.tree.map(lambda p, g: p - inner_lr * g, params, grads)

  link = None
  if gamma is not None:
    link = lambda v: jnp.exp((v - shift) / gamma)
  label = name or ("maml" if gamma is None else "da_maml")
  return base.local_inner(inner, per_example, outer_uses_data=True, name=label, outer_link=link)
