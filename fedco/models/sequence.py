"""The Shakespeare next-character LSTM, and the token loss and accuracy masked on padding.

``ShakespeareLSTM`` is the character model of McMahan et al. 2017 (Sec. 3, "Shakespeare
LSTM"), which Reddi et al. 2021 ("Adaptive Federated Optimization", App. C), TensorFlow
Federated (``create_recurrent_model``) and FedJAX (``fedjax.models.shakespeare.
create_lstm_model``) use: each token embedded in 8 dimensions, two LSTM layers of 256 units
returning every step, and a dense layer to the vocabulary at every step. It takes ONE
sequence of token ids ``[T]`` (80 in the benchmark) and returns next-token logits
``[T, vocab_size]``; ``jax.vmap`` makes the batch (a batch ``[n, T]`` is also accepted).

The vocabulary is TFF's and FedJAX's: 86 characters plus 4 special tokens (padding 0,
out-of-vocabulary, beginning and end of sequence), so ``vocab_size=90`` embedding rows and
logits. FedJAX's ``create_lstm_model(vocab_size=86)`` counts the characters only and adds
the 4 itself; TFF's ``create_recurrent_model(vocab_size=90)`` counts them all, as here.

The loss of a sequence leaves out its padding: :func:`masked_cross_entropy` is the mean
token loss over the positions a ``mask`` keeps, :func:`masked_accuracy` the fraction of
them predicted right (decision 100).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from fedco import _labels, _validate

#: Shakespeare's tokens as TFF and FedJAX count them: 86 characters plus pad, OOV, BOS and
#: EOS (``fedco.data.tff.NUM_CLASSES``).
SHAKESPEARE_VOCAB_SIZE = 90


class ShakespeareLSTM(nn.Module):
  """Next-token LSTM: ``Embed(vocab_size, embed)``, LSTM layers, ``Dense(vocab_size)``.

  The defaults are the Shakespeare model of McMahan et al. 2017 and Reddi et al. 2021: an
  8-dimensional embedding, two LSTM layers of 256 units (``nn.OptimizedLSTMCell`` scanned
  over time by ``nn.RNN``, zero initial state), and logits over 90 tokens at every step:
  820,522 parameters (embedding 720, LSTMs 271,360 and 525,312, dense 23,130), as TFF's and
  FedJAX's models have. One sequence of token ids ``[T]`` -> logits ``[T, vocab_size]``; a
  batch ``[n, T]`` -> ``[n, T, vocab_size]``, each sequence on its own.

  Attributes:
    vocab_size: tokens, special ones included (embedding rows and logits; default 90).
    embed_size: embedding width (default 8).
    hidden_size: units of every LSTM layer (default 256).
    num_layers: LSTM layers (default 2).

  Raises:
    ValueError: if an attribute is not a positive int, or the input is not one sequence
      ``[T]`` or a batch ``[n, T]`` of integer ids.

  Examples:
    The published model's parameter count and shapes (``jax.eval_shape`` only traces, so
    nothing is compiled):

    >>> import jax
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> model = fedco.models.ShakespeareLSTM()
    >>> sequence = jnp.zeros(80, jnp.int32)
    >>> params = jax.eval_shape(model.init, jax.random.PRNGKey(0), sequence)
    >>> sum(p.size for p in jax.tree.leaves(params))
    820522
    >>> jax.eval_shape(model.apply, params, sequence).shape
    (80, 90)
  """

  vocab_size: int = SHAKESPEARE_VOCAB_SIZE
  embed_size: int = 8
  hidden_size: int = 256
  num_layers: int = 2

  def __post_init__(self):
    for name in ("vocab_size", "embed_size", "hidden_size", "num_layers"):
      _validate.positive_int(name, getattr(self, name))
    super().__post_init__()

  @nn.compact
  def __call__(self, tokens) -> jax.Array:
    tokens = jnp.asarray(tokens)
    if tokens.ndim not in (1, 2) or not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(
        "ShakespeareLSTM takes one sequence of integer token ids [T] or a batch [n, T], "
        f"got shape {tuple(tokens.shape)} of {tokens.dtype}"
      )
    x = nn.Embed(self.vocab_size, self.embed_size, name="embed")(tokens)
    for i in range(self.num_layers):
      x = nn.RNN(nn.OptimizedLSTMCell(self.hidden_size, name=f"lstm_{i}"))(x)
    return nn.Dense(self.vocab_size, name="logits")(x)


def _token_terms(logits, labels, mask, what: str):
  """``(logits [T, V], labels [T], keep [T] float, valid [T] bool)``, shapes checked."""
  raw_labels, raw_mask = labels, mask
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  mask = jnp.asarray(mask)
  if logits.ndim != 2 or labels.shape != logits.shape[:1] or mask.shape != labels.shape:
    raise ValueError(
      f"{what} takes one sequence's logits [T, V], labels [T] and mask [T], got shapes "
      f"{tuple(logits.shape)}, {tuple(labels.shape)} and {tuple(mask.shape)}"
    )
  classes = logits.shape[-1]
  keep = mask.astype(bool)
  if isinstance(raw_labels, jax.core.Tracer):  # checked against the data where fedco knows it
    _labels.check(raw_labels, classes, what)
  elif not isinstance(raw_mask, jax.core.Tracer):  # concrete: only the kept labels count
    _labels.check(np.asarray(labels)[np.asarray(keep)], classes, what)
  valid = (labels >= 0) & (labels < classes)
  return logits, jnp.clip(labels, 0, classes - 1), keep, valid


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  r"""One sequence's mean token cross-entropy over the positions ``mask`` keeps.

  .. math::

    \ell = \frac{\sum_t m_t \,(\log \sum_c e^{z_{t,c}} - z_{t, y_t})}{\max(1, \sum_t m_t)}

  Masked positions (padding) contribute nothing, to the value or to the gradient, whatever
  their labels; a sequence with every position masked has loss 0. Each sequence's kept
  tokens are averaged on their own, so under ``jax.vmap`` a short sequence weighs as much
  as a long one. FedJAX's training loss divides by ``T`` instead of the kept count: that is
  this value times ``mask.sum() / T``.

  A kept label outside ``[0, V)`` is refused as in :func:`fedco.models.cross_entropy`
  (concrete: ``ValueError``; traced: NaN).

  Args:
    logits: one sequence's logits, ``[T, V]``.
    labels: its next tokens, integers ``[T]``.
    mask: ``[T]``, true (or nonzero) where a position counts.

  Returns:
    The loss, a float scalar.

  Raises:
    ValueError: if the shapes do not match, or a concrete kept label is not in ``[0, V)``.

  Examples:
    Two of three positions kept; the third (label 0, padding) is left out:

    >>> import jax.numpy as jnp
    >>> import fedco
    >>> logits = jnp.array([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [9.0, 0.0, 0.0]])
    >>> loss = fedco.models.masked_cross_entropy(logits, jnp.array([1, 0, 0]),
    ...                                          jnp.array([True, True, False]))
    >>> round(float(loss), 4)  # (log 3 + 0.2395) / 2
    0.6691
    >>> float(fedco.models.masked_cross_entropy(logits, jnp.zeros(3, int), jnp.zeros(3)))
    0.0
  """
  logits, labels, keep, valid = _token_terms(logits, labels, mask, "masked_cross_entropy")
  picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  tokens = jax.nn.logsumexp(logits, axis=-1) - picked
  tokens = jnp.where(valid, tokens, jnp.nan)
  total = jnp.sum(jnp.where(keep, tokens, 0.0))
  return total / jnp.maximum(jnp.sum(keep), 1).astype(total.dtype)


def masked_accuracy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """The fraction of the kept positions whose ``argmax`` is the label (0 if none are kept).

  The per-sequence counterpart of :func:`fedco.models.accuracy`; ``mask`` leaves out
  padding (and, for Shakespeare's published accuracy, out-of-vocabulary, begin- and
  end-of-sequence targets). Kept labels outside ``[0, V)`` are refused (concrete) or give
  NaN (traced). For a token-weighted mean over many sequences, sum ``accuracy * mask.sum()``
  and divide by the total kept count.

  Args:
    logits: one sequence's logits, ``[T, V]``.
    labels: its next tokens, integers ``[T]``.
    mask: ``[T]``, true (or nonzero) where a position counts.

  Returns:
    A float32 scalar in ``[0, 1]``.

  Raises:
    ValueError: if the shapes do not match, or a concrete kept label is not in ``[0, V)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedco
    >>> logits = jnp.array([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    >>> hits = fedco.models.masked_accuracy(logits, jnp.array([1, 1, 0]),
    ...                                     jnp.array([1, 1, 0]))
    >>> float(hits)  # right on the first, wrong on the second, the third left out
    0.5
  """
  logits, labels, keep, valid = _token_terms(logits, labels, mask, "masked_accuracy")
  hits = jnp.where(valid, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32), jnp.nan)
  total = jnp.sum(jnp.where(keep, hits, 0.0))
  return total / jnp.maximum(jnp.sum(keep), 1).astype(jnp.float32)
