"""Findings of a deliberate-misuse probe of the library: each bad input is a one-line
``ValueError`` naming the argument (never a JAX or flax traceback), NumPy scalars work
wherever Python numbers do, and out-of-range labels never pass for another class."""

import os
import traceback
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import compression, models
from fedco.problems import (
  client_kl_dro,
  client_kl_dro_log,
  portfolio,
  sample_chi2_dro,
  sample_kl_dro,
)
from tests import helpers

LOSS = lambda p, e: jnp.sum(p * e["r"])
INF, NAN = float("inf"), float("nan")


def _one_line(make, match, error=ValueError):
  """``make()`` raises ``error`` matching ``match``: one line, raised by fedco's code."""
  with pytest.raises(error, match=match) as err:
    make()
  message = str(err.value)
  assert "\n" not in message, message
  innermost = traceback.extract_tb(err.value.__traceback__)[-1].filename
  for package in ("jax", "flax", "numpy"):
    assert f"{os.sep}{package}{os.sep}" not in innermost, f"raised inside {package}: {innermost}"
  return message


@pytest.fixture(scope="module")
def portfolio_data():
  return fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])


# ---- 1. NumPy scalars (and 0-d arrays) wherever Python numbers work ----------------------

NUMPY_SCALARS = {
  "client_kl_dro gamma float32": lambda: client_kl_dro(LOSS, np.float32(0.2)),
  "client_kl_dro gamma 0-d": lambda: client_kl_dro(LOSS, np.array(0.2)),
  "client_kl_dro_log": lambda: client_kl_dro_log(LOSS, np.float32(0.5), np.int64(4)),
  "client_kl_dro_log 0-d clients": lambda: client_kl_dro_log(LOSS, 0.5, np.array(4)),
  "sample_kl_dro": lambda: sample_kl_dro(LOSS, np.float32(0.5), shift=np.float32(1.0)),
  "sample_chi2_dro": lambda: sample_chi2_dro(LOSS, np.float32(0.5)),
  "adaptive grow": lambda: compression.adaptive_quantization(4, 1.0, grow=np.float32(2.0)),
  "adaptive shrink": lambda: compression.adaptive_quantization(4, 1.0, shrink=np.float32(0.5)),
  "adaptive bits 0-d": lambda: compression.adaptive_quantization(np.array(4), 1.0),
  "top_k 0-d": lambda: compression.top_k(np.array(0.5)),
  "inject float32": lambda: fedco.inject_hyperparams(fedco.feddro)(learning_rate=np.float32(0.1)),
}


@pytest.mark.parametrize("name", sorted(NUMPY_SCALARS))
def test_numpy_scalars_are_accepted(name):
  NUMPY_SCALARS[name]()


def test_numpy_scalars_build_the_same_problem_and_codec():
  codec = compression.adaptive_quantization(
    4, np.float32(1.0), grow=np.float32(2.0), shrink=np.float64(0.5)
  )
  assert codec.name == compression.adaptive_quantization(4, 1.0).name
  y = jnp.array([0.3, 1.2])
  np.testing.assert_allclose(
    client_kl_dro(LOSS, np.float32(0.5)).outer(y), client_kl_dro(LOSS, 0.5).outer(y), rtol=1e-6
  )


def test_injected_numpy_scalars_are_hyperparameters():
  alg = fedco.inject_hyperparams(fedco.feddro)(learning_rate=np.float32(0.1))
  state = alg.init(jnp.zeros(3))
  hyper = jax.tree_util.tree_flatten_with_path(state)[0]
  assert any("learning_rate" in jax.tree_util.keystr(path) for path, _ in hyper)


def test_simulate_takes_a_numpy_clients_per_round(portfolio_data):
  sim = fedco.Simulator(
    portfolio(1.0),
    fedco.feddro(),
    portfolio_data,
    clients_per_round=np.int64(2),
    straggler_prob=np.float32(0.25),
  )
  assert sim.clients_per_round == 2 and type(sim.clients_per_round) is int
  result = fedco.simulate(
    portfolio(1.0),
    fedco.feddro(),
    portfolio_data,
    jnp.zeros(3),
    rounds=1,
    batch_size=4,
    clients_per_round=np.int64(2),
  )
  assert np.all(np.isfinite(result.metrics["objective"]))


BOOLS = {
  "kl gamma True": (lambda: client_kl_dro(LOSS, True), "gamma"),
  "kl gamma np.bool_": (lambda: client_kl_dro(LOSS, np.bool_(True)), "gamma"),
  "kl log clients True": (lambda: client_kl_dro_log(LOSS, 1.0, True), "num_clients"),
  "adaptive grow True": (lambda: compression.adaptive_quantization(4, 1.0, grow=True), "grow"),
  "adaptive bits 0-d bool": (
    lambda: compression.adaptive_quantization(np.array(True), 1.0),
    "bits",
  ),
}


