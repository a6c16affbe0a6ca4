"""FedAdam, FedYogi and FedAdagrad against a float64 NumPy transcription of Reddi et al. 2021,
Algorithm 2 (partial participation), and their server transforms on other algorithms.

Problem: least squares per client, ``h_i(x) = mean_e 0.5 (a_e . x - b_e)^2``, clients of
different sizes with far-apart optima.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.algorithms import adaptive
from fedco.problems import portfolio
from tests import helpers

D = helpers.LSQ_DIM
PROBLEM = helpers.LEAST_SQUARES
grad = helpers.least_squares_grad


def make_clients(sizes=(4, 7, 10, 5, 13, 6), seed=0):
  return helpers.least_squares_clients(sizes, seed=seed)


def algorithm2(clients, x0, rule, lr, local_steps, sampled, *, server_lr, b1, b2, tau, v_init=None):
  """Algorithm 2 in float64: clients run ``local_steps`` SGD steps from ``x``; the server
  takes the adaptive step on ``Delta = mean_S (y_i - x)``. Returns ``(x, m, v, signs)``
  (``signs``: Yogi's ``sign(v - Delta^2)`` entries seen)."""
  x = np.array(x0, np.float64)
  m = np.zeros(D)
  v = np.full(D, tau**2 if v_init is None else v_init)
  signs = set()
  for ids in sampled:
    deltas = []
    for i in ids:
      y = x.copy()
      for _ in range(local_steps):
        y = y - lr * grad(clients[i], y)
      deltas.append(y - x)
    delta = np.mean(deltas, axis=0)
    m = b1 * m + (1 - b1) * delta
    if rule == "adagrad":
      v = v + delta**2
    elif rule == "yogi":
      signs |= set(np.sign(v - delta**2).tolist())
      v = v - (1 - b2) * delta**2 * np.sign(v - delta**2)
    else:
      v = b2 * v + (1 - b2) * delta**2
    x = x + server_lr * m / (np.sqrt(v) + tau)
  return x, m, v, signs


CASES = {
  "fedadam": ("adam", dict(server_lr=0.1, b1=0.9, b2=0.99, adaptivity=0.05)),
  "fedyogi": ("yogi", dict(server_lr=0.1, b1=0.9, b2=0.99, adaptivity=0.05)),
  "fedadagrad": ("adagrad", dict(server_lr=0.1, b1=0.0, adaptivity=0.05)),
  "fedadagrad_momentum": ("adagrad", dict(server_lr=0.1, b1=0.5, adaptivity=0.05)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_equals_the_float64_transcription_of_algorithm2(case):
  rule, kw = CASES[case]
  factory = fedco.ALGORITHMS[case.replace("_momentum", "")]
  clients = make_clients()
  lr, steps, rounds = 0.05, 3, 10
  with jax.enable_x64(True):
    data = fedco.FederatedData.from_clients(clients)
    result = fedco.simulate(
      PROBLEM,
      factory(lr, steps, **kw),
      data,
      jnp.zeros(D, jnp.float64),
      rounds=rounds,
      batch_size=None,
      clients_per_round=3,
      seed=3,
    )
    assert np.asarray(result.params).dtype == np.float64
  sampled = np.asarray(result.metrics["clients"])
  assert sampled.shape == (rounds, 3) and len({tuple(s) for s in sampled}) > 1
  args = dict(server_lr=kw["server_lr"], b1=kw["b1"], b2=kw.get("b2", 0.0), tau=kw["adaptivity"])
  x, m, v, signs = algorithm2(clients, np.zeros(D), rule, lr, steps, sampled, **args)
  assert np.max(np.abs(x)) > 0.1  # the run moved
  np.testing.assert_allclose(np.asarray(result.params), x, rtol=1e-10, atol=1e-12)
  server = result.state.server_opt_state
  np.testing.assert_allclose(np.asarray(server.m), m, rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(np.asarray(server.v), v, rtol=1e-10, atol=1e-12)
  # what the comparison can tell apart: v_{-1} = tau^2 rather than 0, and Yogi's two signs
  x_zero_init, _, _, _ = algorithm2(
    clients, np.zeros(D), rule, lr, steps, sampled, v_init=0.0, **args
  )
  assert np.max(np.abs(x_zero_init - x)) > 1e-6
  if rule == "yogi":
    assert {-1.0, 1.0} <= signs, signs


def test_the_server_adapts_params_and_averages_other_fields():
  """One server step on a pseudo-gradient dict: ``params`` take Adam's step on
  ``Delta = -pseudo_grad``, another field becomes the plain client mean."""
  tx = adaptive.fedadam_server(0.1, b1=0.9, b2=0.99, adaptivity=0.05)
  server = {"params": jnp.array([1.0, -2.0, 0.5]), "y": jnp.array([3.0, 4.0])}
  pseudo_grad = {"params": jnp.array([0.2, -0.4, 0.0]), "y": jnp.array([1.0, -1.0])}
  state = tx.init(server)
  np.testing.assert_allclose(state.v, np.full(3, 0.05**2), rtol=1e-6)
  updates, state = tx.update(pseudo_grad, state, server)
  new = optax.apply_updates(server, updates)
  delta = -np.asarray(pseudo_grad["params"], np.float64)
  m, v = 0.1 * delta, 0.99 * 0.05**2 + 0.01 * delta**2
  np.testing.assert_allclose(
    new["params"], np.asarray(server["params"]) + 0.1 * m / (np.sqrt(v) + 0.05), rtol=1e-6
  )
  np.testing.assert_allclose(new["y"], np.asarray(server["y"]) - np.asarray(pseudo_grad["y"]))
  with pytest.raises(ValueError, match="takes fedco's server values"):
    tx.init(jnp.zeros(3))


def _portfolio_data():
  return fedco.FederatedData.from_clients(
    [{"r": r} for r in helpers.portfolio_clients(sizes=(12, 8, 20))]
  )


@pytest.mark.parametrize("server", ["fedadam", "fedyogi", "fedadagrad"])
def test_the_server_transforms_compose_with_another_algorithm(server):
  """FedDRO (every-step ``y``) and FedAvg-CO Case II (an every-round ``y`` the server
  averages) with an adaptive server run in simulate; ``with_server`` equals
  ``replace(server=...)``; the server's moments live in the run's state."""
  tx = getattr(adaptive, f"{server}_server")(0.05)
  data = _portfolio_data()
  problem = portfolio(1.0)
  kw = dict(rounds=6, batch_size=None, clients_per_round=2, seed=0)
  for base in (fedco.feddro(0.1, 3, beta=0.5), fedco.fedavg_co(0.1, 3, case="II")):
    helper = fedco.simulate(problem, adaptive.with_server(base, tx), data, jnp.zeros(3), **kw)
    replaced = fedco.simulate(problem, base.replace(server=tx), data, jnp.zeros(3), **kw)
    plain = fedco.simulate(problem, base, data, jnp.zeros(3), **kw)
    chex.assert_trees_all_equal(helper.params, replaced.params)
    assert np.all(np.isfinite(np.asarray(helper.metrics["objective"])))
    assert isinstance(helper.state.server_opt_state, adaptive.AdaptiveServerState)
    assert float(np.max(np.abs(np.asarray(helper.params) - np.asarray(plain.params)))) > 1e-3
    assert set(helper.state.server) == set(plain.state.server)
    # the adaptive server improves on the start
    assert helper.metrics["objective"][-1] < helper.metrics["objective"][0]


def test_with_server_refuses_a_server_aggregator_algorithm():
  for algorithm in (
    fedco.scaffold(0.1, 3),
    fedco.qfedavg(0.1, 3),
    fedco.inject_hyperparams(fedco.fedavg)(0.1, 3),
  ):
    with pytest.raises(ValueError, match="ServerAggregator") as err:
      adaptive.with_server(algorithm, adaptive.fedyogi_server())
    assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match="optax GradientTransformation"):
    adaptive.with_server(fedco.fedavg(0.1, 3), "adam")


@pytest.mark.parametrize(
  "arg,bad", [("server_lr", 0.0), ("b1", 1.0), ("b2", -0.1), ("adaptivity", 0.0), ("b1", True)]
)
def test_server_arguments_are_checked(arg, bad):
  with pytest.raises(ValueError, match=arg):
    adaptive.fedadam_server(**{arg: bad})
  with pytest.raises(ValueError, match=arg):
    fedco.fedyogi(0.1, 3, **{arg: bad})
