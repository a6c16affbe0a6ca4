"""Compositional problems as pure per-example functions.

A problem is three pure functions of *one example* (SPEC section 0):

* ``inner(params, example) -> pytree``: the inner map ``g(x; zeta)``; any pytree of arrays.
* ``outer(y) -> scalar`` or ``outer(y, example) -> scalar``: the outer function
  ``f(y; xi)``. ``outer_uses_data`` says which signature it has.
* ``extra(params, example) -> scalar`` (optional): the non-compositional term ``h(x; xi)``.
* ``outer_link(v) -> scalar`` (optional, with a data-dependent outer): applied to the
  *mean* of the per-example outer values, ``f(y; B) = link(sum_i w_i outer(y; xi_i))``, for
  outers that are a function of an expected loss, such as DA-MAML's ``exp(L(y)/gamma)``
  on a task whose examples are single points (the batch gives the plug-in estimate).

fedco forms every mini-batch value as a weighted mean over examples,
``g(x; B) = sum_i w_i g(x; zeta_i)`` with ``sum_i w_i = 1``. Weights let one code path serve
mini-batches (``w_i = 1/b``), a client's whole padded data set (``w_i = 1/n_k`` on real rows,
0 on padding) and exact evaluation.

Two problem classes (``kind``):

* ``"local"`` (local-inner): ``F(x) = 1/K sum_k [f_k(g_k(x)) + h_k(x)]``.
* ``"global"`` (global-inner): ``Phi(x) = h(x) + f(g(x))`` with ``g = 1/K sum_k g_k`` and
  ``h = 1/K sum_k h_k``.

A problem with ``inner=None`` is an ordinary (non-compositional) one, ``1/K sum_k h_k``;
plain FedAvg and the other ERM baselines train on those.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

PyTree = Any
Batch = Any  # a pytree of arrays with a leading example axis
_KINDS = ("local", "global")


def weighted_mean(values: PyTree, weights: jax.Array) -> PyTree:
  """``sum_i w_i v_i`` over the leading axis of every leaf of ``values``."""

  def _reduce(v):
    w = weights.reshape(weights.shape + (1,) * (v.ndim - 1)).astype(v.dtype)
    return jnp.sum(w * v, axis=0)

  return jax.tree.map(_reduce, values)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
  """A compositional (or plain) stochastic problem built from per-example functions.

  Attributes:
    inner: ``(params, example) -> pytree``, the inner map ``g``; ``None`` for a plain problem.
    outer: ``(y) -> scalar`` or ``(y, example) -> scalar``, the outer function ``f``.
    extra: ``(params, example) -> scalar``, the non-compositional term ``h``; may be ``None``.
    kind: ``"local"`` (local-inner) or ``"global"`` (global-inner).
    outer_uses_data: whether ``outer`` takes an example (``f_k(y; xi)``).
    name: a label used in metrics and logs.
    outer_link: optional scalar function applied to the (weighted) mean of the outer's
      values; ``None`` is the identity.
    num_clients: the number of clients the problem is written for (the client-level DRO
      log form's ``K``); a simulation on other data is refused. ``None``: any.
  """

  inner: Optional[Callable[..., PyTree]]
  outer: Optional[Callable[..., jax.Array]]
  extra: Optional[Callable[..., jax.Array]] = None
  kind: str = "local"
  outer_uses_data: bool = False
  name: str = "problem"
  outer_link: Optional[Callable[[jax.Array], jax.Array]] = None
  num_clients: Optional[int] = None

  def __post_init__(self):
    if self.kind not in _KINDS:
      raise ValueError(f"kind must be one of {_KINDS}, got {self.kind!r}")
    if (self.inner is None) != (self.outer is None):
      raise ValueError(
        "inner and outer must both be given (a compositional problem) or both be None "
        f"(a plain problem); got inner={self.inner!r}, outer={self.outer!r}"
      )
    if self.inner is None and self.extra is None:
      raise ValueError("a problem needs an inner/outer pair, an extra term, or both")
    if self.outer_link is not None and self.outer is None:
      raise ValueError("outer_link needs an outer function (a compositional problem)")
    for field in ("inner", "outer", "extra", "outer_link"):
      fn = getattr(self, field)
      if fn is not None and not callable(fn):
        raise ValueError(f"{field} must be callable or None, got {fn!r}")

  @property
  def compositional(self) -> bool:
    return self.inner is not None

  # ---- mini-batch values -------------------------------------------------------------

  def inner_value(self, params: PyTree, batch: Batch, weights: jax.Array) -> PyTree:
    """``g(x; B) = sum_i w_i g(x; zeta_i)``."""
    return weighted_mean(jax.vmap(self.inner, in_axes=(None, 0))(params, batch), weights)

  def outer_value(self, y: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """``f(y; B)``; deterministic outer functions ignore the batch."""
    if not self.outer_uses_data:
      return self._link(self.outer(y))
    return self._link(weighted_mean(jax.vmap(self.outer, in_axes=(None, 0))(y, batch), weights))

  def _link(self, value):
    return value if self.outer_link is None else self.outer_link(value)

  def unlinked_outer_value(self, y: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """The mean outer value before ``outer_link`` (DA-MAML's query loss of ``y``)."""
    return weighted_mean(jax.vmap(self.outer, in_axes=(None, 0))(y, batch), weights)

  def extra_value(self, params: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """``h(x; B)``, or 0 when the problem has no extra term."""
    if self.extra is None:
      return jnp.zeros((), jnp.float32)
    return weighted_mean(jax.vmap(self.extra, in_axes=(None, 0))(params, batch), weights)

  def extra_grad(self, params: PyTree, batch: Batch, weights: jax.Array) -> PyTree:
    """``grad h(x; B)``; zeros shaped like ``params`` when there is no extra term."""
    if self.extra is None:
      return jax.tree.map(jnp.zeros_like, params)
    return jax.grad(self.extra_value)(params, batch, weights)

  # ---- whole-data objectives ---------------------------------------------------------

  def client_objective(self, params: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """One client's own objective ``f_k(g_k(x)) + h_k(x)`` on the given (weighted) data."""
    value = self.extra_value(params, batch, weights)
    if self.compositional:
      y = self.inner_value(params, batch, weights)
      value = value + self.outer_value(y, batch, weights)
    return value

  def evaluate(
    self, params: PyTree, examples: Batch, owner: jax.Array, weights: jax.Array, num_clients: int
  ):
    """The exact objective and every client's own loss, from all clients' data.

    The data is a flat list of (example, owner) pairs: ``examples`` leaves are ``[M, ...]``,
    ``owner`` is ``int32 [M]`` and ``weights`` is ``[M]`` with each owner's weights summing to
    1 (``1/n_k``), so a segment sum gives client means. Cost is ``M = sum_k n_k``.

    Returns:
      ``(objective, client_losses)``. Local-inner: ``objective = 1/K sum_k f_k(g_k(x)) +
      h_k(x)`` and ``client_losses[k] = f_k(g_k(x)) + h_k(x)``. Global-inner:
      ``objective = f(1/K sum_k g_k(x)) + 1/K sum_k h_k(x)`` and ``client_losses[k] =
      f(g_k(x)) + h_k(x)``. Plain: ``client_losses[k] = h_k(x)``.
    """

    def per_client(values):
      return jax.tree.map(
        lambda v: jax.ops.segment_sum(
          weights.reshape(weights.shape + (1,) * (v.ndim - 1)).astype(v.dtype) * v,
          owner,
          num_segments=num_clients,
        ),
        values,
      )

    losses = jnp.zeros((num_clients,), jnp.float32)
    if self.extra is not None:
      losses = losses + per_client(jax.vmap(self.extra, in_axes=(None, 0))(params, examples))
    if not self.compositional:
      return jnp.mean(losses), losses
    g_k = per_client(jax.vmap(self.inner, in_axes=(None, 0))(params, examples))
    if self.outer_uses_data:
      y_owner = jax.tree.map(lambda a: a[owner], g_k)
      f_k = jax.vmap(self._link)(per_client(jax.vmap(self.outer)(y_owner, examples)))
    else:
      f_k = jax.vmap(lambda y: self._link(self.outer(y)))(g_k)
    client_losses = losses + f_k
    if self.kind == "local":
      return jnp.mean(client_losses), client_losses
    g = jax.tree.map(lambda a: jnp.mean(a, axis=0), g_k)
    if self.outer_uses_data:
      f = self._link(
        weighted_mean(jax.vmap(self.outer, in_axes=(None, 0))(g, examples), weights / num_clients)
      )
    else:
      f = self._link(self.outer(g))
    return jnp.mean(losses) + f, client_losses


def local_inner(
  inner, outer, extra=None, *, outer_uses_data=False, name="local_inner", outer_link=None
):
  """A local-inner problem ``1/K sum_k f_k(g_k(x)) + h_k(x)`` (ComFedL, SCGD(M), MAML)."""
  return Problem(inner, outer, extra, "local", outer_uses_data, name, outer_link)


def global_inner(inner, outer, extra=None, *, outer_uses_data=False, name="global_inner"):
  """A global-inner problem ``h(x) + f(1/K sum_k g_k(x))`` (FedDRO, DS-FedDRO, fairness)."""
  return Problem(inner, outer, extra, "global", outer_uses_data, name)


def plain(loss, *, name="erm"):
  """A non-compositional problem ``1/K sum_k E loss(x; xi)`` (FedAvg and ERM baselines)."""
  return Problem(None, None, loss, "local", False, name)
