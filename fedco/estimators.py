"""The compositional gradient oracle and the inner-value trackers (SPEC sections 0 and 1).

The oracle never forms ``J_g``: one ``jax.vjp`` of ``g(.; zeta)`` at ``x`` yields both the
fresh inner sample ``g(x; zeta)`` (which the trackers need) and a function that pulls a
cotangent back, so ``z = J_g(x; zeta)^T grad f(y)`` costs one forward and one backward pass
of ``g``, whatever ``y`` the tracker produced in between.

Trackers keep a running estimate ``y`` of the inner value (same pytree structure as ``g``'s
output). They are pure ``(init, update)`` pairs:

================  ===========================================================  ===============
tracker           update when a fresh sample ``s_new = g(x_new; zeta)`` arrives  used by
================  ===========================================================  ===============
``fresh``         ``y = s_new``                                                  ComFedL
``moving_average`` ``y = (1 - a) y + a s_new``                                   SCGD(M), DS-FedDRO
``hybrid``        ``y = (1 - beta)(y - g(x_old; zeta)) + g(x_new; zeta)``        FedDRO
================  ===========================================================  ===============
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax

PyTree = Any


def inner_vjp(inner_fn: Callable[[PyTree], PyTree], params: PyTree):
  """One pass of the inner map: ``(g(x; zeta), v -> J_g(x; zeta)^T v)``.

  Args:
    inner_fn: ``x -> g(x; zeta)`` with the sample ``zeta`` already bound.
    params: the point ``x``.

  Returns:
    ``(sample, pullback)`` where ``pullback(v)`` returns a pytree shaped like ``params``.
  """
  sample, vjp_fn = jax.vjp(inner_fn, params)
  return sample, lambda cotangent: vjp_fn(cotangent)[0]


def compositional_grad(
  pullback: Callable[[PyTree], PyTree], outer_fn: Callable[[PyTree], jax.Array], y: PyTree
) -> PyTree:
  """``J_g^T grad f(y)``: the outer gradient at the tracked ``y`` pulled back through ``g``."""
  return pullback(jax.grad(outer_fn)(y))


def value_and_compositional_grad(inner_fn, outer_fn, params, y: Optional[PyTree] = None):
  """Fresh sample and ``J_g(x)^T grad f(y)``; ``y`` defaults to the fresh sample itself.

  With deterministic ``g`` and ``f`` and ``y=None`` the gradient equals
  ``jax.grad(lambda x: f(g(x)))(x)`` (a test checks this).
  """
  sample, pullback = inner_vjp(inner_fn, params)
  return sample, compositional_grad(pullback, outer_fn, sample if y is None else y)


class Tracker(NamedTuple):
  """A pure inner-value tracker.

  Attributes:
    init: ``sample -> y``; the first estimate.
    update: ``(y, s_new, s_old) -> y``; ``s_old`` (the same sample at the previous iterate) is
      used only by the hybrid tracker and may be ``None`` for the others.
  """

  init: Callable[[PyTree], PyTree]
  update: Callable[[PyTree, PyTree, Optional[PyTree]], PyTree]


def _identity(sample):
  return sample


def fresh() -> Tracker:
  """No memory: ``y = s_new``."""
  return Tracker(_identity, lambda y, s_new, s_old=None: s_new)


def moving_average(rate) -> Tracker:
  """``y = (1 - rate) y + rate s_new`` (rate may be a traced scalar)."""

  def update(y, s_new, s_old=None):
    return jax.tree.map(lambda a, b: (1 - rate) * a + rate * b, y, s_new)

  return Tracker(_identity, update)


def hybrid(beta) -> Tracker:
  """STORM-type ``y = (1 - beta)(y - s_old) + s_new``; ``s_old``, ``s_new`` share one sample."""

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
