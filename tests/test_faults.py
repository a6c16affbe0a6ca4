"""Client dropout and stragglers: averages run over the survivors, with the work they did."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.problems import portfolio
from tests import helpers

TARGETS = [
  np.array([1.0, -2.0]),
  np.array([3.0, 0.5]),
  np.array([-1.0, 1.0]),
  np.array([0.0, 4.0]),
  np.array([2.0, 2.0]),
]
LR = 0.3


def _quadratic_data():
  clients = [{"t": np.stack([t, t + 0.5]).astype(np.float32)} for t in TARGETS]
  return fedco.FederatedData.from_clients(clients)


QUADRATIC = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))


def _local_gd(x, k, steps):
  target = np.mean([TARGETS[k], TARGETS[k] + 0.5], axis=0)
  for _ in range(steps):
    x = x - LR * (x - target)
  return x


def test_averaging_with_dropouts_equals_averaging_over_the_survivors():
  res = fedco.simulate(
    QUADRATIC,
    fedco.fedavg(LR, 2, weighting="uniform"),
    _quadratic_data(),
    jnp.zeros(2),
    rounds=8,
    batch_size=None,
    participation=0.5,
    seed=1,
    evaluate=False,
    metrics_fn=lambda p: {"x": p},
  )
  survivors = res.metrics["survivors"]
  assert survivors.shape == (8, 5) and 0 < survivors.sum() < 40  # some drop, some stay
  x = np.zeros(2)
  for r in range(8):
    alive = np.flatnonzero(survivors[r])
    if alive.size:
      x = np.mean([_local_gd(x, k, 2) for k in alive], axis=0)
    np.testing.assert_allclose(res.metrics["x"][r], x, rtol=1e-5, atol=1e-6)


def test_stragglers_count_with_the_steps_they_did():
  res = fedco.simulate(
    QUADRATIC,
    fedco.fedavg(LR, 4, weighting="uniform"),
    _quadratic_data(),
    jnp.zeros(2),
    rounds=5,
    batch_size=None,
    straggler_prob=0.6,
    seed=2,
    evaluate=False,
    metrics_fn=lambda p: {"x": p},
  )
  steps = res.metrics["local_steps"]
  assert np.all((steps >= 1) & (steps <= 4)) and np.any(steps < 4) and np.any(steps == 4)
  x = np.zeros(2)
  for r in range(5):
    x = np.mean([_local_gd(x, k, int(steps[r, k])) for k in range(5)], axis=0)
    np.testing.assert_allclose(res.metrics["x"][r], x, rtol=1e-5, atol=1e-6)


def test_feddro_step_averages_use_only_the_survivors():
  """One FedDRO round with dropouts equals the same round run on the survivors' data alone."""
  clients = [{"r": c} for c in helpers.portfolio_clients(sizes=(6, 9, 7, 8), seed=4)]
  full = fedco.FederatedData.from_clients(clients)
  alg, problem = fedco.feddro(0.1, 3, beta=0.5), portfolio(1.0)
  sim = fedco.Simulator(problem, alg, full, batch_size=None, participation=0.5)
  start = sim.init(jnp.full((3,), 0.1), 3)
  state, metrics = sim.run(start, 1)
  alive = np.flatnonzero(np.asarray(metrics["survivors"][0]))
  assert 0 < alive.size < 4
  sub = fedco.Simulator(
    problem, alg, fedco.FederatedData.from_clients([clients[k] for k in alive]), batch_size=None
  )
  sub_start = sub.init(jnp.full((3,), 0.1), 3)._replace(shared=start.shared)
  sub_state, _ = sub.run(sub_start, 1)
  np.testing.assert_allclose(
    np.asarray(state.server["params"]), np.asarray(sub_state.server["params"]), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    np.asarray(state.shared["y"]), np.asarray(sub_state.shared["y"]), rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize(
  "alg", [fedco.fedavg(LR, 2), fedco.qfedavg(LR, 2, q=0.5), fedco.drfa(LR, 2), fedco.afl(LR)]
)
def test_a_round_nobody_survives_leaves_the_server_unchanged(alg):
  res = fedco.simulate(
    QUADRATIC, alg, _quadratic_data(), jnp.ones(2), rounds=2, batch_size=None, participation=1e-9
  )
  assert not res.metrics["survivors"].any()
  np.testing.assert_array_equal(np.asarray(res.params), np.ones(2))


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(participation=0.0), "participation"),
    (dict(participation=1.5), "participation"),
    (dict(straggler_prob=1.0), "straggler_prob"),
    (dict(straggler_prob=-0.1), "straggler_prob"),
  ],
)
def test_fault_arguments_are_checked(kwargs, match):
  with pytest.raises(ValueError, match=match):
    fedco.Simulator(QUADRATIC, fedco.fedavg(), _quadratic_data(), **kwargs)


def test_ledger_counts_only_what_surviving_clients_sent():
  """Dropped clients send nothing up; every sampled client receives the broadcast."""
  clients = [{"r": c} for c in helpers.portfolio_clients(sizes=(6, 9, 7, 8), seed=4)]
  data = fedco.FederatedData.from_clients(clients)
  res = fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.1, 3, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=6,
    batch_size=None,
    participation=0.5,
    straggler_prob=0.5,
    seed=5,
    evaluate=False,
  )
  alive = np.asarray(res.metrics["survivors"])
  steps = np.asarray(res.metrics["local_steps"])
  assert 0 < alive.sum() < alive.size and np.any(steps[alive] < 3)
  d, p = 3, 2
  up = int(alive.sum()) * d + int(steps[alive].sum()) * p  # y after every step it did
  down = alive.size * (d + 3 * p)  # the broadcasts
  assert res.ledger["total_up"] == up
  assert res.ledger["total_down"] == down
  assert res.ledger["up_per_client_per_round"] == {"params": d, "y": 3 * p}
