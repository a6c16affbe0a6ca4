"""Compression of what clients send up: optax-style codecs on one communicated field.

A :class:`Codec` is an ``optax.GradientTransformationExtraArgs`` that maps a client's upload
of one field (the *delta* from the value the server already holds, see
:mod:`fedco.runtime.uplink`) to what the server decodes, keeping any per-client memory in its
state (error feedback). It also says how many bits one message costs
(:meth:`Codec.payload_bits`), which the run's ledger reports as bytes::

    codec = fedco.compression.stochastic_quantization(bits=4)
    state = codec.init(delta)
    decoded, state = codec.update(delta, state, key=jax.random.PRNGKey(0))

Give codecs to a run per field name of the algorithm's communication plan::

    fedco.simulate(problem, fedco.feddro(0.1, 5), data, params, rounds=100,
                   compression={"y": fedco.compression.stochastic_quantization(4),
                                "params": fedco.compression.top_k(0.1)})

The codecs act on the whole field (a pytree), flattened.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from fedco import _validate

PyTree = Any


class Codec(optax.GradientTransformationExtraArgs):
  """An optax transform on one client's upload, plus its cost in bits.

  Attributes:
    init: ``(value) -> state`` (one client's state, e.g. its error-feedback memory).
    update: ``(value, state, params=None, *, key) -> (decoded, state)``: ``decoded`` is what
      the server reconstructs from the message; ``key`` is this client's PRNG key for this
      message.
    payload_bits: ``(size, dtype) -> int``: bits of one message of a field with ``size``
      numbers of ``dtype``.
    name: a short label for ledgers and fingerprints.
    memory: whether the state carries what earlier messages left unsent (error feedback),
      which only makes sense for uploads that are changes of one quantity over time.
  """

  def __new__(
    cls, init, update, payload_bits: Callable[[int, Any], int], name: str, memory: bool = False
  ):
    self = super().__new__(cls, init, update)
    self.__dict__.update(payload_bits=payload_bits, name=name, memory=memory)
    return self

  def __repr__(self):
    return f"Codec({self.name})"


def _float_bits(dtype) -> int:
  return 8 * np.dtype(dtype).itemsize


def identity() -> Codec:
  """Sends the upload as it is (the uncompressed cost: one float per number)."""

  def update(value, state, params=None, **extra_args):
    del params, extra_args
    return value, state

  return Codec(
    lambda value: optax.EmptyState(),
    update,
    lambda size, dtype: size * _float_bits(dtype),
    "identity",
  )


class QuantizationState(NamedTuple):
  """Stochastic quantization keeps nothing between messages."""


def _check_bits(bits, minimum=1) -> int:
  bits = _validate.positive_int("bits", bits, minimum=minimum)
  if bits > 24:
    raise ValueError(f"bits must be at most 24 (a float32 carries 24 significant bits), got {bits}")
  return bits


def _stochastic_round(position, key, codec_name):
  """``position`` rounded down or up at random, up with probability its fractional part,
  so the rounded value is ``position`` in expectation."""
  if key is None:
    raise ValueError(f"{codec_name} needs key= (a PRNG key per message)")
  below = jnp.floor(position)
  return below + (jax.random.uniform(key, position.shape, position.dtype) < position - below)


def stochastic_quantization(bits: int, scale: Optional[float] = None) -> Codec:
  """Unbiased stochastic quantization to ``bits`` bits per number.

  Each number ``v`` of the flattened upload is placed on a grid of ``2**bits`` evenly spaced
  levels over ``[lo, hi]`` and rounded to one of its two neighbouring levels at random, up
  with probability equal to its distance from the lower one in grid steps, so
  ``E[Q(v)] = v``:

  * ``scale=None``: ``[lo, hi]`` is the message's own ``[min, max]``, sent with it (two
    floats per message), so every number is in range and the quantizer is exactly unbiased;
  * ``scale=r``: the fixed grid ``[-r, r]`` both sides know (nothing else is sent; for tiny
    fields, where two floats would cost more than they save). Numbers outside it are
    clipped to it first, which biases them: choose ``r`` above the uploads' size.

  Args:
    bits: bits per number, at least 1 (``2**bits`` levels).
    scale: ``None`` or the fixed half-range ``r > 0``.
  """
  bits = _check_bits(bits)
  if scale is not None:
    scale = _validate.plain(_validate.positive("scale", scale))
  levels = 2**bits - 1  # grid steps

  def init(value):
    del value
    return QuantizationState()

  def update(value, state, params=None, *, key=None, **extra_args):
    del params, extra_args
    flat, unravel = ravel_pytree(value)
    if scale is None:
      lo, hi = jnp.min(flat), jnp.max(flat)
    else:
      lo, hi = jnp.asarray(-scale, flat.dtype), jnp.asarray(scale, flat.dtype)
      flat = jnp.clip(flat, lo, hi)
    step = (hi - lo) / levels
    safe = jnp.where(step > 0, step, 1.0)
    position = (flat - lo) / safe  # in [0, levels]
    level = _stochastic_round(position, key, "stochastic_quantization")
    decoded = jnp.where(step > 0, lo + level * step, flat)
    return unravel(decoded), state

  def payload_bits(size, dtype):
    return size * bits + (0 if scale is not None else 2 * _float_bits(dtype))

  name = f"quantize{bits}" + ("" if scale is None else f"_scale{scale!r}")
  return Codec(init, update, payload_bits, name)


class TopKState(NamedTuple):
  """Top-k's error-feedback memory: what earlier messages left unsent."""

  error: PyTree


