"""Trackers of the inner value, filled from the first inner sample: :class:`Pending`.

``init(params)`` cannot know the structure of the inner value ``g(x_0; zeta_0)``, so its
trackers (``y``, ``u``) start as :class:`Pending` placeholders (:func:`pending_or`);
:func:`init_trackers` (the runtime, before a loop) or :func:`fill_pending` (the first
``update``) fill them, and :func:`has_pending` tells whether any is left.
"""

from __future__ import annotations

import functools
import types
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fedco import _validate


@jax.tree_util.register_pytree_node_class
class Pending:
  """A tracker not yet filled: ``init(params)`` cannot know the inner value's structure.

  A pytree with no leaves whose static ``kind`` says how :func:`init_trackers` fills it:
  ``"inner"`` takes ``fill(inner_value)`` (the inner value itself without a ``fill``);
  ``"inner_jacobian"`` zeros shaped ``[p, *param.shape]`` for the flattened inner value's
  size ``p`` (GCIVR's ``J``). Algorithms create it with :func:`pending_or` and fill it with
  :func:`fill_pending`. The fill is part of the state's structure: two placeholders are
  equal when their kinds are and their fills compute the same (the same function; or the
  same code, defaults and captured values, such as a lambda made anew by each ``init``
  call; or a ``functools.partial`` of such), so states from two ``init`` calls share one
  structure, and fills that capture other values (or arrays) give other structures.

  Args:
    kind: ``"inner"`` (default) or ``"inner_jacobian"``.
    fill: ``"inner"`` only: ``inner_value -> tracker`` (``None``: the inner value itself).

  Raises:
    ValueError: ``kind`` is not one of those, a ``fill`` is given that is not callable or
      for ``"inner_jacobian"``, or the fill captures a traced value (a hyperparameter being
      injected or swept: a fill must depend on the inner value alone).

  Examples:
    >>> import jax
    >>> from fedco import extend
    >>> tracker = extend.Pending()
    >>> tracker, jax.tree.leaves(tracker)
    (Pending('inner'), [])
    >>> extend.has_pending({"u": tracker, "count": 0})
    True
  """

  KINDS = ("inner", "inner_jacobian")

  def __init__(self, kind: str = "inner", fill: Optional[Callable] = None):
    self.kind = _validate.one_of("kind", kind, self.KINDS)
    if fill is not None and (kind != "inner" or not callable(fill)):
      raise ValueError(
        f"fill must be a function inner_value -> tracker, for kind 'inner' only; got "
        f"{fill!r} for kind {kind!r}"
      )
    self.fill = fill
    self._key = (self.kind, _fill_key(fill))

  def tree_flatten(self):
    return (), self  # static: the kind and the fill; no leaves

  @classmethod
  def tree_unflatten(cls, aux, children):
    del children
    return aux

  def __eq__(self, other):
    return isinstance(other, Pending) and other._key == self._key

  def __hash__(self):
    return hash(("Pending", *self._key))

  def __repr__(self):
    return f"Pending({self.kind!r})"


class _Unkeyed(Exception):
  """A fill whose computation cannot be told from its code and captured values."""


def _fill_key(fill):
  """What a fill computes, as a hashable key: ``None``; a function's code, defaults and
  captured values; a ``functools.partial``'s function, arguments and keywords; another
  callable itself; otherwise (arrays captured) the fill itself, compared by identity."""
  if fill is None:
    return None
  try:
    key = _static(fill)
    hash(key)
    return key
  except (_Unkeyed, TypeError):
    return ("object", fill)


def _static(value):
  """``value`` as a hashable key of what it is (``_Unkeyed`` for arrays and objects)."""
  if isinstance(value, jax.core.Tracer):
    raise ValueError(
      "pending_or: the fill captures a traced value (an injected or swept hyperparameter?); "
      "a fill must depend on the inner value alone: apply hyperparameters in update"
    )
  if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
    return (type(value).__name__, value)
  if isinstance(value, tuple):
    return ("tuple",) + tuple(_static(v) for v in value)
  if isinstance(value, functools.partial):
    keywords = tuple(sorted((k, _static(v)) for k, v in value.keywords.items()))
    return ("partial", _static(value.func), _static(value.args), keywords)
  if isinstance(value, types.FunctionType):
    cells = tuple(_static(c.cell_contents) for c in value.__closure__ or ())
    kwdefaults = tuple(sorted((k, _static(v)) for k, v in (value.__kwdefaults__ or {}).items()))
    return ("function", value.__code__, _static(value.__defaults__), kwdefaults, cells)
  if callable(value) and not hasattr(value, "shape"):  # a module's function, a bound method
    return ("callable", value)
  raise _Unkeyed


def _is_pending(x) -> bool:
  return isinstance(x, Pending)


def has_pending(state) -> bool:
  """Whether any tracker of ``state`` (however nested) is still a :class:`Pending`.

  Decided from the state's structure alone, so it is a Python bool even while tracing.

  Args:
    state: any pytree (an algorithm's state, chained or injected).

  Returns:
    ``True`` when some node of ``state`` is a :class:`Pending`, else ``False``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> from fedco import extend
    >>> state = fedco.local_scgd(0.1).init(jnp.zeros(2))
    >>> extend.has_pending(state)  # its tracker u waits for g(x_0)
    True
    >>> extend.has_pending(fedco.local_scgd(0.1).init(jnp.zeros(2), inner_value=jnp.ones(3)))
    False
  """
  return any(_is_pending(x) for x in jax.tree.leaves(state, is_leaf=_is_pending))