@pytest.mark.parametrize("name", sorted(BOOLS))
def test_bools_are_still_refused(name):
  make, match = BOOLS[name]
  _one_line(make, match)


def test_clients_per_round_bool_and_range_refused(portfolio_data):
  for bad in (True, np.int64(0), np.int64(4), 2.0, np.array([2])):
    _one_line(
      lambda bad=bad: fedco.Simulator(
        portfolio(1.0), fedco.feddro(), portfolio_data, clients_per_round=bad
      ),
      "clients_per_round",
    )


# ---- 2. Non-finite numbers are refused up front ------------------------------------------

NON_FINITE = {
  "kl log gamma inf": (lambda: client_kl_dro_log(LOSS, INF, 4), "gamma"),
  "kl log gamma nan": (lambda: client_kl_dro_log(LOSS, NAN, 4), "gamma"),
  "kl gamma inf": (lambda: client_kl_dro(LOSS, INF), "gamma"),
  "kl gamma float32 inf": (lambda: client_kl_dro(LOSS, np.float32(INF)), "gamma"),
  "sample kl lam inf": (lambda: sample_kl_dro(LOSS, INF), "lam"),
  "sample kl shift inf": (lambda: sample_kl_dro(LOSS, 1.0, shift=INF), "shift"),
  "sample kl shift nan": (lambda: sample_kl_dro(LOSS, 1.0, shift=NAN), "shift"),
  "chi2 lam nan": (lambda: sample_chi2_dro(LOSS, NAN), "lam"),
  "adaptive grow inf": (lambda: compression.adaptive_quantization(4, 1.0, grow=INF), "grow"),
  "adaptive grow nan": (lambda: compression.adaptive_quantization(4, 1.0, grow=NAN), "grow"),
  "adaptive shrink nan": (lambda: compression.adaptive_quantization(4, 1.0, shrink=NAN), "shrink"),
  "imbalance keep nan": (lambda: fedco.data.step_imbalance(np.arange(4), 4, NAN), "keep_fraction"),
  "personalized shift inf": (
    lambda: fedco.problems.personalized_maml(
      lambda p, x: x, 0.1, models.cross_entropy, gamma=1.0, shift=INF
    ),
    "shift",
  ),
}


@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_non_finite_numbers_are_a_one_line_error(name):
  make, match = NON_FINITE[name]
  message = _one_line(make, match)
  assert "finite" in message


def test_straggler_prob_nan_is_refused(portfolio_data):
  _one_line(
    lambda: fedco.Simulator(portfolio(1.0), fedco.feddro(), portfolio_data, straggler_prob=NAN),
    "straggler_prob",
  )


# ---- 3. Labels out of the model's classes, without num_classes -------------------------


@pytest.fixture(scope="module")
def classification():
  """Three clients with labels 0..9 (no num_classes given) and a 3-class model."""
  rng = np.random.default_rng(0)
  clients = [
    {"x": rng.normal(size=(6, 4)).astype(np.float32), "y": np.array([0, 1, 2, 9, 1, 0], np.int32)}
    for _ in range(3)
  ]
  data = fedco.FederatedData.from_clients(clients)
  model = models.LogisticRegression(3)
  params = models.init_params(model, clients[0]["x"][0])
  return data, model, params


def test_labels_past_the_logits_are_refused_before_the_run(classification):
  data, model, params = classification
  loss = lambda p, e: models.cross_entropy(model.apply(p, e["x"]), e["y"])
  message = _one_line(
    lambda: fedco.simulate(
      fedco.plain(loss), fedco.fedavg(0.1), data, params, rounds=1, batch_size=2
    ),
    r"\[0, 3\)",
  )
  assert "['y']" in message and "9" in message


def test_labels_past_the_logits_are_refused_in_per_client_metrics(classification):
  data, model, params = classification
  acc = lambda p, e: models.accuracy(model.apply(p, e["x"]), e["y"])
  message = _one_line(lambda: fedco.metrics.per_client_mean(acc, params, data), r"\[0, 3\)")
  assert "['y']" in message and "9" in message


def test_labels_within_the_logits_pass(classification):
  data, model, params = classification
  fixed = data.replace(examples={**data.examples, "y": data.examples["y"] % 3})
  acc = lambda p, e: models.accuracy(model.apply(p, e["x"]), e["y"])
  per_client = fedco.metrics.per_client_mean(acc, params, fixed)
  assert per_client.shape == (3,) and np.all(np.isfinite(per_client))


