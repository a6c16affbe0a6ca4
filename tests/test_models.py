"""The convolutional models: ``CNN4``, ``OmniglotCNN`` (+ ``TaskBatchNorm``), ``ResNet20``.

* ResNet-20's parameter count is He et al.'s 0.27M (checked without compiling, by
  ``jax.eval_shape``).
* ``CNN4`` and ``ResNet20`` are per-example: ``vmap`` over single images equals the batch call.
* ``OmniglotCNN`` uses the batch statistics of one task: an image's logits depend on the other
  images of its task but not on other tasks under ``vmap`` over a task axis; ``TaskBatchNorm``
  normalizes each channel to mean 0, variance 1; gradients (also second-order) are finite.
* ``LogisticRegression`` is ``nn.Dense`` with an output-major kernel (values and gradients).
* Bad constructor arguments raise ``ValueError`` naming the argument.

Inputs are tiny (few images, few filters) to keep XLA compilation short.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedco.models import CNN4, OmniglotCNN, ResNet20, TaskBatchNorm, cross_entropy, init_cnn


def _count(params) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


def _images(shape, seed=0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def test_resnet20_parameter_count_is_027m():
  model = ResNet20(num_classes=10)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((32, 32, 3)))
  n = _count(shapes)
  print(f"ResNet20(num_classes=10, norm='group') parameters: {n:,}")
  assert 260_000 <= n <= 280_000
  assert n == 272_474  # 269,722 of option A + 2,752 for the two 1x1 projections
  none = jax.eval_shape(ResNet20(norm="none").init, jax.random.PRNGKey(0), jnp.zeros((32, 32, 3)))
  assert 260_000 <= _count(none) <= 280_000


@pytest.mark.parametrize(
  "model,image",
  [
    (CNN4(), (32, 32, 3)),
    (CNN4(norm="none", filters=16), (32, 32, 3)),
    (OmniglotCNN(), (28, 28, 1)),
    (OmniglotCNN(num_classes=20), (28, 28, 1)),
    (ResNet20(), (32, 32, 3)),
    (ResNet20(num_classes=100, norm="none", width=8), (32, 32, 3)),
  ],
)
def test_output_shapes_for_one_image_and_a_batch(model, image):
  """Shapes only (``eval_shape``, nothing compiled): [C] for an image, [n, C] for a batch."""
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros(image))
  classes = model.num_classes
  one = jax.eval_shape(model.apply, params, jnp.zeros(image))
  batch = jax.eval_shape(model.apply, params, jnp.zeros((5,) + image))
  assert one.shape == (classes,) and batch.shape == (5, classes)
  assert one.dtype == batch.dtype == jnp.float32


@pytest.mark.parametrize(
  "model,image",
  [
    (CNN4(filters=8), (16, 16, 3)),
    (ResNet20(), (8, 8, 3)),
  ],
)
def test_per_example_equals_batch(model, image):
  """No batch statistics: vmapping over single images gives the batch call's logits."""
  params = init_cnn(model, image, seed=1)
  x = _images((3,) + image)
  apply = jax.jit(model.apply)
  batch = apply(params, x)
  single = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))(params, x)
  chex.assert_shape(batch, (3, model.num_classes))
  chex.assert_trees_all_close(single, batch, atol=1e-5, rtol=1e-5)
  chex.assert_tree_all_finite(batch)
  # One image's logits ignore the others: changing image 2 leaves images 0 and 1 alone.
  other = apply(params, x.at[2].multiply(-3.0))
  chex.assert_trees_all_close(other[:2], batch[:2], atol=1e-5, rtol=1e-5)


def test_task_batch_norm_normalizes_each_channel():
  x = 3.0 + 2.5 * _images((4, 5, 5, 3))
  x = x * jnp.asarray([1.0, 10.0, 0.1])  # very different per-channel scales
  bn = TaskBatchNorm()
  params = bn.init(jax.random.PRNGKey(0), x)
  assert jax.tree_util.tree_map(jnp.shape, params) == {"params": {"scale": (3,), "bias": (3,)}}
  y = bn.apply(params, x)
  chex.assert_trees_all_close(jnp.mean(y, axis=(0, 1, 2)), jnp.zeros(3), atol=1e-5)
  chex.assert_trees_all_close(jnp.var(y, axis=(0, 1, 2)), jnp.ones(3), atol=1e-3)
  # Learnable scale and bias act after normalization; no running-average state exists.
  scaled = {"params": {"scale": jnp.asarray([2.0, 1.0, 0.5]), "bias": jnp.asarray([1.0, 0, -1])}}
  chex.assert_trees_all_close(
    bn.apply(scaled, x), y * scaled["params"]["scale"] + scaled["params"]["bias"], atol=1e-5
  )
  assert set(params) == {"params"}


@pytest.fixture(scope="module")
def omniglot():
  model = OmniglotCNN(num_classes=5, filters=8)
  params = init_cnn(model, (4, 28, 28, 1), seed=0)
  return model, params


