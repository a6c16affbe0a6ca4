"""The simulator: vmapped clients equal a per-client Python loop; determinism; ledger."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.problems import portfolio
from fedco.runtime import draw_batch, oracle_args
from tests import helpers


def _loop_reference(problem, alg, data, params, rounds, seed, batch_size):
  """The same simulation as fedco.simulate, written as Python loops over clients and steps.

  It shares only the batch-drawing function and the key schedule with the runtime.
  """
  n, plan = data.num_clients, alg.plan
  key = jax.random.PRNGKey(seed)
  key, k_init = jax.random.split(key)
  states = []
  for k in range(n):
    batch, w = draw_batch(jax.random.fold_in(k_init, k), data, k, batch_size)
    states.append(alg.init(params, inner_value=problem.inner_value(params, batch, w)))
  for f in plan.init_fields:
    mean = jax.tree.map(lambda *v: sum(v) / n, *[getattr(s, f) for s in states])
    states = [s._replace(**{f: mean}) for s in states]
  server = params
  update = alg.update
  for _ in range(rounds):
    key, _, k_round, _, _ = jax.random.split(key, 5)
    xs = [server] * n
    for t in range(plan.local_steps):
      for k in range(n):
        skey = jax.random.fold_in(jax.random.fold_in(k_round, k), t)
        kg, kf, kn = jax.random.split(skey, 3)
        draws = [draw_batch(kk, data, k, batch_size) for kk in (kg, kf, kn)]
        _, kwargs = oracle_args(
          problem, draws[0][0], draws[1][0], draws[2][0], (draws[0][1], draws[1][1], draws[2][1])
        )
        upd, states[k] = update(None, states[k], xs[k], round_key=k_round, **kwargs)
        xs[k] = optax.apply_updates(xs[k], upd)
      for f in plan.every_step:
        mean = jax.tree.map(lambda *v: sum(v) / n, *[getattr(s, f) for s in states])
        states = [s._replace(**{f: mean}) for s in states]
    server = sum(xs) / n
    for f in plan.every_round:
      mean = jax.tree.map(lambda *v: sum(v) / n, *[getattr(s, f) for s in states])
      states = [s._replace(**{f: mean}) for s in states]
  return server


@pytest.mark.parametrize(
  "alg_fn,kind",
  [
    (lambda: fedco.local_scgdm(1.0, 3, beta=0.1, alpha=0.8, gamma=0.7), "local"),
    (lambda: fedco.feddro(0.1, 3, beta=0.5), "global"),
  ],
)
def test_vmapped_runtime_equals_per_client_loop(alg_fn, kind):
  clients = helpers.portfolio_clients()
  data = fedco.FederatedData.from_clients([{"r": c} for c in clients])
  problem = portfolio(1.0, kind=kind)
  alg = alg_fn()
  params = jnp.full((3,), 0.05)
  result = fedco.simulate(problem, alg, data, params, rounds=3, seed=7, batch_size=4)
  expected = _loop_reference(problem, alg, data, params, 3, 7, 4)
  np.testing.assert_allclose(np.asarray(result.params), np.asarray(expected), rtol=2e-5, atol=1e-6)
  assert float(jnp.linalg.norm(result.params - params)) > 1e-2


def test_same_seed_same_result_and_seeds_matter():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  problem = portfolio(1.0, kind="local")
  run = lambda seed: fedco.simulate(
    problem,
    fedco.comfedl(0.1, 2),
    data,
    jnp.zeros(3),
    rounds=4,
    seed=seed,
    batch_size=4,
    clients_per_round=2,
  )
  a, b, c = run(1), run(1), run(2)
  np.testing.assert_array_equal(np.asarray(a.params), np.asarray(b.params))
  np.testing.assert_array_equal(a.metrics["objective"], b.metrics["objective"])
  assert not np.array_equal(np.asarray(a.params), np.asarray(c.params))


def test_chunking_does_not_change_the_result():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  problem = portfolio(1.0)
  run = lambda chunk: fedco.simulate(
    problem,
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=6,
    batch_size=4,
    chunk_rounds=chunk,
  )
  whole, pieces = run(6), run(4)
  np.testing.assert_allclose(np.asarray(whole.params), np.asarray(pieces.params), rtol=1e-6)
  np.testing.assert_allclose(whole.metrics["objective"], pieces.metrics["objective"], rtol=1e-6)


def test_ledger_counts_what_each_algorithm_sends():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  d, p, steps = 3, 2, 4
  cases = {
    "feddro": (fedco.feddro(0.1, steps, beta=0.5), {"params": d, "y": p * steps}),
    "ds_feddro": (fedco.ds_feddro(0.1, steps, beta=0.5), {"params": d, "y": p}),
    "fedavg_co_case1": (fedco.fedavg_co(0.1, steps, case="I"), {"params": d}),
  }
  for name, (alg, expected) in cases.items():
    res = fedco.simulate(portfolio(1.0), alg, data, jnp.zeros(d), rounds=2, batch_size=4)
    assert res.ledger["up_per_client_per_round"] == expected, name
    assert res.ledger["total_up"] == 2 * 3 * sum(expected.values()), name
  local = fedco.simulate(
    portfolio(1.0, kind="local"),
    fedco.local_scgdm(1.0, 3, beta=0.1, alpha=0.5, gamma=0.5),
    data,
    jnp.zeros(d),
    rounds=1,
    batch_size=4,
    clients_per_round=2,
  )
  assert local.ledger["up_per_client_per_round"] == {"params": d, "u": p, "m": d}
  assert local.ledger["clients_per_round"] == 2


def test_sample_weighted_fedavg_averages_by_client_size():
  """One round of one full-batch step: server = sum_k n_k x_k / sum_k n_k."""
  sizes = (2, 6)
  rng = np.random.default_rng(0)
  clients = [{"t": rng.normal(size=(n, 2)).astype(np.float32)} for n in sizes]
  data = fedco.FederatedData.from_clients(clients)
  problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))
  res = fedco.simulate(
    problem,
    fedco.fedavg(0.5, 1, weighting="samples"),
    data,
    jnp.zeros(2),
    rounds=1,
    batch_size=None,
  )
  local = [0.5 * c["t"].mean(0) for c in clients]  # x - 0.5 (x - mean t) from x = 0
  expected = (sizes[0] * local[0] + sizes[1] * local[1]) / sum(sizes)
  np.testing.assert_allclose(np.asarray(res.params), expected, rtol=1e-6)


def test_random_iterate_is_one_of_the_round_averages():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  sim = fedco.Simulator(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    batch_size=4,
    metrics_fn=lambda p: {"x": p},
  )
  state, metrics = sim.run(sim.init(jnp.zeros(3), 0), 8)
  xs = np.asarray(metrics["x"])
  assert np.any(np.all(np.isclose(xs, np.asarray(state.random_params)), axis=1))


def test_clients_of_very_different_sizes_share_one_array():
  big, small = 5000, 20
  rng = np.random.default_rng(0)
  clients = [
    {"r": rng.normal(size=(big if k == 0 else small, 3)).astype(np.float32)} for k in range(10)
  ]
  data = fedco.FederatedData.from_clients(clients)
  assert data.examples["r"].shape == (big + 9 * small, 3)
  # each client is a slice of one row list: no clients x largest-client table
  assert data.offsets.shape == data.counts.shape == (10,) and data.max_count == big
  assert int(data.counts.sum()) == data.flat_rows.shape[0] == big + 9 * small
  res = fedco.simulate(
    portfolio(1.0, kind="local"),
    fedco.comfedl(0.05, 2),
    data,
    jnp.zeros(3),
    rounds=2,
    batch_size=8,
    clients_per_round=4,
  )
  assert res.metrics["client_losses"].shape == (2, 10)
  for k in (0, 3):
    np.testing.assert_array_equal(data.client(k)["r"], clients[k]["r"])


def test_non_finite_objective_names_the_round():
  data = fedco.FederatedData.from_clients([{"v": np.array([[1.0]], np.float32)}])
  # minimising -exp(x) runs x to +inf: x = 1, 28.2, 1.7e13, so exp overflows in round 2
  problem = fedco.local_inner(lambda x, e: x * e["v"][0], lambda y: -jnp.exp(y))
  with pytest.raises(FloatingPointError, match=r"round 2: objective is -inf"):
    fedco.simulate(problem, fedco.comfedl(10.0, 1), data, jnp.ones(()), rounds=20, batch_size=None)


@pytest.mark.parametrize(
  "make,match",
  [
    (lambda d: fedco.Simulator(portfolio(1.0), fedco.comfedl(), d), "local-inner"),
    (lambda d: fedco.Simulator(portfolio(1.0, kind="local"), fedco.feddro(), d), "global-inner"),
    (lambda d: fedco.Simulator(portfolio(1.0), fedco.fedavg(), d), "extra"),
    (
      lambda d: fedco.Simulator(portfolio(1.0), fedco.feddro(), d, clients_per_round=4),
      "clients_per_round",
    ),
    (lambda d: fedco.Simulator(portfolio(1.0), fedco.feddro(), d, batch_size=0), "batch_size"),
    (lambda d: fedco.simulate(portfolio(1.0), fedco.feddro(), d, jnp.zeros(3), rounds=0), "rounds"),
  ],
)
def test_simulator_rejects_bad_input(make, match):
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  with pytest.raises(ValueError, match=match):
    make(data)


@pytest.mark.parametrize(
  "make,match",
  [
    (lambda: fedco.FederatedData.from_clients([]), "at least one"),
    (
      lambda: fedco.FederatedData.from_index_lists({"x": np.zeros((4, 2))}, [[0, 1], []]),
      "no examples",
    ),
    (lambda: fedco.FederatedData.from_index_lists({"x": np.zeros((4, 2))}, [[0, 9]]), "outside"),
    (
      lambda: fedco.FederatedData.from_index_lists(
        {"x": np.zeros((4, 2)), "y": np.zeros(3)}, [[0]]
      ),
      "leading",
    ),
  ],
)
def test_data_rejects_bad_input(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_eval_every_skips_rounds_but_keeps_the_trajectory():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  run = lambda every: fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=7,
    batch_size=4,
    eval_every=every,
  )
  dense, sparse = run(1), run(3)
  np.testing.assert_array_equal(
    sparse.metrics["evaluated"], [True, False, True, False, False, True, True]
  )  # and last
  mask = sparse.metrics["evaluated"]
  np.testing.assert_allclose(
    sparse.metrics["objective"][mask], dense.metrics["objective"][mask], rtol=1e-6
  )
  assert np.all(np.isnan(sparse.metrics["objective"][~mask]))
  np.testing.assert_allclose(np.asarray(sparse.params), np.asarray(dense.params), rtol=1e-6)


def test_non_finite_per_client_metric_names_the_client():
  """A per-client metric that is infinite for client 1 only (the model stays finite)."""
  data = fedco.FederatedData.from_clients([{"t": np.ones((2, 1), np.float32)}] * 2)
  problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2))
  per_client = lambda p: {"loss_by_client": jnp.stack([p[0], 1.0 / (p[0] - p[0])])}
  with pytest.raises(
    FloatingPointError,
    match=r"round 1: loss_by_client is not finite for "
    r"client\(s\) \[1\]",
  ):
    fedco.simulate(
      problem,
      fedco.fedavg(0.1, 1),
      data,
      jnp.zeros(1),
      rounds=2,
      batch_size=None,
      evaluate=False,
      metrics_fn=per_client,
    )


def test_dropped_simulators_are_collected():
  """Nothing global (a jit cache keyed on the simulator) keeps a dropped Simulator and its
  data alive."""
  import gc
  import weakref

  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  refs = []
  for i in range(20):
    sim = fedco.Simulator(portfolio(1.0), fedco.feddro(0.1, 2, beta=0.5), data, batch_size=4)
    state = sim.init(jnp.zeros(3), seed=i)
    if i < 3:  # the rounds program too (each simulator compiles its own)
      sim.run(state, 1)
    refs.append(weakref.ref(sim))
    del sim, state
  gc.collect()
  assert sum(r() is not None for r in refs) == 0


def test_skewed_clients_cost_memory_in_total_examples_not_clients_times_largest():
  # one client of 3,000 examples and 2,000 of one: a [K, max_n] table would hold 6e6 entries
  big, small = 3000, 2000
  rows = [np.arange(big)] + [np.array([big + k]) for k in range(small)]
  data = fedco.FederatedData.from_index_lists({"r": np.ones((big + small, 3), np.float32)}, rows)
  structure = sum(np.asarray(a).size for a in jax.tree.leaves(data.replace(examples=None)))
  assert structure <= 4 * (big + small) + 2 * (small + 1)
  # every client is its slice of the sorted row list; draws read only that slice
  for k in (0, 1, small):
    start, count = int(data.offsets[k]), int(data.counts[k])
    np.testing.assert_array_equal(data.flat_rows[start : start + count], rows[k])
    _, w, got = draw_batch(jax.random.PRNGKey(k), data, k, 64, return_rows=True)
    assert set(np.asarray(got).tolist()) <= set(rows[k].tolist())
    np.testing.assert_allclose(np.sum(w), 1.0, rtol=1e-6)


def test_whole_client_batches_pad_with_the_first_row_at_weight_zero():
  data = fedco.FederatedData.from_index_lists(
    {"r": np.arange(10.0)[:, None]}, [[4, 2, 7], [9], [0, 1, 3, 5, 6, 8]]
  )
  for k, expect in ((0, [4, 2, 7, 4, 4, 4]), (1, [9] * 6), (2, [0, 1, 3, 5, 6, 8])):
    batch, w, got = draw_batch(None, data, k, None, return_rows=True)
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(data.index[k], expect)
    n = int(data.counts[k])
    np.testing.assert_allclose(w, [1 / n] * n + [0.0] * (6 - n))
    np.testing.assert_array_equal(batch["r"][:, 0], expect)


def test_metrics_data_is_an_argument_of_the_compiled_rounds():
  """``metrics_fn(params, metrics_data)``: the same metrics as a closure over the data, and
  runs whose metrics data differ (same shapes) trace one program, where closures compile
  their own."""
  rng = np.random.default_rng(0)
  data = fedco.FederatedData.from_clients(
    [
      {"x": rng.normal(size=(8, 3)).astype(np.float32), "y": np.ones(8, np.float32)}
      for _ in range(4)
    ]
  )
  loss = lambda w, e: 0.5 * (e["x"] @ w - e["y"]) ** 2
  held = [
    {"x": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32), "y": jnp.zeros(5)} for _ in range(2)
  ]
  mse = lambda w, d: {"held": jnp.mean((d["x"] @ w - d["y"]) ** 2)}
  run = lambda **kw: fedco.simulate(
    fedco.plain(loss), fedco.fedavg(0.1), data, jnp.zeros(3), rounds=3, batch_size=None, **kw
  ).metrics["held"]
  np.testing.assert_array_equal(
    run(metrics_fn=lambda w: mse(w, held[1])), run(metrics_fn=mse, metrics_data=held[1])
  )
  lowered = []
  for d in held:
    sim = fedco.Simulator(
      fedco.plain(loss), fedco.fedavg(0.1), data, batch_size=None, metrics_fn=mse, metrics_data=d
    )
    state = sim.init(jnp.zeros(3))
    lowered.append(
      sim._run.lower(state, sim.data, sim.metrics_data, np.int32(-1), rounds=2).as_text()
    )
  assert lowered[0] == lowered[1]  # one program (a persistent cache serves the second)


def test_simulator_settings_are_one_options_object_and_a_misspelled_one_is_named():
  x = np.ones((3, 2), np.float32)
  data = fedco.FederatedData.from_clients([{"x": x + k} for k in range(3)])
  problem = fedco.problems.plain(lambda w, e: jnp.sum((w - e["x"]) ** 2))
  options = fedco.runtime.SimOptions(batch_size=None, clients_per_round=2)
  by_object = fedco.Simulator(problem, fedco.fedavg(0.1, 1), data, options)
  by_keyword = fedco.Simulator(
    problem, fedco.fedavg(0.1, 1), data, batch_size=None, clients_per_round=2
  )
  assert by_object.config.options == by_keyword.config.options
  assert by_object.config.batch_size is None and by_object.config.clients_per_round == 2
  with pytest.raises(
    ValueError,
    match=r"^unknown simulator setting batchsize; the settings are clients_per_round, batch_size",
  ):
    fedco.Simulator(problem, fedco.fedavg(0.1, 1), data, batchsize=4)
  with pytest.raises(ValueError, match=r"^options must be a fedco.runtime.SimOptions, got dict"):
    fedco.simulate(
      problem, fedco.fedavg(0.1, 1), data, jnp.zeros(2), rounds=1, options={"batch_size": 4}
    )
