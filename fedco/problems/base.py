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
  r"""The weighted mean :math:`\sum_i w_i v_i` over the leading axis of every leaf.

  This is how fedco forms every mini-batch value from per-example ones: ``w_i = 1/b`` on a
  mini-batch, ``1/n_k`` on a client's real rows and 0 on its padding. The weights are not
  normalised here; pass weights that sum to 1 for a mean.

  Args:
    values: a pytree whose leaves share a leading example axis ``[M, ...]`` (e.g. the
      ``jax.vmap`` of an inner map over a batch).
    weights: ``[M]`` weights, one per example; cast to each leaf's dtype.

  Returns:
    A pytree with the structure of ``values`` whose leaves drop the leading axis
    (``[...]``).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> values = {"g": jnp.array([[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]])}
    >>> weights = jnp.array([0.5, 0.5, 0.0])  # the third row is padding
    >>> fedco.problems.weighted_mean(values, weights)["g"].tolist()
    [2.0, 3.0]
  """

  def _reduce(v):
    w = weights.reshape(weights.shape + (1,) * (v.ndim - 1)).astype(v.dtype)
    return jnp.sum(w * v, axis=0)

  return jax.tree.map(_reduce, values)


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
  r"""A compositional (or plain) stochastic problem built from per-example functions.

  On a (weighted) batch :math:`B` of examples the three functions give

  .. math::

    g(x; B) = \sum_i w_i \, \mathrm{inner}(x, \zeta_i), \qquad
    f(y; B) = \mathrm{link}\Big(\sum_i w_i \, \mathrm{outer}(y, \xi_i)\Big)
    \ \text{or}\ \mathrm{outer}(y), \qquad
    h(x; B) = \sum_i w_i \, \mathrm{extra}(x, \xi_i),

  and ``kind`` says how clients' values combine (SPEC section 0): local-inner
  :math:`F(x) = \frac{1}{K} \sum_k [f_k(g_k(x)) + h_k(x)]` or global-inner
  :math:`\Phi(x) = \frac{1}{K} \sum_k h_k(x) + f(\frac{1}{K} \sum_k g_k(x))`. With
  ``inner = outer = None`` it is a plain problem :math:`\frac{1}{K} \sum_k h_k(x)`.
  Usually built by :func:`local_inner`, :func:`global_inner`, :func:`plain` or one of the
  SPEC problems (:mod:`fedco.problems`); the algorithms and the simulator call the methods
  (``inner_value``, ``outer_value``, ``extra_value``, ``client_objective``, ``evaluate``).

  Attributes:
    inner: ``inner(params, example) -> pytree``, the inner map :math:`g(x; \zeta)` (any
      pytree of arrays); ``None`` for a plain problem.
    outer: ``outer(y) -> scalar``, or ``outer(y, example) -> scalar`` when
      ``outer_uses_data``: the outer function :math:`f(y)` or :math:`f(y; \xi)`, where ``y``
      has ``inner``'s output structure; ``None`` for a plain problem.
    extra: ``extra(params, example) -> scalar``, the non-compositional term
      :math:`h(x; \xi)`; ``None`` (the default) for none.
    kind: ``"local"`` (local-inner, the default) or ``"global"`` (global-inner).
    outer_uses_data: whether ``outer`` takes an example (:math:`f_k(y; \xi)`, averaged over
      the batch); default ``False``: a deterministic ``outer(y)``.
    name: a label used in metrics and logs; default ``"problem"``.
    outer_link: ``link(v) -> scalar`` applied to the weighted *mean* of a data-dependent
      outer's values, :math:`f(y; B) = \mathrm{link}(\sum_i w_i\, \mathrm{outer}(y, \xi_i))`,
      for outers that are a function of an expected loss (DA-MAML's
      :math:`\exp(L(y)/\gamma)`); ``None`` (the default) is the identity.
    num_clients: the number of clients the problem is written for (the client-level DRO
      log form's ``K``); a simulation on other data is refused. ``None`` (the default): any.

  Raises:
    ValueError: if ``kind`` is not ``"local"`` or ``"global"``; if only one of ``inner`` and
      ``outer`` is given; if there is neither an ``inner``/``outer`` pair nor an ``extra``;
      if ``outer_link`` is given without ``outer``; or if a function field is not callable.

  Examples:
    A global-inner problem :math:`\Phi(x) = x^2/2 + (\mathbb{E}[a]\,x)^2`, evaluated
    exactly on two clients of two examples each (``weights`` are ``1/n_k``):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.Problem(
    ...   inner=lambda x, ex: ex["a"] * x,  # g(x; zeta) = a x
    ...   outer=lambda y: y**2,  # f(y) = y^2
    ...   extra=lambda x, ex: 0.5 * x**2,  # h(x; xi) = x^2 / 2
    ...   kind="global",
    ... )
    >>> examples = {"a": jnp.array([1.0, 3.0, 0.0, 2.0])}
    >>> owner = jnp.array([0, 0, 1, 1])
    >>> weights = jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, client_losses = evaluate(jnp.array(1.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4), [round(float(v), 4) for v in client_losses])
    2.75 [4.5, 1.5]
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
    """Whether the problem has an inner/outer pair (``False`` for a plain problem)."""
    return self.inner is not None

  # ---- mini-batch values -------------------------------------------------------------

  def inner_value(self, params: PyTree, batch: Batch, weights: jax.Array) -> PyTree:
    """``g(x; B) = sum_i w_i g(x; zeta_i)``."""
    assert self.inner is not None, "a plain problem has no inner function"
    return weighted_mean(jax.vmap(self.inner, in_axes=(None, 0))(params, batch), weights)

  def outer_value(self, y: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """``f(y; B)``; deterministic outer functions ignore the batch."""
    assert self.outer is not None, "a plain problem has no outer function"
    if not self.outer_uses_data:
      return self._link(self.outer(y))
    return self._link(weighted_mean(jax.vmap(self.outer, in_axes=(None, 0))(y, batch), weights))

  def _link(self, value):
    return value if self.outer_link is None else self.outer_link(value)

  def unlinked_outer_value(self, y: PyTree, batch: Batch, weights: jax.Array) -> jax.Array:
    """The mean outer value before ``outer_link`` (DA-MAML's query loss of ``y``)."""
    assert self.outer is not None, "a plain problem has no outer function"
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
    1 (``1/n_k``), so a segment sum gives client means. Cost is ``M = sum_k n_k``. Pure and
    jittable with ``num_clients`` static (the examples of :class:`Problem` jit it: one small
    compiled program is quicker than many eager operations).

    Args:
      params: the parameters ``x``.
      examples: a pytree whose leaves are ``[M, ...]``: every client's examples, in any order.
      owner: ``int32 [M]``, each example's client in ``[0, num_clients)``; an owner
        ``>= num_clients`` (padding) is dropped.
      weights: ``[M]``, each client's summing to 1 (``1/n_k`` on its rows, 0 on padding).
      num_clients: ``K``, a Python ``int``.

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
    inner, outer = self.inner, self.outer
    assert inner is not None and outer is not None  # compositional: both given (__post_init__)
    g_k = per_client(jax.vmap(inner, in_axes=(None, 0))(params, examples))
    if self.outer_uses_data:
      y_owner = jax.tree.map(lambda a: a[owner], g_k)
      f_k = jax.vmap(self._link)(per_client(jax.vmap(outer)(y_owner, examples)))
    else:
      f_k = jax.vmap(lambda y: self._link(outer(y)))(g_k)
    client_losses = losses + f_k
    if self.kind == "local":
      return jnp.mean(client_losses), client_losses
    g = jax.tree.map(lambda a: jnp.mean(a, axis=0), g_k)
    if self.outer_uses_data:
      f = self._link(
        weighted_mean(jax.vmap(outer, in_axes=(None, 0))(g, examples), weights / num_clients)
      )
    else:
      f = self._link(outer(g))
    return jnp.mean(losses) + f, client_losses


def local_inner(
  inner, outer, extra=None, *, outer_uses_data=False, name="local_inner", outer_link=None
):
  r"""A local-inner problem :math:`\frac{1}{K} \sum_k [f_k(g_k(x)) + h_k(x)]`.

  Each client composes its *own* inner expectation (SPEC section 0),

  .. math::

    F(x) = \frac{1}{K} \sum_{k=1}^K \Big[ f_k\big(\mathbb{E}_{\zeta \sim D_k}
      g(x; \zeta)\big) + \mathbb{E}_{\xi \sim D_k} h(x; \xi) \Big],

  where :math:`f_k(y) = \mathrm{outer}(y)` for a deterministic outer, or
  :math:`f_k(y) = \mathrm{link}(\mathbb{E}_{\xi \sim D_k} \mathrm{outer}(y, \xi))` when
  ``outer_uses_data`` (``link`` the identity unless ``outer_link`` is given). Solved by
  ComFedL, Local-SCGD(M), Local-MOML and the meta-learning baselines (FedMAML, Per-FedAvg,
  TR-MAML); MAML and ComFedL's client-level DRO are local-inner.

  Args:
    inner: ``inner(params, example) -> pytree``, the per-example inner map
      :math:`g(x; \zeta)`; any pytree of arrays (its size is SPEC's ``p``).
    outer: ``outer(y) -> scalar`` (the default), or ``outer(y, example) -> scalar`` with
      ``outer_uses_data=True``; ``y`` has ``inner``'s output structure.
    extra: ``extra(params, example) -> scalar``, the per-example non-compositional term
      :math:`h(x; \xi)`; ``None`` (the default) for none.
    outer_uses_data: ``True`` when ``outer`` takes an example; its batch value is then the
      weighted mean :math:`\sum_i w_i\, \mathrm{outer}(y, \xi_i)` over the outer batch.
      Default ``False``.
    name: a label used in metrics and logs; default ``"local_inner"``.
    outer_link: ``link(v) -> scalar``, applied to that weighted mean of a data-dependent
      outer, :math:`f_k(y; B) = \mathrm{link}(\sum_i w_i\, \mathrm{outer}(y, \xi_i))`: for
      an outer that is a nonlinear function of an *expected* loss, such as DA-MAML's
      :math:`\exp(L_k(y)/\gamma)` on a task whose examples are single points (the batch gives
      the plug-in estimate). ``None`` (the default) is the identity.

  Returns:
    A :class:`Problem` with ``kind="local"``.

  Raises:
    ValueError: if only one of ``inner`` and ``outer`` is ``None`` (or all three functions
      are), a function is not callable, or ``outer_link`` comes without ``outer``.

  Examples:
    :math:`F(x) = \frac{1}{K} \sum_k (\mathbb{E}_{D_k}[a]\, x)^2` on two clients whose mean
    ``a`` is 2 and 1; compare :func:`global_inner`'s :math:`(1.5 x)^2` on the same data:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.local_inner(lambda x, ex: ex["a"] * x, lambda y: y**2)
    >>> examples = {"a": jnp.array([1.0, 3.0, 0.0, 2.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, client_losses = evaluate(jnp.array(1.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4), [round(float(v), 4) for v in client_losses])
    2.5 [4.0, 1.0]
  """
  return Problem(inner, outer, extra, "local", outer_uses_data, name, outer_link)


def global_inner(inner, outer, extra=None, *, outer_uses_data=False, name="global_inner"):
  r"""A global-inner problem :math:`h(x) + f(\frac{1}{K} \sum_k g_k(x))`.

  The outer function sees the *federation's* mean inner value (SPEC section 0),

  .. math::

    \Phi(x) = h(x) + f(g(x)), \qquad
    g(x) = \frac{1}{K} \sum_{k=1}^K \mathbb{E}_{\zeta \sim D_k} g(x; \zeta), \qquad
    h(x) = \frac{1}{K} \sum_{k=1}^K \mathbb{E}_{\xi \sim D_k} h(x; \xi),

  so clients count equally whatever their sizes, and with ``outer_uses_data`` the outer is
  averaged the same way, :math:`f(y) = \frac{1}{K} \sum_k \mathbb{E}_{\xi \sim D_k}
  \mathrm{outer}(y, \xi)`. No client can compute :math:`g` alone: FedDRO, DS-FedDRO,
  GCIVR and MBSGD estimate it across clients (FedAvg-CO, which composes local estimates, is
  SPEC 2.4's failing baseline). Sample-level DRO, the fairness problem and the portfolio
  are global-inner.

  Args:
    inner: ``inner(params, example) -> pytree``, the per-example inner map
      :math:`g(x; \zeta)`; any pytree of arrays.
    outer: ``outer(y) -> scalar`` (the default), or ``outer(y, example) -> scalar`` with
      ``outer_uses_data=True``; ``y`` has ``inner``'s output structure.
    extra: ``extra(params, example) -> scalar``, the per-example non-compositional term
      :math:`h(x; \xi)`; ``None`` (the default) for none.
    outer_uses_data: ``True`` when ``outer`` takes an example (its batch value is the
      weighted mean over the outer batch); default ``False``.
    name: a label used in metrics and logs; default ``"global_inner"``.

  Returns:
    A :class:`Problem` with ``kind="global"`` (no ``outer_link``; build :class:`Problem`
    directly for one).

  Raises:
    ValueError: if only one of ``inner`` and ``outer`` is ``None`` (or all three functions
      are) or a function is not callable.

  Examples:
    :math:`\Phi(x) = (\mathbb{E}[a]\, x)^2` with the mean ``a`` taken over both clients
    (client means 2 and 1, so :math:`(1.5 x)^2`); ``client_losses[k]`` is
    :math:`f(g_k(x)) + h_k(x)`:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.global_inner(lambda x, ex: ex["a"] * x, lambda y: y**2)
    >>> examples = {"a": jnp.array([1.0, 3.0, 0.0, 2.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, client_losses = evaluate(jnp.array(1.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4), [round(float(v), 4) for v in client_losses])
    2.25 [4.0, 1.0]
  """
  return Problem(inner, outer, extra, "global", outer_uses_data, name)


def plain(loss, *, name="erm"):
  r"""A plain (non-compositional) problem :math:`\frac{1}{K} \sum_k h_k(x)`.

  Ordinary federated empirical risk minimisation, :math:`\frac{1}{K} \sum_k
  \mathbb{E}_{\xi \sim D_k} \ell(x; \xi)`: the problem has no inner/outer pair, only the
  term :math:`h_k(x) = \mathbb{E}_{\xi \sim D_k} \ell(x; \xi)`. FedAvg and the other ERM
  baselines train on it.

  Args:
    loss: ``loss(params, example) -> scalar``, the per-example loss :math:`\ell(x; \xi)`.
    name: a label used in metrics and logs; default ``"erm"``.

  Returns:
    A :class:`Problem` with ``inner = outer = None`` and ``extra = loss``.

  Raises:
    ValueError: if ``loss`` is ``None`` or not callable.

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.plain(lambda x, ex: (x - ex["t"]) ** 2)
    >>> examples = {"t": jnp.array([0.0, 2.0, 3.0, 3.0])}
    >>> owner, weights = jnp.array([0, 0, 1, 1]), jnp.full((4,), 0.5)
    >>> evaluate = jax.jit(problem.evaluate, static_argnames="num_clients")
    >>> objective, client_losses = evaluate(jnp.array(1.0), examples, owner, weights, num_clients=2)
    >>> print(round(float(objective), 4), [round(float(v), 4) for v in client_losses])
    2.5 [1.0, 4.0]
  """
  return Problem(None, None, loss, "local", False, name)
