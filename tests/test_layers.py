"""fedco.models.layers: the im2col ("matmul") convolution and reshape pool against XLA's."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedco.models import CNN4, OmniglotCNN, ResNet20, init_cnn, layers

CASES = [  # (input shape, kernel shape, strides, padding)
  ((2, 8, 8, 3), (3, 3, 3, 4), (1, 1), "SAME"),
  ((2, 7, 9, 2), (3, 3, 2, 5), (1, 1), "SAME"),
  ((1, 8, 8, 4), (3, 3, 4, 4), (2, 2), ((1, 1), (1, 1))),
  ((1, 9, 7, 4), (3, 3, 4, 3), (2, 2), "SAME"),
  ((3, 8, 8, 4), (1, 1, 4, 6), (2, 2), "VALID"),
  ((1, 6, 6, 2), (3, 2, 2, 3), (1, 2), "VALID"),
]


def _rand(key, shape):  # numpy's: jax.random.normal would compile once per shape
  return jnp.asarray(np.random.default_rng(key).standard_normal(shape, np.float32))


@pytest.mark.parametrize("xs,ks,strides,padding", CASES)
def test_conv2d_matches_xla_values_and_derivatives(xs, ks, strides, padding):
  x, k = _rand(0, xs), _rand(1, ks)
  conv = lambda impl: lambda x, k: layers.conv2d(x, k, strides, padding, impl)
  ref = jax.lax.conv_general_dilated(
    x, k, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  np.testing.assert_allclose(conv("matmul")(x, k), ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(conv("xla")(x, k), ref, rtol=1e-6, atol=1e-6)

  def derivatives(f):  # gradient and a Hessian-vector product of a non-quadratic loss
    loss = lambda x, k: jnp.sum(jnp.tanh(f(x, k)) ** 2)
    g = jax.grad(loss, argnums=(0, 1))
    hvp = lambda x, k: jax.jvp(g, (x, k), (jnp.ones_like(x), jnp.ones_like(k)))[1]
    return jax.jit(lambda x, k: (g(x, k), hvp(x, k)))(x, k)

  for got, want in zip(
    jax.tree.leaves(derivatives(conv("matmul"))), jax.tree.leaves(derivatives(conv("xla")))
  ):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_max_pool_matches_nn_max_pool_without_ties():
  x = _rand(2, (2, 9, 8, 3))  # an odd height: the last row is dropped, as VALID drops it
  want = nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")
  np.testing.assert_array_equal(layers.max_pool_2x2(x, "matmul"), want)
  grad = lambda impl: jax.grad(lambda x: jnp.sum(layers.max_pool_2x2(x, impl) ** 3))(x)
  np.testing.assert_allclose(grad("matmul"), grad("xla"), rtol=1e-6)


def test_conv_module_has_nn_conv_parameters():
  x = jnp.ones((1, 6, 6, 3))
  key = jax.random.PRNGKey(3)
  for use_bias in (True, False):
    ours = layers.Conv(4, (3, 3), use_bias=use_bias).init(key, x)
    flax = nn.Conv(4, (3, 3), use_bias=use_bias).init(key, x)
    assert jax.tree.structure(ours) == jax.tree.structure(flax)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(flax)):
      np.testing.assert_array_equal(a, b)
    for impl in ("matmul", "xla"):
      ours_out = layers.Conv(4, (3, 3), use_bias=use_bias, impl=impl).apply(ours, x)
      np.testing.assert_allclose(
        ours_out, nn.Conv(4, (3, 3), use_bias=use_bias).apply(flax, x), rtol=1e-5, atol=1e-5
      )


@pytest.mark.parametrize("shape,groups", [((3, 6, 5, 8), 8), ((2, 4, 4, 16), 4), ((2, 7, 6), 3)])
def test_group_norm_matches_flax(shape, groups):
  x = 3.0 + 2.0 * _rand(5, shape)  # a non-zero mean, as activations have
  ours, flax = layers.GroupNorm(groups, 1e-5), nn.GroupNorm(num_groups=groups, epsilon=1e-5)
  params = flax.init(jax.random.PRNGKey(0), x)
  assert jax.tree.structure(ours.init(jax.random.PRNGKey(0), x)) == jax.tree.structure(params)
  params = jax.tree.map(lambda a: a + 0.1 * _rand(6, a.shape), params)  # scale != 1, bias != 0
  np.testing.assert_allclose(ours.apply(params, x), flax.apply(params, x), rtol=1e-4, atol=1e-4)
  loss = lambda m: lambda p, x: jnp.sum(jnp.sin(m.apply(p, x)))
  grads = lambda m: jax.jit(jax.grad(loss(m), argnums=(0, 1)))(params, x)
  for got, want in zip(jax.tree.leaves(grads(ours)), jax.tree.leaves(grads(flax))):
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
  with pytest.raises(ValueError, match="num_groups"):
    layers.GroupNorm(5).init(jax.random.PRNGKey(0), x)


def test_auto_is_matmul_on_cpu_and_gpu(monkeypatch):
  assert jax.default_backend() == "cpu"
  assert layers.resolve_impl("auto") == "matmul"
  for backend, impl in (("gpu", "matmul"), ("tpu", "xla")):  # decision 87
    monkeypatch.setattr(jax, "default_backend", lambda backend=backend: backend)
    assert layers.resolve_impl("auto") == impl


@pytest.mark.parametrize(
  "make,shape",
  [
    # the two differentiated models compile optimized: XLA at level 0 turns their im2col
    # gradients into NaNs (conftest.py); a single layer's (above) compiles right
    pytest.param(
      lambda impl: CNN4(filters=8, conv_impl=impl), (16, 16, 3), marks=pytest.mark.compile_optimized
    ),
    pytest.param(
      lambda impl: OmniglotCNN(filters=8, conv_impl=impl),
      (4, 28, 28, 1),
      marks=pytest.mark.compile_optimized,
    ),
    (lambda impl: ResNet20(width=4, conv_impl=impl), (8, 8, 3)),
  ],
)
def test_models_agree_across_implementations(make, shape):
  params = make("xla").init(jax.random.PRNGKey(1), jnp.zeros(shape))
  shapes = lambda impl: jax.eval_shape(make(impl).init, jax.random.PRNGKey(0), jnp.zeros(shape))
  assert shapes("matmul") == shapes("xla")  # same parameters (values: the Conv test above)
  x = _rand(4, (3,) + shape if len(shape) == 3 else shape)
  if isinstance(make("xla"), ResNet20):  # forward only, eagerly: its gradients take 20 s to
    # compile; stride 2, explicit padding and 1x1 VALID convolutions are differentiated above
    np.testing.assert_allclose(
      make("matmul").apply(params, x), make("xla").apply(params, x), rtol=1e-4, atol=1e-5
    )
    return
  loss = lambda impl: lambda p: jnp.sum(jnp.sin(make(impl).apply(p, x)))
  value_and_grad = lambda impl: jax.jit(jax.value_and_grad(loss(impl)))(params)
  (got_value, got_grad), (want_value, want_grad) = value_and_grad("matmul"), value_and_grad("xla")
  # a sum of 4 x 10 terms of either sign: its float32 rounding depends on the CPU's kernels
  # (seen 2.6e-6 apart on an AMD EPYC), so it is compared absolutely, at the terms' scale
  np.testing.assert_allclose(got_value, want_value, rtol=1e-5, atol=1e-5)
  for got, want in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad)):
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_matmul_model_compiles_without_convolutions_in_a_loop():
  model = CNN4(filters=4, conv_impl="matmul")
  params = init_cnn(model, (16, 16, 3))
  x = jnp.ones((2, 16, 16, 3))

  def steps(p):
    def body(p, _):
      g = jax.grad(lambda p: jnp.sum(model.apply(p, x) ** 2))(p)
      return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), None

    return jax.lax.scan(body, p, None, length=3)[0]

  text = jax.jit(steps).lower(params).compile().as_text()
  assert "convolution(" not in text
  assert (
    "convolution("
    in jax.jit(lambda p: CNN4(filters=4, conv_impl="xla").apply(p, x))
    .lower(params)
    .compile()
    .as_text()
  )


@pytest.mark.parametrize(
  "bad",
  [
    dict(conv_impl="cudnn"),
  ],
)
def test_bad_conv_impl_is_named(bad):
  for make in (CNN4, OmniglotCNN, ResNet20):
    with pytest.raises(ValueError, match="conv_impl"):
      make(**bad)
  with pytest.raises(ValueError, match="conv_impl"):
    layers.conv2d(jnp.ones((1, 4, 4, 1)), jnp.ones((3, 3, 1, 1)), impl="cudnn")
  for strides in (0, 1.5, (1, 2, 3), (True, 1)):
    with pytest.raises(ValueError, match="strides"):
      layers.conv2d(jnp.ones((1, 4, 4, 1)), jnp.ones((3, 3, 1, 1)), strides=strides)
  with pytest.raises(ValueError, match="same C"):
    layers.conv2d(jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 1, 1)))