def init_trackers(state, params, inner_value):
  """``state`` with every :class:`Pending` tracker filled from ``inner_value = g(x_0)``.

  Works on any state that holds fedco algorithm states (``optax.chain``,
  ``optax.inject_hyperparams``, ...); a state with nothing pending is returned as is.
  A ``"inner"`` tracker becomes ``fill(inner_value)`` with the ``fill`` it was made with
  (:func:`pending_or`; ``inner_value`` itself without one); an ``"inner_jacobian"`` one zeros of shape
  ``[p, *leaf.shape]`` for each leaf of ``params``, where ``p`` is the flattened size of
  ``inner_value``. Filling before a jitted loop or ``lax.scan`` keeps the state's structure
  fixed; the runtime does it for every client from one mini-batch ``g_k(x_0; zeta_0)`` and
  then averages the plan's ``at_init`` fields (SPEC 2.5).

  Args:
    state: an algorithm's state, however nested.
    params: the parameters ``x_0`` (the structure of ``"inner_jacobian"`` trackers).
    inner_value: ``g(x_0; zeta_0)``, a pytree of arrays; may be ``None`` when nothing is
      pending.

  Returns:
    ``state`` with the same structure but every :class:`Pending` replaced by arrays.

  Raises:
    ValueError: ``state`` has pending trackers and ``inner_value`` is ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.chain(optax.clip_by_global_norm(1.0), fedco.local_scgd(0.1))
    >>> params = jnp.array([1.0, 2.0])
    >>> state = opt.init(params)  # a chain's init takes params only
    >>> state[1].u
    Pending('inner')
    >>> state = fedco.init_trackers(state, params, inner_value=params**2)
    >>> [round(float(v), 4) for v in state[1].u]
    [1.0, 4.0]
  """
  if not has_pending(state):
    return state
  if inner_value is None:
    raise ValueError(
      "init_trackers needs inner_value=g(params, batch): the state has "
      "trackers of the inner value that are not filled yet"
    )
  inner_value = jax.tree.map(jnp.asarray, inner_value)

  def fill(x):
    if not _is_pending(x):
      return x
    if x.kind == "inner":
      return inner_value if x.fill is None else x.fill(inner_value)
    size = ravel_pytree(inner_value)[0].shape
    return jax.tree.map(lambda p: jnp.zeros(size + jnp.shape(p), jnp.result_type(p)), params)

  return jax.tree.map(fill, state, is_leaf=_is_pending)


def fill_pending(state, params, inner_fn):
  """In ``update``: fill pending trackers from this step's sample ``inner_fn(params)``.

  Decided while tracing, so a state with nothing pending costs nothing (``inner_fn`` is not
  called); otherwise this is :func:`init_trackers` with ``inner_value = inner_fn(params)``.
  Call it first in ``update``, so that an algorithm initialised without ``inner_value``
  still runs (a jitted loop then traces twice: the state's structure changes once).

  Args:
    state: the algorithm's state as ``update`` received it.
    params: the current parameters ``x``.
    inner_fn: the oracle ``x -> g(x; zeta)`` of this step.

  Returns:
    ``state`` with no :class:`Pending` left.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> state = {"u": extend.pending_or(None, lambda v: v)}
    >>> state = extend.fill_pending(state, jnp.array([1.0, 2.0]), lambda x: 3 * x)
    >>> [round(float(v), 4) for v in state["u"]]
    [3.0, 6.0]
  """
  if not has_pending(state):
    return state
  return init_trackers(state, params, inner_fn(params))


def pending_or(inner_value, fill):
  """In ``init``: ``fill(inner_value)`` when given, else a :class:`Pending` tracker.

  The way to start a tracker of the inner value (``y``, ``u``): ``init(params,
  inner_value=...)`` fills it at once; without the value, the runtime (:func:`init_trackers`)
  or :func:`fill_pending` in the first ``update`` fills it with the same ``fill``.

  Args:
    inner_value: ``g(x_0; zeta_0)`` (a pytree; its leaves are made ``jax.Array``) or
      ``None``.
    fill: ``inner_value -> tracker``, e.g. ``lambda v: v`` or an estimator's ``init``; a
      function of the inner value alone (it may run later, where an injected or swept
      hyperparameter is not at hand: use those in ``update``).

  Returns:
    ``fill(inner_value)``, or ``Pending("inner", fill)`` when ``inner_value`` is ``None``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> extend.pending_or(None, lambda v: v)
    Pending('inner')
    >>> extend.pending_or([1.0, 2.0], lambda v: v)[1].dtype.name
    'float32'

    Filled later, the tracker is the same ``fill`` of the inner value:

    >>> half = lambda v: v / 2
    >>> state = {"u": extend.pending_or(None, half)}
    >>> extend.fill_pending(state, jnp.array([2.0, 4.0]), lambda x: x)["u"].tolist()
    [1.0, 2.0]
  """
  if inner_value is None:
    return Pending("inner", fill)
  return fill(jax.tree.map(jnp.asarray, inner_value))
