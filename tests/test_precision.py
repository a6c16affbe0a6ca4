"""Mixed precision (issue 49): ``fedco.problems.mixed_precision`` computes per-example
functions in bfloat16 or float16 while parameters, gradients, uploads and aggregation stay
float32; float16's loss scale keeps small gradients; bfloat16 runs track float32 runs."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import models
from fedco.problems import precision
from tests import helpers

SHARED = str(helpers.SHARED_DATA / "femnist_leaf_sf005")
MLP = models.MLP(hidden=(16,), out=3)


def _mlp_loss(params, e):
  return models.cross_entropy(MLP.apply(params, e["x"]), e["y"])


def _mlp():
  rng = np.random.default_rng(0)
  params = models.init_params(MLP, jnp.zeros(5), 0)
  batch = {"x": jnp.asarray(rng.normal(size=(8, 5)), jnp.float32), "y": jnp.arange(8) % 3}
  return params, batch


def test_bfloat16_gradients_are_float32_and_close_to_float32_ones():
  params, batch = _mlp()
  problem = fedco.plain(_mlp_loss)
  low = fedco.problems.mixed_precision(problem, "bfloat16")
  weights = jnp.full((8,), 1 / 8)
  exact = problem.extra_grad(params, batch, weights)
  mixed = low.extra_grad(params, batch, weights)
  for a, b in zip(jax.tree.leaves(exact), jax.tree.leaves(mixed), strict=True):
    assert b.dtype == jnp.float32
    np.testing.assert_allclose(b, a, rtol=0.05, atol=2e-3)
  assert (
    max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(exact), jax.tree.leaves(mixed)))
    > 0
  )
  # the forward pass ran in bfloat16: its value differs from float32's by bfloat16's rounding
  v, v_low = problem.extra_value(params, batch, weights), low.extra_value(params, batch, weights)
  assert v_low.dtype == jnp.float32 and 0 < abs(float(v - v_low)) < 0.02


def test_a_compositional_problems_inner_value_comes_back_in_float32():
  problem = fedco.problems.client_kl_dro(_mlp_loss, 1.0)
  low = fedco.problems.mixed_precision(problem)
  params, batch = _mlp()
  y = low.inner_value(params, batch, jnp.full((8,), 1 / 8))
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(y))
  assert low.outer is problem.outer  # a deterministic outer stays float32


def test_float16_needs_its_loss_scale_for_small_gradients():
  """``s * sum(w * a)`` with ``s = a = 1e-4`` (both normal float16 numbers): the gradient
  ``s * a = 1e-8`` rounds to 0 in a float16 backward pass (its smallest subnormal is 6e-8);
  with a loss scale of 2**14 the backward pass stays in float16's normal range."""
  tiny = fedco.plain(lambda w, e: e["s"] * jnp.sum(w * e["a"]))
  one = {"s": jnp.float32(1e-4), "a": jnp.full(4, 1e-4, jnp.float32)}
  plain16 = precision._lowered(tiny.extra, jnp.float16, None)
  assert float(jnp.abs(jax.grad(plain16)(jnp.ones(4), one)).max()) == 0.0
  scaled = fedco.problems.mixed_precision(tiny, "float16", loss_scale=2.0**14)
  batch = jax.tree.map(lambda v: jnp.stack([v, v]), one)
  grad = scaled.extra_grad(jnp.ones(4), batch, jnp.full((2,), 0.5))
  assert grad.dtype == jnp.float32
  np.testing.assert_allclose(grad, 1e-8, rtol=2e-3)
  # the default scale (2**10) keeps it too, within float16's subnormal range (about 1%)
  default = fedco.problems.mixed_precision(tiny, "float16").extra_grad(
    jnp.ones(4), batch, jnp.full((2,), 0.5)
  )
  np.testing.assert_allclose(default, 1e-8, rtol=2e-2)


def _digits_run(compute_dtype, rounds=25):
  splits = fedco.data.load_digits()
  x, y = splits.train["x"].reshape(len(splits.train["y"]), -1), splits.train["y"]
  parts = np.array_split(np.random.default_rng(0).permutation(len(y)), 10)
  data = fedco.FederatedData.from_clients([{"x": x[p], "y": y[p]} for p in parts])
  model = models.LogisticRegression(num_classes=10)
  problem = fedco.plain(lambda p, e: models.cross_entropy(model.apply(p, e["x"]), e["y"]))
  problem = fedco.problems.mixed_precision(problem, compute_dtype)
  params = models.init_params(model, jnp.asarray(x[0]), 0)
  result = fedco.simulate(
    problem, fedco.fedavg(0.1, 5), data, params, rounds=rounds, batch_size=16, evaluate=False
  )
  test_x = splits.test["x"].reshape(len(splits.test["y"]), -1)
  logits = jax.vmap(lambda v: model.apply(result.params, v))(test_x)
  accuracy = float(np.mean(np.argmax(logits, -1) == splits.test["y"]))
  return result, accuracy


def test_bfloat16_e1_tracks_float32_and_aggregates_in_float32():
  """E1's model and data (digits, logistic regression, FedAvg): held-out accuracy within
  0.03 of the float32 run; the model stays float32 and the ledger counts the same bytes."""
  full, acc = _digits_run("float32")
  low, acc_low = _digits_run("bfloat16")
  assert acc > 0.8 and abs(acc - acc_low) <= 0.03, (acc, acc_low)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(low.params))
  assert low.ledger == full.ledger
  assert (
    max(
      float(jnp.abs(a - b).max())
      for a, b in zip(jax.tree.leaves(full.params), jax.tree.leaves(low.params))
    )
    > 0
  )


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/data/femnist_leaf_sf005 absent")
def test_bfloat16_femnist_writers_track_float32():
  """FEMNIST's first 30 writers, an MLP, 5 rounds of 20 FedAvg steps: pooled held-out
  accuracy within 0.03 of the float32 run's."""
  fed = fedco.data.load_leaf(SHARED, "femnist", num_classes=62)
  writers = range(30)
  train = fedco.FederatedData.from_clients([fed.train.client(k) for k in writers])
  val = fedco.FederatedData.from_clients([fed.val.client(k) for k in writers])
  model = models.MLP(hidden=(32,), out=62)
  flat = lambda x: jnp.reshape(x, (-1,))
  loss = lambda p, e: models.cross_entropy(model.apply(p, flat(e["x"])), e["y"])
  params = models.init_params(model, flat(train.examples["x"][0]), 0)
  accuracies = []
  for compute_dtype in ("float32", "bfloat16"):
    problem = fedco.problems.mixed_precision(fedco.plain(loss), compute_dtype)
    result = fedco.simulate(
      problem, fedco.fedavg(0.1, 20), train, params, rounds=5, batch_size=10, evaluate=False
    )
    logits = jax.vmap(lambda x, p=result.params: model.apply(p, flat(x)))(val.examples["x"])
    accuracies.append(float(jnp.mean(jnp.argmax(logits, -1) == val.examples["y"])))
  assert accuracies[0] > 0.15 and abs(accuracies[0] - accuracies[1]) <= 0.03, accuracies


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"compute_dtype": "int8"}, "compute_dtype"),
    ({"compute_dtype": "float16", "loss_scale": 3.0}, "power of two"),
    ({"compute_dtype": "bfloat16", "loss_scale": 8.0}, "only float16"),
  ],
)
def test_bad_arguments_are_one_line_errors(kwargs, match):
  with pytest.raises(ValueError, match=match) as err:
    fedco.problems.mixed_precision(fedco.plain(_mlp_loss), **kwargs)
  assert "\n" not in str(err.value)
