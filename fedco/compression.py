"""Compression of what clients send up: optax-style codecs on one communicated field.

A :class:`Codec` is an ``optax.GradientTransformationExtraArgs`` that maps a client's upload
of one field (the *delta* from the value the server already holds, see
:mod:`fedco.runtime.uplink`) to what the server decodes, keeping any per-client memory in its
state (error feedback). It also says how many bits one message costs
(``Codec.payload_bits``), which the run's ledger reports as bytes.

The codecs:

* :func:`identity`: the upload as it is, one float per number;
* :func:`stochastic_quantization`: ``bits`` per number, unbiased;
* :func:`adaptive_quantization`: ``bits`` per number, sent as changes from the last decoded
  value on a grid that adapts to them (error vanishing as the uploads settle);
* :func:`top_k`: the largest numbers and their indices, with error feedback.

Give codecs to a run per field name of the algorithm's communication plan::

    fedco.simulate(problem, fedco.feddro(0.1, 5), data, params, rounds=100,
                   compression={"y": fedco.compression.stochastic_quantization(4),
                                "params": fedco.compression.top_k(0.1)})

The run keeps one codec state per client and field, gives each message its own PRNG key
(folded with the client's id), and, under :mod:`fedco.privacy`, clips what the codec decodes.
The codecs act on the whole field (a pytree), flattened.

Examples:
  One message of a 4-number field at 2 bits per number, and its cost against 32-bit floats:

  >>> import jax
  >>> import jax.numpy as jnp
  >>> import fedco
  >>> codec = fedco.compression.stochastic_quantization(bits=2)
  >>> delta = jnp.array([0.0, 0.25, 0.5, 1.0])
  >>> decoded, state = codec.update(delta, codec.init(delta), key=jax.random.PRNGKey(0))
  >>> [round(float(v), 4) for v in decoded]
  [0.0, 0.0, 0.6667, 1.0]
  >>> codec.payload_bits(4, jnp.float32), fedco.compression.identity().payload_bits(4, jnp.float32)
  (72, 128)
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

  A ``GradientTransformationExtraArgs`` (``init``, ``update``) with three more attributes.
  The run calls ``update`` once per message, vmapped over the round's clients, each with its
  own state and key. Build one from the functions below, or from your own ``init`` and
  ``update`` (its ``update`` must accept ``key=`` and any other keyword arguments).

  Attributes:
    init: ``(value) -> state`` (one client's state, e.g. its error-feedback memory).
    update: ``(value, state, params=None, *, key) -> (decoded, state)``: ``decoded`` is what
      the server reconstructs from the message; ``key`` is this client's PRNG key for this
      message.
    payload_bits: ``(size, dtype) -> int``: bits of one message of a field with ``size``
      numbers of ``dtype``.
    name: a short label for ledgers and fingerprints.
    memory: whether the state carries what earlier messages left unsent (error feedback),
      which only makes sense for uploads that are changes of one quantity over time
      (default ``False``; a run refuses such a codec on a field sent as a value).

  Examples:
    A codec of your own, sending every number as a 16-bit float:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import optax
    >>> import fedco
    >>> def update(value, state, params=None, **extra_args):
    ...   half = lambda a: a.astype(jnp.float16).astype(a.dtype)
    ...   return jax.tree.map(half, value), state
    >>> codec = fedco.compression.Codec(
    ...   lambda value: optax.EmptyState(), update, lambda size, dtype: 16 * size, "half"
    ... )
    >>> decoded, _ = codec.update(jnp.array([1 / 3]), codec.init(None))
    >>> print(round(float(decoded[0]), 6), codec.payload_bits(1000, jnp.float32) // 8)
    0.333252 2000
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
  """Sends the upload as it is (the uncompressed cost: one float per number).

  The reference codec: decoding returns the upload unchanged, and a message of ``size``
  numbers of ``dtype`` costs ``size * 8 * itemsize`` bits (32 per float32).

  Returns:
    A :class:`Codec` named ``"identity"``, with an empty state.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.identity()
    >>> decoded, _ = codec.update(jnp.array([0.5, -1.0]), codec.init(None))
    >>> decoded.tolist(), codec.payload_bits(1000, jnp.float32) // 8
    ([0.5, -1.0], 4000)
  """

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
  """Stochastic quantization's state: empty, as it keeps nothing between messages.

  Attributes:
    (none): the tuple has no fields; it is there so every codec has a state.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> fedco.compression.stochastic_quantization(4).init(jnp.zeros(3))
    QuantizationState()
  """


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
  r"""Unbiased stochastic quantization to ``bits`` bits per number.

  Each number ``v`` of the flattened upload is placed on a grid of ``2**bits`` evenly spaced
  levels over ``[lo, hi]`` and rounded to one of its two neighbouring levels at random, up
  with probability equal to its distance from the lower one in grid steps, so
  ``E[Q(v)] = v``: with step :math:`\Delta = (hi - lo) / (2^{bits} - 1)` and
  :math:`p = (v - lo) / \Delta`,

  .. math::

    Q(v) = lo + \Delta \big(\lfloor p \rfloor + b\big), \qquad
    b \sim \mathrm{Bernoulli}\big(p - \lfloor p \rfloor\big).

  The range ``[lo, hi]`` is:

  * ``scale=None``: ``[lo, hi]`` is the message's own ``[min, max]``, sent with it (two
    floats per message), so every number is in range and the quantizer is exactly unbiased;
  * ``scale=r``: the fixed grid ``[-r, r]`` both sides know (nothing else is sent; for tiny
    fields, where two floats would cost more than they save). Numbers outside it are
    clipped to it first, which biases them: choose ``r`` above the uploads' size.

  A message of ``size`` numbers costs ``size * bits`` bits, plus two floats of the field's
  dtype with ``scale=None``. A field whose message is constant (``lo == hi``) is sent exactly.
  ``update`` needs ``key=``, a PRNG key per message (the run gives each client its own).

  Args:
    bits: bits per number, an int in ``[1, 24]`` (``2**bits`` levels).
    scale: ``None`` (default) for the message's own range, or the fixed half-range ``r > 0``.

  Returns:
    A :class:`Codec` with a :class:`QuantizationState` (empty) state, named
    ``"quantize{bits}"`` (``"quantize{bits}_scale{r}"`` with a fixed grid).

  Raises:
    ValueError: if ``bits`` is not an int in ``[1, 24]`` or ``scale`` is not positive
      (at build), or if ``update`` is called without ``key``.

  Examples:
    At 2 bits the levels of ``[0, 1]`` are 0, 1/3, 2/3 and 1; 0.25 and 0.5 are rounded to
    a neighbouring level at random:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.stochastic_quantization(bits=2)
    >>> delta = jnp.array([0.0, 0.25, 0.5, 1.0])
    >>> decoded, state = codec.update(delta, codec.init(delta), key=jax.random.PRNGKey(0))
    >>> [round(float(v), 4) for v in decoded]
    [0.0, 0.0, 0.6667, 1.0]
    >>> codec.payload_bits(1000, jnp.float32) // 8  # bytes, against 4000 for float32
    258
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
  """Top-k's error-feedback memory: what earlier messages left unsent.

  Attributes:
    error: the unsent remainder, shaped like the field (``()`` without error feedback).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.top_k(0.5)
    >>> _, state = codec.update(jnp.array([0.1, -2.0, 0.3, 1.0]), codec.init(jnp.zeros(4)))
    >>> [round(float(e), 4) for e in state.error]
    [0.1, 0.0, 0.3, 0.0]
  """

  error: PyTree


