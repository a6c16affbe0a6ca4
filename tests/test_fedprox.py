"""FedProx: ``mu = 0`` is FedAvg bit for bit, and ``mu > 0`` equals a float64 NumPy
transcription of Li et al. 2020, Algorithm 2 (local SGD on ``h_k(y) + mu/2 ||y - x||^2``).

Problem: least squares per client, ``h_k(x) = mean_e 0.5 (a_e . x - b_e)^2``, clients of
different sizes with far-apart optima (so the proximal term and the size weights matter).
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from tests import helpers

D = helpers.LSQ_DIM
PROBLEM = helpers.LEAST_SQUARES
grad = helpers.least_squares_grad
SIZES = (4, 7, 10, 5, 13)


def make_clients(sizes=SIZES, seed=0):
  return helpers.least_squares_clients(sizes, seed=seed)


def fedprox_reference(clients, x0, lr, mu, local_steps, sampled, steps_done=None):
  """Algorithm 2 with ``local_steps`` SGD steps as the local solver, float64; the server
  mean of the round's clients weighted by their data sizes."""
  x = np.array(x0, np.float64)
  for r, ids in enumerate(sampled):
    ys, sizes = [], []
    for j, k in enumerate(ids):
      y = x.copy()
      for _ in range(local_steps if steps_done is None else int(steps_done[r][j])):
        y = y - lr * (grad(clients[k], y) + mu * (y - x))
      ys.append(y)
      sizes.append(clients[k]["a"].shape[0])
    w = np.asarray(sizes, np.float64) / np.sum(sizes)
    x = np.tensordot(w, np.stack(ys), axes=1)
  return x


def test_mu_zero_is_fedavg_bit_for_bit():
  """Same defaults (weighting by data size), stochastic batches, partial participation and
  stragglers: every leaf of the final model and every metric is identical."""
  clients = [{k: v.astype(np.float32) for k, v in c.items()} for c in make_clients()]
  data = fedco.FederatedData.from_clients(clients)
  kw = dict(rounds=12, batch_size=3, clients_per_round=3, straggler_prob=0.3, seed=4)
  fedavg = fedco.simulate(PROBLEM, fedco.fedavg(0.05, 4), data, jnp.zeros(D), **kw)
  prox = fedco.simulate(PROBLEM, fedco.fedprox(0.05, 4, mu=0.0), data, jnp.zeros(D), **kw)
  assert fedco.fedprox(0.05, 4).plan.weighting == fedco.fedavg(0.05, 4).plan.weighting
  assert float(np.max(np.abs(np.asarray(fedavg.params)))) > 0.1
  chex.assert_trees_all_equal(prox.params, fedavg.params)
  chex.assert_trees_all_equal(prox.metrics, fedavg.metrics)
  chex.assert_trees_all_equal(prox.state.server, fedavg.state.server)


@pytest.mark.parametrize("stragglers", [False, True])
def test_fedprox_equals_the_float64_transcription(stragglers):
  clients = make_clients()
  lr, mu, steps, rounds = 0.05, 0.5, 5, 8
  faults = dict(straggler_prob=0.5) if stragglers else {}
  with jax.enable_x64(True):
    data = fedco.FederatedData.from_clients(clients)
    result = fedco.simulate(
      PROBLEM,
      fedco.fedprox(lr, steps, mu=mu),
      data,
      jnp.zeros(D, jnp.float64),
      rounds=rounds,
      batch_size=None,
      clients_per_round=3,
      seed=1,
      **faults,
    )
    assert np.asarray(result.params).dtype == np.float64
  sampled = np.asarray(result.metrics["clients"])
  done = np.asarray(result.metrics["local_steps"]) if stragglers else None
  if stragglers:
    assert np.any(done < steps)
  x_ref = fedprox_reference(clients, np.zeros(D), lr, mu, steps, sampled, done)
  assert np.max(np.abs(x_ref)) > 0.5
  np.testing.assert_allclose(np.asarray(result.params), x_ref, rtol=1e-10, atol=1e-12)
  # the proximal term matters here: FedAvg's model is elsewhere
  x_fedavg = fedprox_reference(clients, np.zeros(D), lr, 0.0, steps, sampled, done)
  assert np.max(np.abs(x_fedavg - x_ref)) > 1e-2


def test_mu_is_checked():
  for bad in (-0.1, float("inf"), True, "0.1"):
    with pytest.raises(ValueError, match="mu"):
      fedco.fedprox(0.1, 5, mu=bad)
  assert isinstance(fedco.fedprox(0.1, 5, mu=0), fedco.Algorithm)