def _index_bits(size: int) -> int:
  return max(1, math.ceil(math.log2(size))) if size > 1 else 1


def top_k(fraction: float, error_feedback: bool = True) -> Codec:
  """Top-k sparsification: send the ``k = ceil(fraction * size)`` largest-magnitude numbers
  (value and index) and zero the rest.

  With ``error_feedback`` (the default) each client keeps what it did not send and adds it
  to its next upload of the field (Stich et al. 2018; Karimireddy et al. 2019), so over
  rounds every part of the uploads is sent: the sum of the decoded messages equals the sum
  of the uploads minus the error still held, whose size stays bounded.

  Args:
    fraction: the share of numbers sent, in ``(0, 1]``.
    error_feedback: keep the unsent remainder in the client's state.
  """
  fraction = _validate.plain(_validate.open_unit("fraction", fraction, closed_right=True))
  if not isinstance(error_feedback, bool):
    raise ValueError(f"error_feedback must be a bool, got {error_feedback!r}")

  def count(size):
    return max(1, math.ceil(fraction * size))

  def init(value):
    return TopKState(jax.tree.map(jnp.zeros_like, value) if error_feedback else ())

  def update(value, state, params=None, **extra_args):
    del params, extra_args
    carried = jax.tree.map(jnp.add, value, state.error) if error_feedback else value
    flat, unravel = ravel_pytree(carried)
    k = count(flat.size)
    _, index = jax.lax.top_k(jnp.abs(flat), k)
    sent = jnp.zeros_like(flat).at[index].set(flat[index])
    decoded = unravel(sent)
    if error_feedback:
      state = TopKState(unravel(flat - sent))
    return decoded, state

  def payload_bits(size, dtype):
    return count(size) * (_float_bits(dtype) + _index_bits(size))

  name = f"top{fraction!r}" + ("_ef" if error_feedback else "")
  return Codec(init, update, payload_bits, name, memory=error_feedback)


class AdaptiveState(NamedTuple):
  """Adaptive quantization's memory, which the server mirrors from the codes it receives:
  the last decoded value and the current grid half-range, per number."""

  decoded: jax.Array
  scale: jax.Array


def adaptive_quantization(
  bits: int, initial_scale: float, *, grow: float = 2.0, shrink: float = 0.5
) -> Codec:
  """Differential quantization with an adaptive step (ADPCM with stochastic rounding).

  Each number is sent as the change from its last decoded value, stochastically rounded to
  a grid of ``2**bits - 1`` levels over ``[-s, s]`` (zero is a level), so the decoded value
  is unbiased while the change is within ``s``. The half-range ``s`` of each number adapts
  from the code alone, on both sides (Jayant's rule): an outermost code multiplies it by
  ``grow`` (a change beyond ``s`` is clipped to it, biased, and the grid widens), a zero
  code by ``shrink``, any other keeps it. Nothing but the codes is sent, so a message costs
  ``bits`` per number, and when the uploads settle (a converging tracker) the grid shrinks
  with them and the quantization error vanishes, which a fixed grid or a per-message range
  cannot give a one-number field. The server keeps each client's decoded values and scales
  (``K`` copies of the field).

  Args:
    bits: bits per number, at least 2 (three levels: ``-s``, 0, ``s``).
    initial_scale: the first half-range ``s_0 > 0`` (about the first upload's size).
    grow, shrink: the step multipliers, ``grow > 1 > shrink > 0``.
  """
  bits = _check_bits(bits, minimum=2)
  initial_scale = _validate.plain(_validate.positive("initial_scale", initial_scale))
  _validate.interval("grow", grow, 1)
  _validate.interval("shrink", shrink, 0, 1)
  grow, shrink = _validate.plain(grow), _validate.plain(shrink)
  half = 2 ** (bits - 1) - 1  # codes -half .. half

  def init(value):
    flat, _ = ravel_pytree(value)
    return AdaptiveState(jnp.zeros_like(flat), jnp.full(flat.shape, initial_scale, flat.dtype))

  def update(value, state, params=None, *, key=None, **extra_args):
    del params, extra_args
    flat, unravel = ravel_pytree(value)
    step = state.scale / half
    position = jnp.clip((flat - state.decoded) / step, -half, half)
    code = _stochastic_round(position, key, "adaptive_quantization")
    decoded = state.decoded + code * step
    factor = jnp.where(jnp.abs(code) >= half, grow, jnp.where(code == 0, shrink, 1.0))
    # floor: the grid step stays a normal float (a flushed-to-zero step would divide by 0)
    scale = jnp.maximum(state.scale * factor, 4 * half * jnp.finfo(flat.dtype).tiny)
    return unravel(decoded), AdaptiveState(decoded, scale.astype(flat.dtype))

  name = f"adaptive{bits}_scale{initial_scale!r}_grow{grow!r}_shrink{shrink!r}"
  return Codec(init, update, lambda size, dtype: size * bits, name)


__all__ = [
  "Codec",
  "identity",
  "stochastic_quantization",
  "adaptive_quantization",
  "top_k",
  "QuantizationState",
  "AdaptiveState",
  "TopKState",
]
