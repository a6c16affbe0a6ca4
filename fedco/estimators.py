r"""The compositional gradient oracle and the inner-value trackers (SPEC sections 0 and 1).

The compositional stochastic gradient at :math:`x` with inner estimate :math:`y` is

.. math::

  z = J_g(x; \zeta)^\top \nabla f(y; \xi) + \nabla h(x; \xi').

The oracle never forms :math:`J_g`: one ``jax.vjp`` of :math:`g(\cdot; \zeta)` at :math:`x`
yields both the fresh inner sample :math:`g(x; \zeta)` (which the trackers need) and a
function that pulls a cotangent back, so :math:`J_g(x; \zeta)^\top \nabla f(y)` costs one
forward and one backward pass of :math:`g`, whatever :math:`y` the tracker produced in
between. :func:`inner_vjp` is that pass, :func:`compositional_grad` pulls
:math:`\nabla f(y)` back through it, and :func:`value_and_compositional_grad` does both.
The :math:`\nabla h` term is added by the algorithm (``fedco.extend.add_grads``).

Trackers keep a running estimate :math:`y` of the inner value (the same pytree structure as
:math:`g`'s output). They are pure ``(init, update)`` pairs (:class:`Tracker`); each updates
:math:`y` when a fresh sample :math:`s_\text{new} = g(x_\text{new}; \zeta)` arrives:

.. list-table::
  :header-rows: 1

  * - tracker
    - update
    - used by
  * - :func:`fresh`
    - :math:`y = s_\text{new}` (no memory)
    - ComFedL / Local-BSGD, FedAvg-CO
  * - :func:`moving_average`
    - :math:`y = (1 - a)\, y + a\, s_\text{new}`
    - Local-SCGD (:math:`a = \gamma`), Local-SCGDM (:math:`a = \gamma\eta`), DS-FedDRO
      (:math:`a = \beta`)
  * - :func:`hybrid` (STORM-type)
    - :math:`y = (1 - \beta)\,(y - g(x_\text{old}; \zeta)) + g(x_\text{new}; \zeta)`, one
      sample :math:`\zeta` evaluated at both points
    - FedDRO
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, cast

import jax

PyTree = Any


def inner_vjp(inner_fn: Callable[[PyTree], PyTree], params: PyTree):
  r"""One pass of the inner map: the sample :math:`g(x; \zeta)` and its pullback.

  One ``jax.vjp`` of :math:`g(\cdot; \zeta)` at :math:`x`: the forward pass gives the fresh
  inner sample, and the returned pullback computes :math:`v \mapsto J_g(x; \zeta)^\top v`
  (one backward pass per call) without ever forming :math:`J_g`. Call the pullback with
  :math:`\nabla f(y)` at whatever :math:`y` the tracker produced from the sample
  (:func:`compositional_grad`).

  Args:
    inner_fn: ``x -> g(x; zeta)`` with the sample :math:`\zeta` already bound (a pytree
      of arrays out, e.g. ``lambda x: problem.inner(x, batch)``).
    params: the point :math:`x` (any pytree).

  Returns:
    ``(sample, pullback)``: ``sample`` is :math:`g(x; \zeta)` (``inner_fn``'s output
    structure) and ``pullback(v)`` returns :math:`J_g(x; \zeta)^\top v`, a pytree shaped
    like ``params``, for a cotangent ``v`` shaped like ``sample``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> r = jnp.array([0.5, -1.0])  # one portfolio example: g(x) = (r.x, (r.x)^2)
    >>> g = lambda x: jnp.stack([r @ x, (r @ x) ** 2])
    >>> sample, pullback = estimators.inner_vjp(g, jnp.array([1.0, 2.0]))
    >>> sample.tolist()
    [-1.5, 2.25]
    >>> pullback(jnp.array([0.0, 1.0])).tolist()  # J_g^T e_2 = 2 (r.x) r
    [-1.5, 3.0]
  """
  sample, vjp_fn = jax.vjp(inner_fn, params)
  return sample, lambda cotangent: vjp_fn(cotangent)[0]


def compositional_grad(
  pullback: Callable[[PyTree], PyTree], outer_fn: Callable[[PyTree], jax.Array], y: PyTree
) -> PyTree:
  r"""The compositional gradient :math:`J_g(x; \zeta)^\top \nabla f(y)` at a tracked :math:`y`.

  The outer gradient :math:`\nabla f(y)` (``jax.grad(outer_fn)``) is pulled back through
  :math:`g` by ``pullback`` from :func:`inner_vjp`. With :math:`y = g(x; \zeta)` this is
  the plain gradient of :math:`f(g(x; \zeta))`; with a tracked :math:`y` (a moving average,
  a hybrid estimate) it is the algorithm's lower-bias estimate. Add :math:`\nabla h` with
  ``fedco.extend.add_grads``.

  Args:
    pullback: :math:`v \mapsto J_g(x; \zeta)^\top v`, the second output of
      :func:`inner_vjp`.
    outer_fn: ``y -> f(y; xi)``, a scalar function of the inner value (its sample
      :math:`\xi` bound).
    y: the inner estimate at which :math:`\nabla f` is taken (the structure of
      :math:`g`'s output).

  Returns:
    :math:`J_g(x; \zeta)^\top \nabla f(y)`, a pytree shaped like the ``params`` the
    pullback was taken at.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> r = jnp.array([0.5, -1.0])
    >>> g = lambda x: jnp.stack([r @ x, (r @ x) ** 2])  # portfolio: (mean, 2nd moment)
    >>> f = lambda y: -y[0] + (y[1] - y[0] ** 2)  # f(a, b) = -a + lam (b - a^2), lam = 1
    >>> sample, pullback = estimators.inner_vjp(g, jnp.array([1.0, 2.0]))
    >>> estimators.compositional_grad(pullback, f, sample).tolist()  # y = the fresh sample
    [-0.5, 1.0]
    >>> estimators.compositional_grad(pullback, f, jnp.array([0.0, 2.0])).tolist()  # tracked y
    [-2.0, 4.0]
  """
  return pullback(jax.grad(outer_fn)(y))


def value_and_compositional_grad(inner_fn, outer_fn, params, y: Optional[PyTree] = None):
  r"""The fresh sample :math:`g(x; \zeta)` and :math:`J_g(x; \zeta)^\top \nabla f(y)` in one pass.

  :func:`inner_vjp` followed by :func:`compositional_grad`. With deterministic :math:`g`
  and :math:`f` and ``y=None`` the gradient equals ``jax.grad(lambda x: f(g(x)))(x)`` (a
  test checks this); a tracked ``y`` gives the tracker-based estimate at the same cost.

  Args:
    inner_fn: ``x -> g(x; zeta)`` with the sample bound.
    outer_fn: ``y -> f(y; xi)``, a scalar function of the inner value.
    params: the point :math:`x` (any pytree).
    y: the inner estimate at which :math:`\nabla f` is taken; ``None`` (default) uses the
      fresh sample :math:`g(x; \zeta)` itself.

  Returns:
    ``(sample, grad)``: :math:`g(x; \zeta)` (for the tracker's update) and
    :math:`J_g(x; \zeta)^\top \nabla f(y)`, shaped like ``params``.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> r = jnp.array([0.5, -1.0])
    >>> g = lambda x: jnp.stack([r @ x, (r @ x) ** 2])
    >>> f = lambda y: -y[0] + (y[1] - y[0] ** 2)
    >>> x = jnp.array([1.0, 2.0])
    >>> sample, grad = estimators.value_and_compositional_grad(g, f, x)
    >>> sample.tolist(), grad.tolist()
    ([-1.5, 2.25], [-0.5, 1.0])
    >>> jax.grad(lambda x: f(g(x)))(x).tolist()  # the same, without a tracker
    [-0.5, 1.0]
  """
  sample, pullback = inner_vjp(inner_fn, params)
  return sample, compositional_grad(pullback, outer_fn, sample if y is None else y)


class Tracker(NamedTuple):
  r"""A pure inner-value tracker: a running estimate :math:`y` of :math:`g(x)`.

  Made by :func:`fresh`, :func:`moving_average` and :func:`hybrid` (or by hand); it holds no
  state of its own, so :math:`y` lives in the algorithm's state. The estimate has the
  pytree structure of :math:`g`'s output.

  Attributes:
    init: ``sample -> y``; the first estimate from the first sample.
    update: ``(y, s_new, s_old) -> y``: the new estimate from the fresh sample
      :math:`s_\text{new} = g(x_\text{new}; \zeta)`; ``s_old`` (the same sample
      :math:`\zeta` at the previous iterate, :math:`g(x_\text{old}; \zeta)`) is used only
      by the hybrid tracker and may be ``None`` for the others.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> tracker = estimators.moving_average(0.5)
    >>> y = tracker.init(jnp.array([1.0, 2.0]))
    >>> for s_new in (jnp.array([3.0, 4.0]), jnp.array([3.0, 4.0])):
    ...   y = tracker.update(y, s_new, None)
    >>> y.tolist()  # half way, then three quarters of the way, to the new samples
    [2.5, 3.5]
  """

  init: Callable[[PyTree], PyTree]
  update: Callable[[PyTree, PyTree, Optional[PyTree]], PyTree]


def _identity(sample):
  return sample


def fresh() -> Tracker:
  r"""The tracker with no memory: :math:`y = s_\text{new}`.

  The estimate is the latest sample (ComFedL / Local-BSGD, FedAvg-CO): biased for a
  nonlinear :math:`f` unless the sample is large, but free.

  Returns:
    A :class:`Tracker` whose ``init`` and ``update`` return the sample unchanged.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> tracker = estimators.fresh()
    >>> y = tracker.init(jnp.array([1.0, 2.0]))
    >>> tracker.update(y, jnp.array([3.0, 4.0]), None).tolist()
    [3.0, 4.0]
  """
  # cast: mypy cannot infer a lambda with a default argument against the Callable field
  return Tracker(_identity, cast(Callable[..., PyTree], lambda y, s_new, s_old=None: s_new))


def moving_average(rate) -> Tracker:
  r"""The moving-average tracker: :math:`y = (1 - a)\, y + a\, s_\text{new}`.

  The SCGD estimate (Local-SCGD with :math:`a = \gamma`, Local-SCGDM with
  :math:`a = \gamma\eta`, DS-FedDRO with :math:`a = \beta`): it averages samples over steps,
  so its bias shrinks with :math:`a`. ``init`` starts from the first sample.

  Args:
    rate: the weight :math:`a` of the new sample, in :math:`(0, 1]` (``1`` is
      :func:`fresh`); a Python or traced scalar (an injected hyperparameter). Not checked
      here: check it in the algorithm's factory (``fedco.extend.bounded``).

  Returns:
    A :class:`Tracker` (``s_old`` is ignored).

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> tracker = estimators.moving_average(0.25)
    >>> y = tracker.init(jnp.array([0.0, 4.0]))
    >>> tracker.update(y, jnp.array([4.0, 0.0]), None).tolist()
    [1.0, 3.0]
  """

  def update(y, s_new, s_old=None):
    return jax.tree.map(lambda a, b: (1 - rate) * a + rate * b, y, s_new)

  return Tracker(_identity, update)


def hybrid(beta) -> Tracker:
  r"""The hybrid (STORM-type) tracker of FedDRO.

  .. math::

    y = (1 - \beta)\,\bigl(y - g(x_\text{old}; \zeta)\bigr) + g(x_\text{new}; \zeta),

  with one sample :math:`\zeta` evaluated at both the previous and the new iterate
  (``s_old`` and ``s_new``): a recursive variance-reduced estimate whose correction
  :math:`s_\text{new} - s_\text{old}` follows the change of :math:`x`. ``init`` starts from
  the first sample.

  Args:
    beta: :math:`\beta \in (0, 1]` (``1`` is :func:`fresh`); a Python or traced scalar. Not
      checked here: check it in the algorithm's factory.

  Returns:
    A :class:`Tracker` whose ``update`` requires ``s_old``.

  Raises:
    ValueError: (from ``update``) ``s_old`` is ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import estimators
    >>> tracker = estimators.hybrid(0.5)
    >>> y = tracker.init(jnp.array([1.0, 2.0]))
    >>> s_old, s_new = jnp.array([2.0, 2.0]), jnp.array([3.0, 4.0])  # g(x_old), g(x_new)
    >>> tracker.update(y, s_new, s_old).tolist()  # 0.5 * (y - s_old) + s_new
    [2.5, 4.0]
  """

  def update(y, s_new, s_old):
    if s_old is None:
      raise ValueError("the hybrid tracker needs s_old = g(x_old; zeta), got None")
    return jax.tree.map(lambda a, n, o: (1 - beta) * (a - o) + n, y, s_new, s_old)

  return Tracker(_identity, update)


__all__ = [
  "inner_vjp",
  "compositional_grad",
  "value_and_compositional_grad",
  "Tracker",
  "fresh",
  "moving_average",
  "hybrid",
]
