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


def _value(name: str, value, what: str):
  """``float(value)`` for a concrete real number, ``None`` for a tracer; else ``ValueError``."""
  if isinstance(value, jax.core.Tracer):
    return None
  if isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be {what}, got the bool {value!r}")
  if isinstance(value, numbers.Real):
    number = float(value)
  elif (isinstance(value, (np.ndarray, jax.Array)) and np.ndim(value) == 0
        and np.issubdtype(value.dtype, np.number)
        and not np.issubdtype(value.dtype, np.complexfloating)):
    number = float(value)
  else:
    raise ValueError(f"{name} must be {what}, got {value!r}")
  if not math.isfinite(number):
    raise ValueError(f"{name} must be finite ({what}), got {value!r}")
  return number


def positive(name: str, value, *, allow_zero: bool = False):
  """Raise ``ValueError`` unless ``value > 0`` (``>= 0`` with ``allow_zero``) and finite."""
  what = "a finite number >= 0" if allow_zero else "a finite number > 0"
  number = _value(name, value, what)
  if number is not None and not (number >= 0 if allow_zero else number > 0):
    raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
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


def positive_int(name: str, value, *, minimum: int = 1):
  """Raise ``ValueError`` unless ``value`` is a (static) integer ``>= minimum``."""
  if isinstance(value, (jax.core.Tracer, jax.Array)):
    raise ValueError(
        f"{name} must be a static Python int, got a JAX array; under "
        f"optax.inject_hyperparams list it in static_args (fedco.inject_hyperparams does)")
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) \
      or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def one_of(name: str, value, allowed):
  try:
    ok = value in allowed
  except TypeError:  # unhashable or incomparable
    ok = False
  if not ok:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
  return value