def _index_bits(size: int) -> int:
  return max(1, math.ceil(math.log2(size))) if size > 1 else 1


def top_k(fraction: float, error_feedback: bool = True) -> Codec:
  r"""Top-k sparsification: send the largest-magnitude numbers and zero the rest.

  Each message sends the ``k = max(1, ceil(fraction * size))`` largest-magnitude numbers of
  the flattened upload (value and index) and zeros the rest, costing ``k`` times (float
  bits + ``ceil(log2(size))`` index bits).

  With ``error_feedback`` (the default) each client keeps what it did not send and adds it
  to its next upload of the field (Stich et al. 2018; Karimireddy et al. 2019): with
  :math:`C` the top-k operator and :math:`e_0 = 0`,

  .. math::

    \hat v_t = C(v_t + e_t), \qquad e_{t+1} = v_t + e_t - \hat v_t,

  so over rounds every part of the uploads is sent: the sum of the decoded messages equals
  the sum of the uploads minus the error still held, whose size stays bounded.

  Args:
    fraction: the share of numbers sent, in ``(0, 1]``.
    error_feedback: keep the unsent remainder in the client's state (default ``True``);
      only for fields sent as changes from a server copy (``params``, ``every_step`` and
      ``every_round`` fields), which a run checks.

  Returns:
    A :class:`Codec` with a :class:`TopKState`, named ``"top{fraction}"`` (``"_ef"`` added
    with error feedback).

  Raises:
    ValueError: if ``fraction`` is not in ``(0, 1]`` or ``error_feedback`` is not a bool.

  Examples:
    Half of four numbers: the two largest are sent, the rest waits in the error memory
    and goes out with the next message:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.top_k(0.5)
    >>> delta = jnp.array([0.1, -2.0, 0.3, 1.0])
    >>> state = codec.init(delta)
    >>> decoded, state = codec.update(delta, state)
    >>> [round(float(v), 4) for v in decoded]
    [0.0, -2.0, 0.0, 1.0]
    >>> decoded, state = codec.update(jnp.array([0.0, 0.0, 0.3, 0.0]), state)
    >>> [round(float(v), 4) for v in decoded]
    [0.0, 0.0, 0.6, 0.0]
    >>> codec.payload_bits(4, jnp.float32)  # 2 x (32 value bits + 2 index bits)
    68
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
  """Adaptive quantization's memory, which the server mirrors from the codes it receives.

  Both are flat vectors, one entry per number of the field, so client and server agree on
  them without sending them.

  Attributes:
    decoded: the last decoded value of each number (zeros at the start).
    scale: the current grid half-range ``s`` of each number (``initial_scale`` at the start).

  Examples:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.adaptive_quantization(bits=3, initial_scale=1.0)
    >>> state = codec.init({"w": jnp.zeros((2, 2)), "b": jnp.zeros(1)})
    >>> state.decoded.shape, state.scale.tolist()
    ((5,), [1.0, 1.0, 1.0, 1.0, 1.0])
  """

  decoded: jax.Array
  scale: jax.Array


def adaptive_quantization(
  bits: int, initial_scale: float, *, grow: float = 2.0, shrink: float = 0.5
) -> Codec:
  r"""Differential quantization with an adaptive step (ADPCM with stochastic rounding).

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

  Per number, with :math:`h = 2^{bits - 1} - 1`, last decoded value :math:`\hat v` and
  half-range :math:`s`, an upload :math:`v` is sent as the code

  .. math::

    c = \operatorname{SR}\Big(\operatorname{clip}\big(h (v - \hat v) / s, -h, h\big)\Big)
    \in \{-h, \dots, h\},
    \qquad \hat v \leftarrow \hat v + c\, s / h,

  where :math:`\operatorname{SR}` rounds stochastically (unbiased), then :math:`s` is
  multiplied by ``grow`` if :math:`|c| = h`, by ``shrink`` if :math:`c = 0`.

  Args:
    bits: bits per number, an int in ``[2, 24]`` (at 2, three levels: ``-s``, 0, ``s``).
    initial_scale: the first half-range ``s_0 > 0`` (about the first upload's size).
    grow: the step multiplier after an outermost code, ``> 1`` (default ``2.0``).
    shrink: the step multiplier after a zero code, in ``(0, 1)`` (default ``0.5``).

  Returns:
    A :class:`Codec` with an :class:`AdaptiveState`, costing ``bits`` per number.

  Raises:
    ValueError: if an argument is out of its range (at build), or if ``update`` is called
      without ``key``.

  Examples:
    The same upload sent again and again: the grid shrinks around it and the decoded value
    closes in on it:

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> codec = fedco.compression.adaptive_quantization(bits=3, initial_scale=1.0)
    >>> delta = jnp.array([0.3, -0.2])
    >>> state = codec.init(delta)
    >>> update = jax.jit(codec.update)
    >>> for i in range(12):
    ...   decoded, state = update(delta, state, key=jax.random.PRNGKey(i))
    >>> [round(float(v), 4) for v in decoded], [float(s) for s in state.scale]
    ([0.3008, -0.1979], [0.00390625, 0.015625])
    >>> codec.payload_bits(2, jnp.float32)
    6
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