# ---- 4. and 5. params that do not fit ----------------------------------------------------


def test_integer_params_are_refused(portfolio_data):
  for make in (
    lambda: fedco.simulate(
      portfolio(1.0), fedco.feddro(), portfolio_data, jnp.zeros(3, jnp.int32), rounds=1
    ),
    lambda: fedco.Simulator(portfolio(1.0), fedco.feddro(), portfolio_data).init(
      np.zeros(3, np.int64)
    ),
    lambda: fedco.Simulator(portfolio(1.0), fedco.feddro(), portfolio_data).init(
      jnp.zeros(3, bool)
    ),
  ):
    message = _one_line(make, "params")
    assert "float32" in message


def test_flax_params_of_the_wrong_shape_are_a_one_line_error(classification):
  data, model, _ = classification
  wrong = models.init_params(models.LogisticRegression(4), np.zeros(4, np.float32))
  loss = lambda p, e: models.cross_entropy(model.apply(p, e["x"]), e["y"] % 3)
  message = _one_line(
    lambda: fedco.Simulator(fedco.plain(loss), fedco.fedavg(0.1), data).init(wrong), "params"
  )
  assert "(4, 4)" in message and "(3, 4)" in message and "kernel" in message


# ---- 6. cross_entropy and accuracy agree on bad labels -----------------------------------

LOGITS = jnp.array([1.0, 2.0, 3.0])


@pytest.mark.parametrize("label", [-1, 3, np.int32(-1), np.array(7), jnp.array(-2)])
def test_concrete_labels_outside_the_classes_are_refused(label):
  for fn in (models.cross_entropy, models.accuracy):
    _one_line(lambda fn=fn: fn(LOGITS, label), r"label.*\[0, 3\)")


def test_traced_labels_outside_the_classes_give_nan():
  for fn in (models.cross_entropy, models.accuracy):
    out = jax.jit(jax.vmap(fn, in_axes=(None, 0)))(LOGITS, jnp.array([-1, 3, 0, 2]))
    assert np.all(np.isnan(out[:2])) and np.all(np.isfinite(out[2:])), (fn, out)


def test_valid_labels_keep_their_values_and_gradients():
  for label in range(3):
    want = jax.nn.logsumexp(LOGITS) - LOGITS[label]
    np.testing.assert_allclose(models.cross_entropy(LOGITS, label), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(models.cross_entropy)(LOGITS, label), want, rtol=1e-6)
    grad = jax.grad(models.cross_entropy)(LOGITS, jnp.array(label))
    np.testing.assert_allclose(
      grad, jax.nn.softmax(LOGITS) - jax.nn.one_hot(label, 3), rtol=1e-5, atol=1e-6
    )
    assert float(models.accuracy(LOGITS, label)) == float(label == 2)


# ---- 7. sweep's grid and seeds ----------------------------------------------------------


def _sweep(data, **kwargs):
  return fedco.sweep(portfolio(1.0), fedco.feddro, data, jnp.zeros(3), rounds=1, **kwargs)


@pytest.mark.parametrize(
  "values", [[0.1, None], [0.1, "0.2"], [0.1, INF], [np.nan], [0.1, True], [0.1, lambda step: 0.1]]
)
def test_sweep_grid_values_must_be_finite_numbers(portfolio_data, values):
  message = _one_line(
    lambda: _sweep(portfolio_data, grid={"learning_rate": values}), r"grid\['learning_rate'\]"
  )
  assert "finite" in message


def test_sweep_seeds_must_be_a_list(portfolio_data):
  message = _one_line(lambda: _sweep(portfolio_data, seeds=3), "seeds")
  assert "seeds=range(3)" in message and "seeds=[3]" in message
  _one_line(lambda: _sweep(portfolio_data, seeds="01"), "seeds")
  _one_line(lambda: _sweep(portfolio_data, seeds=[0, -1]), "seeds")
  _one_line(lambda: _sweep(portfolio_data, seeds=[0, 1.5]), "seeds")


# ---- 8. load_npz on a zip of other files --------------------------------------------------


def test_load_npz_names_a_member_that_is_not_an_array(tmp_path):
  path = tmp_path / "raw.npz"
  with zipfile.ZipFile(path, "w") as archive:
    for key in ("x_train", "y_train", "x_test", "y_test"):
      archive.writestr(key, b"not an array")
  message = _one_line(lambda: fedco.data.load_npz(path), "x_train")
  assert str(path) in message and ".npy" in message
