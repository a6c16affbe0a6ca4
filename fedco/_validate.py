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
  """Raise ``ValueError`` unless ``value > 0`` (``>= 0`` with ``allow_zero``) and finite."""
  what = "a finite number >= 0" if allow_zero else "a finite number > 0"
  number = _value(name, value, what)
  if number is not None and not (number >= 0 if allow_zero else number > 0):
    raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
  return value


def bounded(
  name: str, value, low=None, high=None, *, closed_low: bool = False, closed_high: bool = False
):
  """``value`` unless it is a concrete number outside ``(low, high)`` (``closed_*`` include
  that end) or not finite; a traced (injected) hyperparameter passes as it is."""
  if isinstance(value, jax.core.Tracer):
    return value
  interval(name, value, low, high, closed_low=closed_low, closed_high=closed_high)
  return value


def rate(name: str, value):
  """A step size: a finite number ``> 0`` or an optax schedule (a callable of the step)."""
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
  """``int(value)`` for a (static) integer in ``[minimum, maximum]`` (no upper bound when
  ``maximum`` is None); else ``ValueError`` (``note`` says what ``maximum`` is).

  Integers are Python's, NumPy's (``np.int64``, ...) and 0-d NumPy arrays of an integer
  dtype; bools are refused.
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
  try:
    ok = value in allowed
  except TypeError:  # unhashable or incomparable
    ok = False
  if not ok:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
  return value
