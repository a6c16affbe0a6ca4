"""Helpers inside a client's ``init`` and ``update``.

:func:`param_optimizer` builds the parameter step from ``learning_rate`` and
``optimizer``; :func:`require` and :func:`oracles` fetch the oracles ``update`` receives;
:func:`add_grads` adds ``grad h``; :func:`at_round_start` / :func:`at_round_end` tell where
the step is in the round and :func:`select` branches on it; :func:`strong` keeps a state
built from params strongly typed.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
import optax

from fedco import _validate
from fedco.algorithms.core.types import PyTree, ScalarOrSchedule


def param_optimizer(
  learning_rate: Optional[ScalarOrSchedule], optimizer, *, default: float, shared_rate: bool = False
) -> optax.GradientTransformation:
  """The parameter step: what an algorithm's ``learning_rate`` and ``optimizer`` build.

  * ``optimizer=None``: the paper's ``optax.sgd(learning_rate)`` (``default`` when
    ``learning_rate`` is ``None``).
  * ``optimizer`` a factory of the learning rate (``optax.adam``,
    ``functools.partial(optax.sgd, momentum=0.9)``): ``optimizer(learning_rate)``, so
    ``learning_rate`` (a number, a schedule, or an injected hyperparameter) feeds it.
  * ``optimizer`` an optax transform: used as it is; it has its own step size, so passing
    ``learning_rate`` too is an error rather than silently ignored, unless ``shared_rate``:
    the algorithm's rate also sets other rates (Local-SCGDM's tracker and momentum rates,
    q-FedAvg's server ``L``), so it is used either way.

  Args:
    learning_rate: a positive rate, a schedule of the step count, or ``None`` (use
      ``default``).
    optimizer: ``None``, a factory of the learning rate, or an optax
      ``GradientTransformation``.
    default: the rate used when ``learning_rate`` is ``None`` (the algorithm's default).
    shared_rate: whether ``learning_rate`` may be given with an optax transform
      ``optimizer`` (default ``False``: it is an error).

  Returns:
    an optax ``GradientTransformation`` whose updates are the step to add to the
    parameters (negative gradient direction).

  Raises:
    ValueError: the rate is not positive; ``optimizer`` is a transform and a
      ``learning_rate`` is given without ``shared_rate``; ``optimizer(learning_rate)`` is not
      a transform; or ``optimizer`` is neither a transform nor callable.

  Examples:
    >>> import functools
    >>> import jax.numpy as jnp
    >>> import optax
    >>> from fedco import extend
    >>> grad, params = jnp.array([1.0, -2.0]), jnp.zeros(2)
    >>> sgd = extend.param_optimizer(None, None, default=0.1)  # sgd(0.1)
    >>> [round(float(v), 4) for v in sgd.update(grad, sgd.init(params))[0]]
    [-0.1, 0.2]
    >>> momentum = functools.partial(optax.sgd, momentum=0.9)
    >>> tx = extend.param_optimizer(0.01, momentum, default=0.1)  # sgd(0.01, momentum=0.9)
    >>> [round(float(v), 4) for v in tx.update(grad, tx.init(params))[0]]
    [-0.01, 0.02]
    >>> extend.param_optimizer(0.01, optax.adam(0.1), default=0.1)
    Traceback (most recent call last):
      ...
    ValueError: pass learning_rate or optimizer, not both: ...
  """
  if optimizer is None:
    lr = default if learning_rate is None else learning_rate
    return optax.sgd(_validate.rate("learning_rate", lr))
  if isinstance(optimizer, optax.GradientTransformation):
    if learning_rate is not None and not shared_rate:
      raise ValueError(
        "pass learning_rate or optimizer, not both: optimizer is a GradientTransformation "
        "with its own step size; pass a factory (e.g. optimizer=optax.adam) to feed it "
        f"learning_rate={learning_rate!r}"
      )
    return optimizer
  if callable(optimizer):
    lr = default if learning_rate is None else learning_rate
    tx = optimizer(_validate.rate("learning_rate", lr))
    if not isinstance(tx, optax.GradientTransformation):
      raise ValueError(
        f"optimizer(learning_rate) must return an optax GradientTransformation, "
        f"got {type(tx).__name__}"
      )
    return tx
  raise ValueError(
    "optimizer must be an optax GradientTransformation or a factory of the "
    f"learning rate (e.g. optax.adam), got {optimizer!r}"
  )


def require(name: str, value, algorithm: str):
  """Raise a clear error when a compositional algorithm is called without its oracle.

  Args:
    name: the keyword argument's name (``"inner_fn"``, ``"example_losses_fn"``, ...).
    value: what ``update`` received for it.
    algorithm: the algorithm's name, for the message.

  Returns:
    ``value``, when it is not ``None``.

  Raises:
    ValueError: ``value`` is ``None``.

  Examples:
    >>> from fedco import extend
    >>> extend.require("extra_fn", None, "my_alg")
    Traceback (most recent call last):
      ...
    ValueError: my_alg.update needs the keyword argument extra_fn; ...
  """
  if value is None:
    raise ValueError(
      f"{algorithm}.update needs the keyword argument {name}; pass a callable "
      f"(see fedco.oracle_args), got None"
    )
  return value


def oracles(name: str, inner_fn, outer_fn, next_inner_fn=None):
  """The checked ``(inner_fn, outer_fn, next_inner_fn)`` a compositional ``update`` needs.

  ``inner_fn(x) = g(x; zeta)`` and ``outer_fn(y) = f(y; xi)`` must be given (see
  :func:`require`); ``next_inner_fn(x) = g(x; zeta')`` defaults to ``inner_fn`` (one sample
  for everything).

  Args:
    name: the algorithm's name, for the error message.
    inner_fn: the inner oracle ``x -> g(x; zeta)``.
    outer_fn: the outer oracle ``y -> f(y; xi)``.
    next_inner_fn: the inner oracle on an independent sample, or ``None``.

  Returns:
    the tuple ``(inner_fn, outer_fn, next_inner_fn)``.

  Raises:
    ValueError: ``inner_fn`` or ``outer_fn`` is ``None``.

  Examples:
    >>> from fedco import extend
    >>> g, f = (lambda x: x**2), (lambda y: y.sum())
    >>> inner_fn, outer_fn, next_inner_fn = extend.oracles("my_alg", g, f)
    >>> next_inner_fn is g
    True
  """
  require("inner_fn", inner_fn, name)
  require("outer_fn", outer_fn, name)
  return inner_fn, outer_fn, inner_fn if next_inner_fn is None else next_inner_fn


def add_grads(z: PyTree, grad_h: Optional[PyTree]) -> PyTree:
  """``z + grad h`` where ``grad h`` may be ``None`` (no non-compositional term).

  Completes the compositional gradient ``z = J_g(x; zeta)^T grad f(y; xi) + grad h(x;
  xi')`` with the ``updates`` an algorithm receives.

  Args:
    z: a pytree (the compositional term, the parameters' structure).
    grad_h: ``None`` or a pytree of ``z``'s structure.

  Returns:
    ``z`` itself when ``grad_h`` is ``None``, else their leafwise sum.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> z = {"w": jnp.array([1.0, 2.0])}
    >>> [round(float(v), 4) for v in extend.add_grads(z, {"w": jnp.array([0.5, 0.5])})["w"]]
    [1.5, 2.5]
    >>> extend.add_grads(z, None) is z
    True
  """
  return z if grad_h is None else jax.tree.map(jnp.add, z, grad_h)


def at_round_start(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the first local step of a round.

  The runtime passes ``local_step`` (``0 .. local_steps - 1``); in a user's own loop it is
  ``None`` and the step count tells (``count % local_steps == 0``, every ``local_steps``
  calls starting with the first). Use it where a client does something once a round:
  anchor to the round's model (FedProx, Ditto), reset a per-round accumulator.

  Args:
    local_step: the ``local_step`` keyword argument ``update`` received (an int or an int
      array), or ``None`` outside the runtime.
    count: the number of updates this state has taken (the state's step counter); read
      only when ``local_step`` is ``None``.
    local_steps: the plan's steps per round, ``>= 1``.

  Returns:
    a boolean scalar ``jax.Array`` (traceable, for ``jnp.where`` / :func:`select`).

  Examples:
    >>> from fedco import extend
    >>> [bool(extend.at_round_start(None, count, 3)) for count in range(6)]
    [True, False, False, True, False, False]
    >>> bool(extend.at_round_start(0, 7, 3))  # the runtime's local_step decides
    True
  """
  if local_step is None:
    return jnp.asarray(count) % local_steps == 0
  return jnp.asarray(local_step) == 0


def at_round_end(local_step, count, local_steps: int) -> jax.Array:
  """Whether this ``update`` is the last local step of a round.

  Where a client prepares what it uploads (SCAFFOLD's control variate). Like
  :func:`at_round_start`, it reads the runtime's ``local_step`` when given and otherwise the
  step count (``count % local_steps == local_steps - 1``). A straggler stops before its last
  step, so an upload computed only here may be missing: prefer one kept right at every step.

  Args:
    local_step: the ``local_step`` keyword argument ``update`` received, or ``None``
      outside the runtime.
    count: the number of updates this state has taken; read only when ``local_step`` is
      ``None``.
    local_steps: the plan's steps per round, ``>= 1``.

  Returns:
    a boolean scalar ``jax.Array``.

  Examples:
    >>> from fedco import extend
    >>> [bool(extend.at_round_end(None, count, 3)) for count in range(6)]
    [False, False, True, False, False, True]
  """
  if local_step is None:
    return jnp.asarray(count) % local_steps == local_steps - 1
  return jnp.asarray(local_step) == local_steps - 1


def select(pred, on_true: PyTree, on_false: PyTree) -> PyTree:
  """Leafwise ``jnp.where(pred, on_true, on_false)``.

  A traceable ``if`` on whole states or updates (e.g. with :func:`at_round_start`);
  both branches are computed.

  Args:
    pred: a boolean scalar (or an array that broadcasts against every leaf).
    on_true: a pytree.
    on_false: a pytree of ``on_true``'s structure.

  Returns:
    a pytree of that structure, each leaf from ``on_true`` where ``pred`` holds, else from
    ``on_false``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> first = extend.at_round_start(None, 3, 3)
    >>> anchor = extend.select(first, {"x": jnp.ones(2)}, {"x": jnp.zeros(2)})
    >>> [round(float(v), 4) for v in anchor["x"]]
    [1.0, 1.0]
  """
  return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def strong(tree: PyTree) -> PyTree:
  """``tree`` with every leaf a strongly typed array of its own dtype.

  Build state from ``strong(params)`` in ``init``: ``jnp.zeros_like`` and optax states of
  weak-typed params (``jnp.full(shape, 0.1)``) are weak-typed, the first update makes them
  strong, and a jitted loop over the state then traces twice. A no-op on strong arrays.

  Args:
    tree: a pytree of arrays or Python numbers.

  Returns:
    the same structure, each leaf a ``jax.Array`` of the leaf's dtype, not weakly typed.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco import extend
    >>> params = {"w": jnp.full((2,), 0.1)}  # weak-typed: a Python float
    >>> jnp.zeros_like(params["w"]).weak_type
    True
    >>> m = jnp.zeros_like(extend.strong(params)["w"])
    >>> m.weak_type, m.dtype.name
    (False, 'float32')
  """
  return jax.tree.map(lambda a: jnp.asarray(a, jnp.result_type(a)), tree)
