"""Argument checks shared by every public factory.

Checks run only on concrete Python numbers: a traced or array hyperparameter (for
``optax.inject_hyperparams``) is the caller's responsibility and passes through.
"""

from __future__ import annotations

import numbers


def _concrete(value) -> bool:
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive(name: str, value, *, allow_zero: bool = False):
  """Raise ``ValueError`` unless ``value > 0`` (``>= 0`` with ``allow_zero``)."""
  if isinstance(value, bool) or (not _concrete(value) and isinstance(value, (str, type(None)))):
    raise ValueError(f"{name} must be a number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
  if _concrete(value) and not (value >= 0 if allow_zero else value > 0):
    raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
  return value


def open_unit(name: str, value, *, closed_right: bool = False):
  """Raise ``ValueError`` unless ``value`` lies in (0, 1) (or (0, 1])."""
  if isinstance(value, (bool, str, type(None))):
    raise ValueError(f"{name} must be a number in (0, 1{']' if closed_right else ')'}, "
                     f"got {value!r}")
  if _concrete(value):
    ok = 0 < value <= 1 if closed_right else 0 < value < 1
    if not ok:
      raise ValueError(f"{name} must be in (0, 1{']' if closed_right else ')'}, got {value!r}")
  return value


def positive_int(name: str, value, *, minimum: int = 1):
  """Raise ``ValueError`` unless ``value`` is an int ``>= minimum``."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
  return int(value)


def one_of(name: str, value, allowed):
  if value not in allowed:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")
  return value