def test_omniglot_tasks_are_independent_under_vmap(omniglot):
  """Batch norm pools one task's images; vmapping over tasks keeps tasks apart."""
  model, params = omniglot
  tasks = _images((2, 4, 28, 28, 1))
  apply_tasks = jax.jit(jax.vmap(model.apply, in_axes=(None, 0)))
  out = apply_tasks(params, tasks)
  chex.assert_shape(out, (2, 4, 5))
  chex.assert_tree_all_finite(out)
  # Task 0's logits do not depend on task 1's images ...
  changed = apply_tasks(params, tasks.at[1].set(5.0 * tasks[1] + 2.0))
  chex.assert_trees_all_close(changed[0], out[0], atol=1e-6, rtol=1e-6)
  assert not np.allclose(changed[1], out[1], atol=1e-3)
  # ... and equal the model applied to task 0 alone, but an image's logits DO depend on the
  # other images of its own task (batch statistics, also at evaluation).
  chex.assert_trees_all_close(jax.jit(model.apply)(params, tasks[0]), out[0], atol=1e-5)
  within = apply_tasks(params, tasks.at[0, 3].multiply(4.0))
  assert not np.allclose(within[0, 0], out[0, 0], atol=1e-4)


@pytest.mark.compile_optimized  # XLA at level 0 miscompiles im2col backward passes
def test_omniglot_gradients_are_finite_first_and_second_order(omniglot):
  model, params = omniglot
  x = _images((5, 28, 28, 1), seed=2)
  labels = jnp.arange(5)

  def loss(p, images):
    return jnp.mean(jax.vmap(cross_entropy)(model.apply(p, images), labels))

  def maml_loss(p):  # one inner SGD step on the support set, loss on the query set
    grads = jax.grad(loss)(p, x)
    adapted = jax.tree_util.tree_map(lambda w, g: w - 0.4 * g, p, grads)
    return loss(adapted, -x)

  grads = jax.jit(jax.grad(loss))(params, x)
  meta = jax.jit(jax.grad(maml_loss))(params)
  for g in (grads, meta):
    chex.assert_trees_all_equal_structs(g, params)
    chex.assert_tree_all_finite(g)
    assert float(sum(jnp.sum(jnp.abs(v)) for v in jax.tree_util.tree_leaves(g))) > 0


@pytest.mark.parametrize(
  "make,name",
  [
    (lambda: ResNet20(norm="batch"), "norm"),
    (lambda: CNN4(norm="layer"), "norm"),
    (lambda: ResNet20(width=0), "width"),
    (lambda: ResNet20(num_classes=1.5), "num_classes"),
    (lambda: CNN4(filters=-1), "filters"),
    (lambda: OmniglotCNN(num_classes=0), "num_classes"),
    (lambda: TaskBatchNorm(epsilon=0.0), "epsilon"),
    (lambda: init_cnn(CNN4(), (0, 32, 3)), "input_shape"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(make, name):
  with pytest.raises(ValueError, match=name):
    make()


def test_bad_norm_message_lists_allowed_values():
  with pytest.raises(ValueError, match=r"norm must be one of \('group', 'none'\), got 'batch'"):
    ResNet20(norm="batch")


def test_wrong_input_rank_raises():
  model = CNN4(filters=4)
  params = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((16, 16, 3)))
  with pytest.raises(ValueError, match=r"one image \[H, W, C\] or a batch"):
    jax.eval_shape(model.apply, params, jnp.zeros((16, 16)))


def test_logistic_regression_is_dense_with_an_output_major_kernel():
  """``LogisticRegression`` stores ``W`` as ``[classes, d]`` (see its docstring) and computes
  what ``nn.Dense`` computes with the transposed kernel, for one example of any shape, and
  casts integer pixels to float32."""
  import flax.linen as nn

  from fedco.models import LogisticRegression, init_params

  model = LogisticRegression(num_classes=3)
  image = jnp.asarray(np.random.default_rng(1).integers(0, 255, (4, 2, 1)), jnp.uint8)
  params = init_params(model, image)
  assert jax.tree.map(jnp.shape, params) == {"params": {"kernel": (3, 8), "bias": (3,)}}
  chex.assert_trees_all_equal(model.apply(params, image), jnp.zeros(3))  # zero start
  rng = np.random.default_rng(2)
  kernel = jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=3), jnp.float32)
  ours = model.apply({"params": {"kernel": kernel, "bias": bias}}, image)
  dense = nn.Dense(3).apply(
    {"params": {"kernel": kernel.T, "bias": bias}}, image.reshape(-1).astype(jnp.float32)
  )
  assert ours.dtype == jnp.float32
  np.testing.assert_allclose(ours, dense, rtol=1e-6)
  # gradients agree too, up to the transpose
  x = image.reshape(-1).astype(jnp.float32)
  g_ours = jax.grad(lambda k: model.apply({"params": {"kernel": k, "bias": bias}}, x)[1])(kernel)
  g_dense = jax.grad(lambda k: nn.Dense(3).apply({"params": {"kernel": k, "bias": bias}}, x)[1])(
    kernel.T
  )
  np.testing.assert_allclose(g_ours, g_dense.T, rtol=1e-6)
