"""Argument checks shared by every public factory.

Checks run on concrete numbers (Python, NumPy scalars, 0-d arrays): each raises a one-line
``ValueError`` naming the argument, the value and what is allowed. A traced hyperparameter
(``optax.inject_hyperparams`` inside ``jax.jit``) has no value to check and passes through.
"""

from __future__ import annotations

import math
import numbers

import jax
import numpy as np


def _is_bool(value) -> bool:
  return isinstance(value, (bool, np.bool_)) or (
    isinstance(value, (np.ndarray, jax.Array)) and value.dtype == np.bool_
  )


def _value(name: str, value, what: str):
  """``float(value)`` for a concrete real number, ``None`` for a tracer; else ``ValueError``.

  Real numbers are Python's, NumPy's scalars (``np.float32``, ``np.int64``, ...) and 0-d
  arrays of an integer or floating dtype; bools are refused, and so are NaN and infinities.
  """
  if isinstance(value, jax.core.Tracer):
    return None
  if _is_bool(value):
    raise ValueError(f"{name} must be {what}, got the bool {value!r}")
  if isinstance(value, numbers.Real):
    number = float(value)
  elif (
    isinstance(value, (np.ndarray, jax.Array))
    and np.ndim(value) == 0
    and np.issubdtype(value.dtype, np.number)
    and not np.issubdtype(value.dtype, np.complexfloating)
  ):
    number = float(value)
  else:
    raise ValueError(f"{name} must be {what}, got {value!r}")
  if not math.isfinite(number):
    raise ValueError(f"{name} must be finite ({what}), got {value!r}")
  return number


def plain(value):
  """A NumPy scalar or 0-d NumPy array as the Python number it holds; anything else as is
  (so names and run fingerprints built from a number do not depend on its NumPy type)."""
  if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
    return value.item()
  return value


def real(name: str, value) -> float:
  """A concrete finite real number as a Python ``float``; else ``ValueError``."""
  number = _value(name, value, "a finite real number")
  if number is None:
    raise ValueError(f"{name} must be a concrete number, got a JAX tracer")
  return number


def interval(
  name: str, value, low=None, high=None, *, closed_low: bool = False, closed_high: bool = False
) -> float:
  """A concrete finite number in the interval ``(low, high)`` (a ``None`` end is open to
  infinity; ``closed_*`` include that end) as a Python ``float``; else ``ValueError``."""
  parts = []
  if low is not None:
    parts.append(f"{'>=' if closed_low else '>'} {low}")
  if high is not None:
    parts.append(f"{'<=' if closed_high else '<'} {high}")
  what = "a finite number" + (" " + " and ".join(parts) if parts else "")
  number = _value(name, value, what)
  if number is None:
    raise ValueError(f"{name} must be {what}, got a JAX tracer")
  ok = (low is None or (number >= low if closed_low else number > low)) and (
    high is None or (number <= high if closed_high else number < high)
  )
  if not ok:
    raise ValueError(f"{name} must be {what}, got {value!r}")
  return number


def positive(name: str, value, *, allow_zero: bool = False):
  r"""Checks that an argument is a finite number :math:`> 0` (or :math:`\ge 0`).

  For a factory's step sizes, temperatures and penalties. A concrete number (Python's,
  NumPy's scalars, a 0-d array) is checked; a traced hyperparameter (injected with
  :func:`fedco.inject_hyperparams`, then ``jax.jit``) has no value to check and passes as it
  is, so the factory stays injectable.

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    allow_zero: also accept ``0`` (default ``False``: strictly positive).

  Returns:
    ``value`` itself, unchanged (not converted to ``float``).

  Raises:
    ValueError: ``value`` is not a real number (bools are refused), is NaN or infinite, or
      is ``<= 0`` (``< 0`` with ``allow_zero``); the message names ``name``.

  Examples:
    >>> from fedco import extend
    >>> extend.positive("learning_rate", 0.1)
    0.1
    >>> extend.positive("mu", 0, allow_zero=True)
    0
    >>> extend.positive("learning_rate", -1.0)
    Traceback (most recent call last):
    ValueError: learning_rate must be > 0, got -1.0
  """
  what = "a finite number >= 0" if allow_zero else "a finite number > 0"
  number = _value(name, value, what)
  if number is not None and not (number >= 0 if allow_zero else number > 0):
    raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
  return value


def bounded(
  name: str, value, low=None, high=None, *, closed_low: bool = False, closed_high: bool = False
):
  r"""Checks that an argument is a finite number in an interval (open by default).

  The interval is :math:`(\mathrm{low}, \mathrm{high})`; ``closed_low`` / ``closed_high``
  include that end, and a ``None`` end is unbounded. For momentum, mixing and
  moving-average weights (e.g. :math:`\beta \in (0, 1]`). A traced (injected)
  hyperparameter passes as it is.

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    low: the lower end, or ``None`` (default) for none.
    high: the upper end, or ``None`` (default) for none.
    closed_low: include ``low`` itself (default ``False``).
    closed_high: include ``high`` itself (default ``False``).

  Returns:
    ``value`` itself, unchanged.

  Raises:
    ValueError: ``value`` is not a finite real number or lies outside the interval; the
      message names ``name`` and the interval.

  Examples:
    >>> from fedco import extend
    >>> extend.bounded("beta", 1.0, 0, 1, closed_high=True)  # beta in (0, 1]
    1.0
    >>> extend.bounded("beta", 1.5, 0, 1, closed_high=True)
    Traceback (most recent call last):
    ValueError: beta must be a finite number > 0 and <= 1, got 1.5
  """
  if isinstance(value, jax.core.Tracer):
    return value
  interval(name, value, low, high, closed_low=closed_low, closed_high=closed_high)
  return value


