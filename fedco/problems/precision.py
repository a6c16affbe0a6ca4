r"""Mixed precision: a problem whose per-example functions compute in bfloat16 or float16.

:func:`mixed_precision` wraps a :class:`~fedco.problems.Problem` so that its model-heavy
per-example functions (``inner``, ``extra``, and a data-dependent ``outer``: MAML's query
loss) run on a low-precision copy of the parameters and of the example's floating inputs,
and return their values in float32. The parameters, the gradients the algorithms receive
(the cast's derivative brings them back to the parameters' dtype), optimizer states,
trackers, every upload and the server's aggregation stay float32: the policy flax's
``dtype`` / ``param_dtype`` and optax's float32 states express, applied to any model
without changing it. A deterministic ``outer(y)`` (the DRO link ``exp(y / gamma)``) is
cheap and stays float32. Integer inputs (uint8 images) are left as they are: a loss or
model that converts them to float32 itself (``x.astype(jnp.float32)``, fedco's CNN4 and
logistic regression on integer images) promotes the whole computation back to float32, so
convert them to the parameters' dtype in the loss (``x.astype(jax.tree.leaves(params)[0].dtype)``)
or store the data as floats.

**float16 and loss scaling.** float16's smallest normal number is about ``6e-5``, so small
gradients vanish in its backward pass; ``loss_scale=S`` multiplies the cotangent entering
the low-precision computation by ``S`` and divides the parameters' cotangent by ``S`` on its
way back to float32 (two ``jax.custom_vjp`` identities around the computation), a static
loss scale. bfloat16 has float32's exponent range and needs none (``loss_scale=None``).
A scale too large overflows to ``inf``, which fedco's non-finite checks report as a
divergence: lower it.

**Choice**: static loss scaling (dynamic scaling would put a scale and an overflow counter in
every client's state); the default ``S = 2**10`` for float16.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from fedco import _validate
from fedco.problems.base import Problem

#: The compute dtypes :func:`mixed_precision` takes.
COMPUTE_DTYPES = ("bfloat16", "float16", "float32")
#: float16's default static loss scale.
FLOAT16_LOSS_SCALE = 2.0**10


def _is_float(x) -> bool:
  return jnp.issubdtype(jnp.result_type(x), jnp.floating)


def cast_floats(tree, dtype):
  """``tree`` with every floating leaf cast to ``dtype`` (integer labels left as they are).

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedco.problems import precision
    >>> out = precision.cast_floats({"x": jnp.ones(2), "y": jnp.array([3])}, jnp.bfloat16)
    >>> str(out["x"].dtype), str(out["y"].dtype)
    ('bfloat16', 'int32')
  """
  return jax.tree.map(lambda x: x.astype(dtype) if _is_float(x) else x, tree)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _down(params, dtype, scale):
  """``params`` cast to ``dtype``; the cotangent comes back to each leaf's dtype over
  ``scale``."""
  return cast_floats(params, dtype)


def _dtypes(tree):
  """Zero-size stand-ins carrying each leaf's dtype (residuals must be arrays)."""
  return jax.tree.map(lambda x: jnp.zeros((0,), jnp.result_type(x)), tree)


def _down_fwd(params, dtype, scale):
  return _down(params, dtype, scale), _dtypes(params)


def _down_bwd(dtype, scale, dtypes, cotangent):
  del dtype

  def back(g, d):
    if not jnp.issubdtype(d.dtype, jnp.floating):
      return g
    return (g.astype(d.dtype) / scale).astype(d.dtype)

  return (jax.tree.map(back, cotangent, dtypes),)


_down.defvjp(_down_fwd, _down_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _up(value, scale):
  """``value`` cast to float32; the cotangent goes back times ``scale`` in its dtype."""
  return cast_floats(value, jnp.float32)


def _up_fwd(value, scale):
  return _up(value, scale), _dtypes(value)


def _up_bwd(scale, dtypes, cotangent):
  return (jax.tree.map(lambda g, d: (g * scale).astype(d.dtype), cotangent, dtypes),)


_up.defvjp(_up_fwd, _up_bwd)


def _lowered(fn: Optional[Callable], dtype, scale) -> Optional[Callable]:
  """``fn(params, example)`` computed on low-precision copies, its value in float32."""
  if fn is None:
    return None

  def wrapped(params, *rest):
    low = [cast_floats(r, dtype) for r in rest]
    if scale is None:
      return cast_floats(fn(cast_floats(params, dtype), *low), jnp.float32)
    return _up(fn(_down(params, dtype, scale), *low), scale)

  return wrapped


def mixed_precision(
  problem: Problem, compute_dtype: str = "bfloat16", *, loss_scale: Optional[float] = None
) -> Problem:
  """``problem`` with its per-example functions computed in ``compute_dtype``.

  Args:
    problem: any :class:`~fedco.problems.Problem` (plain or compositional).
    compute_dtype: ``"bfloat16"`` (default), ``"float16"`` or ``"float32"`` (``problem``
      unchanged).
    loss_scale: float16's static loss scale, a power of two ``>= 1``; ``None``:
      :data:`FLOAT16_LOSS_SCALE` for float16, none otherwise (bfloat16 needs none).

  Returns:
    a :class:`~fedco.problems.Problem` with the same fields, its ``inner``, ``extra`` and
    a data-dependent ``outer`` computed in ``compute_dtype`` and returned in float32;
    ``name`` gains ``"@bfloat16"`` (or ``"@float16"``).

  Raises:
    ValueError: ``compute_dtype`` is not one of :data:`COMPUTE_DTYPES`, or ``loss_scale`` is
      not a power of two ``>= 1`` (or is given for bfloat16 or float32).

  Examples:
    The gradient of a bfloat16 loss is float32 and close to the float32 one:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> problem = fedco.plain(lambda w, e: 0.5 * jnp.sum((e["a"] * w - 1.0) ** 2))
    >>> low = fedco.problems.mixed_precision(problem, "bfloat16")
    >>> w, e = jnp.array([0.3, -0.7]), {"a": jnp.array([1.5, 2.0])}
    >>> g, g_low = jax.grad(problem.extra)(w, e), jax.grad(low.extra)(w, e)
    >>> str(g_low.dtype), bool(jnp.allclose(g, g_low, rtol=1e-2)), low.name
    ('float32', True, 'erm@bfloat16')
  """
  _validate.one_of("compute_dtype", compute_dtype, COMPUTE_DTYPES)
  if loss_scale is not None:
    if compute_dtype != "float16":
      raise ValueError(
        f"loss_scale={loss_scale!r}: only float16 computation needs a loss scale, not "
        f"{compute_dtype}"
      )
    value = _validate.positive("loss_scale", loss_scale)
    mantissa, _ = math.frexp(value)
    if value < 1 or mantissa != 0.5:
      raise ValueError(f"loss_scale={loss_scale!r}: must be a power of two >= 1")
  if compute_dtype == "float32":
    return problem
  dtype = jnp.dtype(compute_dtype)
  scale = None
  if compute_dtype == "float16":
    scale = float(FLOAT16_LOSS_SCALE if loss_scale is None else loss_scale)
  return dataclasses.replace(
    problem,
    inner=_lowered(problem.inner, dtype, scale),
    extra=_lowered(problem.extra, dtype, scale),
    outer=_lowered(problem.outer, dtype, scale) if problem.outer_uses_data else problem.outer,
    name=f"{problem.name}@{compute_dtype}",
  )
