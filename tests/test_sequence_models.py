"""The benchmark models of issue 45: ``ShakespeareLSTM`` with its masked loss, and ``EmnistCNN``.

* Parameter counts are the published models' (TFF / FedJAX): 820,522 for the Shakespeare
  LSTM over 90 tokens, 1,206,590 for the EMNIST CNN with 62 classes (``jax.eval_shape``: the
  real sizes are traced, never compiled).
* ``masked_cross_entropy`` / ``masked_accuracy`` against hand-computed values: masked
  positions change neither the value nor the gradient (zero on masked logits); all masked
  is 0 with a zero gradient; kept labels out of range are refused or NaN.
* The LSTM is per-sequence (``vmap`` equals the batch call) and causal (a later token never
  changes an earlier step's logits), and a few SGD steps learn a repeating sequence.
* ``EmnistCNN``: per-image, dropout only when asked for and then driven by the key.

Mechanism tests use a tiny LSTM (vocabulary 6, 16 units) so that compiling stays short.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedco.models import (
  SHAKESPEARE_VOCAB_SIZE,
  EmnistCNN,
  ShakespeareLSTM,
  init_cnn,
  masked_accuracy,
  masked_cross_entropy,
)


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def _shapes(model, example):
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), example)


def test_shakespeare_lstm_has_the_published_parameter_count():
  """TFF's ``create_recurrent_model(90)`` and FedJAX's ``create_lstm_model(86)``: 820,522."""
  assert SHAKESPEARE_VOCAB_SIZE == 90  # 86 characters + pad, OOV, BOS, EOS
  params = _shapes(ShakespeareLSTM(), jnp.zeros(80, jnp.int32))["params"]
  parts = {name: _count(tree) for name, tree in params.items()}
  assert parts == {"embed": 90 * 8, "lstm_0": 271_360, "lstm_1": 525_312, "logits": 23_130}
  # An LSTM layer: 4 gates of [input + hidden -> hidden] weights and one bias each.
  assert parts["lstm_0"] == 4 * ((8 + 256) * 256 + 256)
  assert parts["lstm_1"] == 4 * ((256 + 256) * 256 + 256)
  assert _count(params) == 820_522


def test_emnist_cnn_has_the_published_parameter_count():
  image = jnp.zeros((28, 28, 1))
  params = _shapes(EmnistCNN(), image)["params"]
  parts = {name: _count(tree) for name, tree in params.items()}
  assert parts == {"conv_0": 320, "conv_1": 18_496, "hidden": 1_179_776, "logits": 7_998}
  assert _count(params) == 1_206_590  # FedJAX create_conv_model(only_digits=False)
  assert _count(_shapes(EmnistCNN(num_classes=10), image)) == 1_199_882


def test_output_shapes_for_one_example_and_a_batch():
  lstm = ShakespeareLSTM()
  params = _shapes(lstm, jnp.zeros(80, jnp.int32))
  assert jax.eval_shape(lstm.apply, params, jnp.zeros(80, jnp.int32)).shape == (80, 90)
  assert jax.eval_shape(lstm.apply, params, jnp.zeros((3, 80), jnp.int32)).shape == (3, 80, 90)
  cnn = EmnistCNN()
  params = _shapes(cnn, jnp.zeros((28, 28, 1)))
  assert jax.eval_shape(cnn.apply, params, jnp.zeros((28, 28, 1))).shape == (62,)
  assert jax.eval_shape(cnn.apply, params, jnp.zeros((5, 28, 28, 1))).shape == (5, 62)


LOGITS = jnp.asarray(
  [[1.0, 2.0, 0.0], [0.5, -1.0, 3.0], [4.0, 0.0, 0.0], [0.0, 0.0, 0.0]], jnp.float32
)
LABELS = jnp.asarray([1, 2, 0, 0])
MASK = jnp.asarray([True, True, False, False])


def _by_hand(logits, labels, keep):
  logits = np.asarray(logits, np.float64)
  rows = [np.log(np.exp(logits[t]).sum()) - logits[t, labels[t]] for t in range(len(labels))]
  kept = [r for r, k in zip(rows, keep) if k]
  return sum(kept) / max(len(kept), 1)


def test_masked_cross_entropy_by_hand():
  loss = masked_cross_entropy(LOGITS, LABELS, MASK)
  expected = _by_hand(LOGITS, [1, 2, 0, 0], [1, 1, 0, 0])
  np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
  np.testing.assert_allclose(float(loss), (0.40760596 + 0.09567433) / 2, rtol=1e-6)
  # Masked positions contribute nothing: other logits or labels there change nothing.
  edited = masked_cross_entropy(LOGITS.at[2:].set(-7.0), LABELS.at[2:].set(1), MASK)
  np.testing.assert_allclose(float(edited), float(loss), rtol=1e-7)
  # A float mask means the same; every position kept is the plain mean.
  np.testing.assert_allclose(masked_cross_entropy(LOGITS, LABELS, MASK.astype(float)), loss)
  everything = masked_cross_entropy(LOGITS, LABELS, jnp.ones(4))
  np.testing.assert_allclose(float(everything), _by_hand(LOGITS, [1, 2, 0, 0], [1] * 4), 1e-6)


def test_masked_cross_entropy_gradient_is_zero_on_masked_logits():
  grad = jax.grad(masked_cross_entropy)(LOGITS, LABELS, MASK)
  chex.assert_trees_all_equal(grad[2:], jnp.zeros((2, 3)))
  # The kept rows: (softmax - one_hot) / kept count.
  probs = jax.nn.softmax(LOGITS[:2], axis=-1)
  expected = (probs - jax.nn.one_hot(LABELS[:2], 3)) / 2
  chex.assert_trees_all_close(grad[:2], expected, atol=1e-6)
  # Nothing kept: loss 0, gradient 0, both finite.
  none = jnp.zeros(4, bool)
  assert float(masked_cross_entropy(LOGITS, LABELS, none)) == 0.0
  chex.assert_trees_all_equal(
    jax.grad(masked_cross_entropy)(LOGITS, LABELS, none), jnp.zeros_like(LOGITS)
  )


def test_masked_accuracy_by_hand():
  # argmax per row: 1, 2, 0, 0 -> all right; change labels to make rows 1 and 2 wrong.
  assert float(masked_accuracy(LOGITS, LABELS, MASK)) == 1.0
  labels = jnp.asarray([1, 0, 1, 0])
  assert float(masked_accuracy(LOGITS, labels, MASK)) == 0.5  # row 2 is masked
  assert float(masked_accuracy(LOGITS, labels, jnp.ones(4))) == 0.5
  assert float(masked_accuracy(LOGITS, labels, jnp.zeros(4))) == 0.0


def test_kept_labels_out_of_range_are_refused_masked_ones_are_not():
  with pytest.raises(ValueError, match=r"masked_cross_entropy: label must be a class index"):
    masked_cross_entropy(LOGITS, LABELS.at[0].set(3), MASK)
  with pytest.raises(ValueError, match=r"masked_accuracy: label must be a class index"):
    masked_accuracy(LOGITS, LABELS.at[1].set(-1), MASK)
  # A masked position may carry any id (an ignore value such as -1).
  ok = masked_cross_entropy(LOGITS, LABELS.at[3].set(-1), MASK)
  np.testing.assert_allclose(ok, masked_cross_entropy(LOGITS, LABELS, MASK))
  # Traced: NaN, which a simulation's finite checks stop at.
  traced = jax.jit(masked_cross_entropy)(LOGITS, LABELS.at[0].set(3), MASK)
  assert np.isnan(float(traced))
  with pytest.raises(ValueError, match=r"logits \[T, V\], labels \[T\] and mask \[T\]"):
    masked_cross_entropy(LOGITS, LABELS, MASK[:3])


TINY = ShakespeareLSTM(vocab_size=6, embed_size=4, hidden_size=16)


@pytest.fixture(scope="module")
def tiny():
  return jax.jit(TINY.init)(jax.random.PRNGKey(1), jnp.zeros(12, jnp.int32))


def test_lstm_is_per_sequence_and_causal(tiny):
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 6, (3, 12)), jnp.int32)
  apply = jax.jit(TINY.apply)
  batch = apply(tiny, tokens)
  single = jax.jit(jax.vmap(TINY.apply, in_axes=(None, 0)))(tiny, tokens)
  chex.assert_shape(batch, (3, 12, 6))
  chex.assert_trees_all_close(single, batch, atol=1e-5, rtol=1e-5)
  # A token at step 7 changes the logits from step 7 on, never before.
  changed = apply(tiny, tokens.at[0, 7].set((tokens[0, 7] + 1) % 6))
  chex.assert_trees_all_close(changed[0, :7], batch[0, :7], atol=1e-6)
  assert not np.allclose(changed[0, 7:], batch[0, 7:], atol=1e-4)
  chex.assert_trees_all_close(changed[1:], batch[1:], atol=1e-6)


def test_sgd_learns_a_repeating_sequence(tiny):
  """Mean masked loss over a vmapped batch of "1 2 3 4 1 2 3 4 ..." (last 3 steps padded)."""
  period = jnp.tile(jnp.arange(1, 5), 4)  # 16 tokens
  x = jnp.stack([period[:12], period[1:13]])  # two shifted sequences
  y = jnp.stack([period[1:13], period[2:14]])
  mask = jnp.arange(12) < 9
  y = jnp.where(mask, y, 0)  # padding targets

  def loss(params):
    logits = jax.vmap(TINY.apply, in_axes=(None, 0))(params, x)
    return jnp.mean(jax.vmap(masked_cross_entropy, in_axes=(0, 0, None))(logits, y, mask))

  @jax.jit
  def steps(params):
    def step(p, _):
      value, grads = jax.value_and_grad(loss)(p)
      return jax.tree.map(lambda w, g: w - 1.0 * g, p, grads), value

    return jax.lax.scan(step, params, None, length=40)

  params, losses = steps(tiny)
  final = float(loss(params))
  assert np.isfinite(final) and float(losses[0]) > np.log(6) * 0.8
  assert final < 0.5 * float(losses[0]), (float(losses[0]), final)
  logits = jax.vmap(TINY.apply, in_axes=(None, 0))(params, x)
  accuracy = jax.vmap(masked_accuracy, in_axes=(0, 0, None))(logits, y, mask)
  assert float(accuracy.mean()) > 0.9


@pytest.fixture(scope="module")
def emnist():
  model = EmnistCNN(num_classes=10)
  return model, init_cnn(model, (28, 28, 1), seed=0)


def test_emnist_cnn_is_per_image_and_deterministic_by_default(emnist):
  model, params = emnist
  images = jnp.asarray(np.random.default_rng(3).normal(size=(3, 28, 28, 1)), jnp.float32)
  batch = jax.jit(model.apply)(params, images)
  single = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))(params, images)
  chex.assert_shape(batch, (3, 10))
  chex.assert_trees_all_close(single, batch, atol=1e-5, rtol=1e-5)
  chex.assert_tree_all_finite(batch)


def test_emnist_cnn_dropout_only_when_asked(emnist):
  _, params = emnist
  image = jnp.asarray(np.random.default_rng(4).normal(size=(28, 28, 1)), jnp.float32)
  plain = jax.jit(EmnistCNN(num_classes=10).apply)(params, image)
  noisy = EmnistCNN(num_classes=10, deterministic=False)
  with pytest.raises(Exception, match="dropout"):  # flax: no "dropout" rng given
    jax.eval_shape(noisy.apply, params, image)
  apply = jax.jit(lambda key: noisy.apply(params, image, rngs={"dropout": key}))
  a, b, again = (apply(jax.random.PRNGKey(k)) for k in (0, 1, 0))
  chex.assert_trees_all_equal(a, again)
  assert not np.allclose(a, plain, atol=1e-4) and not np.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize(
  "make,name",
  [
    (lambda: ShakespeareLSTM(vocab_size=0), "vocab_size"),
    (lambda: ShakespeareLSTM(hidden_size=2.5), "hidden_size"),
    (lambda: ShakespeareLSTM(num_layers=0), "num_layers"),
    (lambda: ShakespeareLSTM(embed_size=-8), "embed_size"),
    (lambda: EmnistCNN(num_classes=0), "num_classes"),
    (lambda: EmnistCNN(deterministic="yes"), "deterministic"),
    (lambda: EmnistCNN(conv_impl="fast"), "conv_impl"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
  with pytest.raises(ValueError, match=name):
    make()


def test_wrong_inputs_raise_one_line_value_errors():
  model = ShakespeareLSTM(vocab_size=6, hidden_size=4)
  with pytest.raises(ValueError, match=r"integer token ids \[T\] or a batch \[n, T\]"):
    jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros(12))  # floats
  with pytest.raises(ValueError, match=r"integer token ids \[T\] or a batch \[n, T\]"):
    jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((2, 3, 4), jnp.int32))
  with pytest.raises(ValueError, match=r"EmnistCNN takes one image \[H, W, C\] or a batch"):
    jax.eval_shape(EmnistCNN().init, jax.random.PRNGKey(0), jnp.zeros((28, 28)))