def rate(name: str, value):
  """Checks a step size: a finite number :math:`> 0` or an optax schedule.

  A schedule (any callable of the step count, e.g. ``optax.cosine_decay_schedule(...)``)
  passes unchecked; a number is checked as by :func:`positive` (a traced one passes). Use
  it for every ``learning_rate``-like argument (:data:`ScalarOrSchedule`).

  Args:
    name: the argument's name, for the message.
    value: a number or a callable ``step -> rate``.

  Returns:
    ``value`` itself, unchanged.

  Raises:
    ValueError: ``value`` is neither callable nor a finite number ``> 0``.

  Examples:
    >>> import optax
    >>> from fedco import extend
    >>> schedule = optax.linear_schedule(0.1, 0.01, transition_steps=100)
    >>> extend.rate("learning_rate", schedule) is schedule
    True
    >>> extend.rate("learning_rate", 0)
    Traceback (most recent call last):
    ValueError: learning_rate must be > 0, got 0
  """
  if callable(value) and not isinstance(value, (jax.Array, np.ndarray)):
    return value
  return positive(name, value)


def open_unit(name: str, value, *, closed_right: bool = False):
  """Raise ``ValueError`` unless ``value`` lies in (0, 1) (or (0, 1])."""
  interval = f"(0, 1{']' if closed_right else ')'}"
  number = _value(name, value, f"a number in {interval}")
  if number is not None:
    ok = 0 < number <= 1 if closed_right else 0 < number < 1
    if not ok:
      raise ValueError(f"{name} must be in {interval}, got {value!r}")
  return value


def positive_int(name: str, value, *, minimum: int = 1, maximum=None, note: str = ""):
  """Checks a structural integer (``local_steps``, a size) and returns it as a Python ``int``.

  The value must lie in ``[minimum, maximum]`` (no upper bound when ``maximum`` is
  ``None``). Integers are Python's, NumPy's (``np.int64``, ...) and 0-d NumPy arrays of an
  integer dtype; bools and floats such as ``2.0`` are refused. Such an argument shapes the
  compiled program, so it must be static: a JAX array (concrete or traced) is refused, with
  the hint to list it in ``static_args`` (:func:`factory`'s ``static``).

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    minimum: the smallest allowed value (default 1).
    maximum: the largest allowed value, or ``None`` (default) for no upper bound.
    note: what ``maximum`` is, added to the message (e.g. ``"the number of clients"``).

  Returns:
    ``int(value)``.

  Raises:
    ValueError: ``value`` is not a static integer in ``[minimum, maximum]``.

  Examples:
    >>> import numpy as np
    >>> from fedco import extend
    >>> extend.positive_int("local_steps", np.int64(5))
    5
    >>> extend.positive_int("clients_per_round", 5, maximum=3, note="the number of clients")
    Traceback (most recent call last):
    ValueError: clients_per_round must be an integer in [1, 3] (the number of clients), got 5
  """
  if isinstance(value, (jax.core.Tracer, jax.Array)):
    raise ValueError(
      f"{name} must be a static Python int, got a JAX array; under "
      f"optax.inject_hyperparams list it in static_args (fedco.inject_hyperparams does)"
    )
  if isinstance(value, np.ndarray) and value.ndim == 0 and np.issubdtype(value.dtype, np.integer):
    value = value[()]
  allowed = (
    f">= {minimum}"
    if maximum is None
    else f"in [{minimum}, {maximum}]" + (f" ({note})" if note else "")
  )
  if (
    _is_bool(value)
    or not isinstance(value, numbers.Integral)
    or value < minimum
    or (maximum is not None and value > maximum)
  ):
    raise ValueError(f"{name} must be an integer {allowed}, got {value!r}")
  return int(value)


def one_of(name: str, value, allowed):
  """Checks that an argument is one of the allowed choices (a mode, a variant's name).

  Args:
    name: the argument's name, for the message.
    value: the value to check.
    allowed: the allowed values (a tuple, set, ... anything supporting ``in``); an
      unhashable or incomparable ``value`` counts as not allowed.

  Returns:
    ``value`` itself, unchanged.

  Raises:
    ValueError: ``value`` is not in ``allowed``; the message lists the allowed values.

  Examples:
    >>> from fedco import extend
    >>> extend.one_of("weighting", "samples", ("uniform", "samples"))
    'samples'
    >>> extend.one_of("weighting", "equal", ("uniform", "samples"))
    Traceback (most recent call last):
    ValueError: weighting must be one of ('uniform', 'samples'), got 'equal'
  """
  try:
    ok = value in allowed
  except TypeError:  # unhashable or incomparable
    ok = False
  if not ok:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
  return value
