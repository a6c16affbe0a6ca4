"""The plan's fields, wherever they sit in a (chained, injected) state.

:func:`get_field` and :func:`set_fields` read and write a state field by name (optax's
``tree_get`` / ``tree_set``), which is how the runtime handles the fields a
:class:`~fedco.algorithms.core.types.CommPlan` names.
"""

from __future__ import annotations

import optax

_MISSING = object()


def get_field(state, name: str):
  """The state field ``name``, found anywhere in a nested state (optax's ``tree_get``).

  How the runtime reads the fields its :class:`CommPlan` names, whether the algorithm's
  state is at the top or inside a :func:`chain` or :func:`inject_hyperparams` state.

  Args:
    state: an algorithm's state (NamedTuples, dicts, tuples, nested).
    name: a field name (a NamedTuple field or a dict key).

  Returns:
    the field's value (any pytree).

  Raises:
    ValueError: no field is called ``name``, or more than one is (a chained transform
      uses the same name).

  Examples:
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> opt = fedco.chain(optax.clip_by_global_norm(1.0), fedco.local_scgd(0.1))
    >>> state = fedco.init_trackers(opt.init(jnp.zeros(2)), jnp.zeros(2), jnp.ones(3))
    >>> fedco.algorithms.get_field(state, "u").shape
    (3,)
  """
  try:
    value = optax.tree_utils.tree_get(state, name, default=_MISSING)
  except KeyError:
    raise ValueError(
      f"the algorithm's state holds more than one field named {name!r} (a chained "
      f"transform uses the same name); the runtime cannot tell which to communicate"
    ) from None
  if value is _MISSING:
    raise ValueError(
      f"the communication plan names the field {name!r}, which the algorithm's state does not have"
    )
  return value


def set_fields(state, **values):
  """``state`` with the named fields replaced, wherever they sit (optax's ``tree_set``).

  How the runtime writes the fields its :class:`CommPlan` names (the server's values at
  the start of a round, the clients' mean after a step); see :func:`get_field`.

  Args:
    state: an algorithm's state, however nested.
    **values: ``name=value`` for each field to replace; none returns ``state`` as is.

  Returns:
    a new state of the same structure with those fields replaced.

  Raises:
    ValueError: a name is not a field of ``state``, or names more than one.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> state = fedco.local_scgd(0.1).init(jnp.zeros(2), inner_value=jnp.zeros(2))
    >>> state = fedco.algorithms.set_fields(state, u=jnp.array([0.5, 1.5]))
    >>> [round(float(v), 4) for v in state.u]
    [0.5, 1.5]
  """
  if not values:
    return state
  for name in values:
    get_field(state, name)  # a clear error for a missing or ambiguous field
  return optax.tree_utils.tree_set(state, **values)
