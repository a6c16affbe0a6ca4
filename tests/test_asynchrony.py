"""Simulated time and FedBuff (issue 49, decision 112) against a NumPy event-driven
transcription.

The transcription keeps every server model (no ring), processes one report at a time from
a heap of (arrival, position), applies the buffer when it holds ``m`` reports and then
dispatches the replacements; it takes from the runtime only its random draws (dropout,
replacement scores, the normals of the delays) and recomputes the rest: which clients
report in which order, their staleness and weights, the discarded stale reports, the
clock and the models, in float64.
"""

import heapq

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco

N, D, M, C, STEPS, ROUNDS = 9, 3, 3, 6, 2, 8
LR, SERVER_LR = 0.1, 0.7
DELAYS = fedco.runtime.Delays(
  step_time=1.0, latency=0.5, spread=0.6, jitter=0.4, straggler_fraction=0.3, straggler_slowdown=8.0
)


def clients(seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for k in range(N):
    n = 2 + k % 3
    a = rng.normal(size=(n, D))
    out.append({"a": a, "c": a @ rng.normal(k / N, 1.0, size=D) + rng.normal(size=n) * 0.1})
  return out


def loss(w, e):
  return 0.5 * (e["a"] @ w - e["c"]) ** 2


PROBLEM = fedco.plain(loss)


def algorithm():
  return fedco.algorithms.adaptive.with_server(
    fedco.fedavg(LR, STEPS, weighting="uniform"), optax.sgd(SERVER_LR)
  )


def simulate(buffered, rounds=ROUNDS, **options):
  kwargs = dict(
    batch_size=None,
    evaluate=False,
    clients_per_round=M,
    delays=DELAYS,
    asynchronous=buffered,
    metrics_fn=lambda w: {"w": w},
    **options,
  )
  with jax.enable_x64(True):
    data = fedco.FederatedData.from_clients(clients())
    x0 = jnp.asarray(np.linspace(-1.0, 1.0, D))
    sim = fedco.Simulator(PROBLEM, algorithm(), data, **{k: v for k, v in kwargs.items()})
    first = jax.device_get(sim.init(x0, 3))
    res = fedco.simulate(PROBLEM, algorithm(), data, x0, rounds=rounds, seed=3, **kwargs)
    metrics = {k: np.asarray(v) for k, v in res.metrics.items()}
  return first, metrics


def normals(key, stream, ids, dispatch=None):
  k = jax.random.fold_in(key, stream)
  if dispatch is not None:
    k = jax.random.fold_in(k, dispatch)
  return np.array(
    [float(jax.random.normal(jax.random.fold_in(k, int(i)), (), jnp.float64)) for i in ids]
  )


def durations(key, ids, dispatch):
  """The delay model, transcribed: latency + steps * step_time * speed * e^(jitter z)."""
  with jax.enable_x64(True):
    z_client = normals(key, 1, ids)
    k_slow = jax.random.fold_in(key, 2)
    u = np.array(
      [float(jax.random.uniform(jax.random.fold_in(k_slow, int(i)), (), jnp.float64)) for i in ids]
    )
    z = normals(key, 3, ids, dispatch)
  speed = np.exp(DELAYS.spread * z_client) * np.where(u < DELAYS.straggler_fraction, 8.0, 1.0)
  return DELAYS.latency + STEPS * DELAYS.step_time * speed * np.exp(DELAYS.jitter * z)


def local_sgd(w, c):
  for _ in range(STEPS):
    w = w - LR * c["a"].T @ (c["a"] @ w - c["c"]) / len(c["c"])
  return w


def transcription(first, metrics, buffered):
  """FedBuff one report at a time; returns per server step (ids, staleness, alive, time, w)."""
  data, timing = clients(), first.timing
  key = timing.key
  models = {0: np.linspace(-1.0, 1.0, D)}
  w, version, clock = models[0], 0, 0.0
  flight = {p: (int(i), 0, float(a)) for p, (i, a) in enumerate(zip(timing.ids, timing.arrival))}
  np.testing.assert_allclose(timing.arrival, durations(key, timing.ids, 0), rtol=1e-12)
  heap = [(a, p) for p, (_, _, a) in flight.items()]
  heapq.heapify(heap)
  buffer, steps = [], []
  while len(steps) < ROUNDS:
    arrival, p = heapq.heappop(heap)
    k, v, _ = flight.pop(p)
    tau = version - v
    buffer.append((p, k, tau, local_sgd(models[v], data[k]) - models[v], arrival))
    if len(buffer) < M:
      continue
    # the runtime's dropout draws (its survivors: not dropped and not too stale)
    survived = metrics["survivors"][len(steps)]
    alive = survived & np.array([tau <= buffered.max_staleness for _, _, tau, _, _ in buffer])
    if alive.any():
      change = (
        sum(
          (1 + tau) ** -buffered.staleness_exponent * delta
          for (_, _, tau, delta, _), a in zip(buffer, alive)
          if a
        )
        / alive.sum()
      )
      w = w + SERVER_LR * change
    version += 1
    models[version] = w
    clock = buffer[-1][4]
    with jax.enable_x64(True):
      scores = np.asarray(
        jax.random.uniform(jax.random.fold_in(jax.random.fold_in(key, 4), version), (N,))
      )
    busy = {k for k, _, _ in flight.values()}
    fresh = [int(i) for i in np.argsort(scores, kind="stable") if int(i) not in busy][:M]
    new_arrivals = clock + durations(key, fresh, version)
    for (p, _, _, _, _), k, a in zip(buffer, fresh, new_arrivals):
      flight[p] = (k, version, float(a))
      heapq.heappush(heap, (float(a), p))
    steps.append(([b[1] for b in buffer], [b[2] for b in buffer], alive, clock, w))
    buffer = []
  return steps


@pytest.mark.parametrize(
  "buffered",
  [
    fedco.runtime.Buffered(C, max_staleness=2, staleness_exponent=0.5),
    fedco.runtime.Buffered(C, max_staleness=6, staleness_exponent=0.0),
  ],
  ids=["sqrt_weights_stale_dropped", "unweighted"],
)
def test_fedbuff_matches_event_driven_transcription(buffered):
  first, metrics = simulate(buffered, participation=0.85)
  reference = transcription(first, metrics, buffered)
  for t, (ids, tau, alive, clock, w) in enumerate(reference):
    np.testing.assert_array_equal(metrics["clients"][t], ids, err_msg=f"step {t + 1}")
    np.testing.assert_array_equal(metrics["staleness"][t], tau, err_msg=f"step {t + 1}")
    np.testing.assert_array_equal(metrics["survivors"][t], alive, err_msg=f"step {t + 1}")
    np.testing.assert_allclose(metrics["time"][t], clock, rtol=1e-12, err_msg=f"step {t + 1}")
    np.testing.assert_allclose(metrics["w"][t], w, rtol=1e-11, err_msg=f"step {t + 1}")
  staleness = np.concatenate(metrics["staleness"])
  assert staleness.max() > 0  # reports were stale: the ring and the weights were exercised
  if buffered.max_staleness == 2:
    assert (staleness > 2).any()  # and some were too stale and discarded


def test_synchronous_round_lasts_as_long_as_its_slowest_survivor():
  first, metrics = simulate(None, participation=0.7)
  clock = 0.0
  for t in range(ROUNDS):
    ids, alive = metrics["clients"][t], metrics["survivors"][t]
    took = durations(first.timing.key, ids, t)
    clock += took[alive].max() if alive.any() else 0.0
    np.testing.assert_allclose(metrics["time"][t], clock, rtol=1e-12)
  # the same seed gives the same clients the same speeds asynchronously
  first_async, _ = simulate(fedco.runtime.Buffered(C), rounds=1)
  np.testing.assert_array_equal(first.timing.key, first_async.timing.key)


def test_a_round_under_local_epochs_lasts_its_longest_clients_epoch():
  data = fedco.FederatedData.from_clients(
    [{k: v.astype(np.float32) for k, v in c.items()} for c in clients()]
  )
  flat = fedco.runtime.Delays(step_time=2.0, latency=1.0)  # no spread: time is the steps
  for buffered in (None, fedco.runtime.Buffered(C)):
    res = fedco.simulate(
      PROBLEM, fedco.fedavg(0.1, 4), data, jnp.zeros(D), rounds=4, batch_size=2, local_epochs=1,
      evaluate=False, clients_per_round=M, delays=flat, asynchronous=buffered,
    )  # fmt: skip
    steps = np.asarray(res.metrics["local_steps"])
    counts = np.asarray(data.counts)[np.asarray(res.metrics["clients"])]
    np.testing.assert_array_equal(steps, np.minimum(4, -(-counts // 2)))
    if buffered is None:  # each round: its longest epoch
      np.testing.assert_allclose(
        np.diff(res.metrics["time"], prepend=0.0), 1.0 + 2.0 * steps.max(1)
      )
    else:  # a server step ends at its last report, a dispatch's duration after a step's end
      assert np.all(np.diff(res.metrics["time"]) >= 0)
      assert res.metrics["time"][0] == pytest.approx(1.0 + 2.0 * steps[0].max())


def test_durations_transcribed_and_stragglers_are_their_fraction():
  key = jax.random.PRNGKey(5)
  ids = jnp.arange(6)
  with jax.enable_x64(True):  # the transcription's draws are float64's
    got = DELAYS.durations(key, ids, jnp.full((6,), STEPS), 4)
  np.testing.assert_allclose(got, durations(key, np.arange(6), 4), rtol=1e-12)
  speeds = fedco.runtime.Delays(straggler_fraction=0.25, straggler_slowdown=5.0).speeds(
    key, jnp.arange(4000)
  )
  assert set(np.unique(np.asarray(speeds))) == {1.0, 5.0}
  assert abs(float(jnp.mean(speeds == 5.0)) - 0.25) < 0.03


def test_fedbuff_converges_and_resumes_bit_identically(tmp_path):
  buffered = fedco.runtime.Buffered(C)
  data = fedco.FederatedData.from_clients(
    [{k: v.astype(np.float32) for k, v in c.items()} for c in clients()]
  )
  kwargs = dict(batch_size=None, clients_per_round=M, delays=DELAYS, asynchronous=buffered, seed=1)
  x0 = jnp.zeros(D)
  whole = fedco.simulate(PROBLEM, algorithm(), data, x0, rounds=40, **kwargs)
  objective = np.asarray(whole.metrics["objective"])
  cs = clients()  # the objective (clients weighted alike) at its minimiser, in closed form
  hessian = sum(c["a"].T @ c["a"] / len(c["c"]) for c in cs)
  best = np.linalg.solve(hessian, sum(c["a"].T @ c["c"] / len(c["c"]) for c in cs))
  optimum = np.mean([np.mean(loss(best, c)) for c in cs])
  assert objective[-1] - optimum < 0.25 * (objective[0] - optimum)  # 0.2 when written
  assert np.all(np.diff(np.asarray(whole.metrics["time"])) > 0)
  where = str(tmp_path / "ckpt")
  fedco.simulate(PROBLEM, algorithm(), data, x0, rounds=24, checkpoint_dir=where, **kwargs)
  resumed = fedco.simulate(
    PROBLEM, algorithm(), data, x0, rounds=40, checkpoint_dir=where, **kwargs
  )
  np.testing.assert_array_equal(resumed.params, whole.params)
  np.testing.assert_array_equal(resumed.metrics["time"], whole.metrics["time"])


def test_a_sweep_of_fedbuff_runs_equals_its_runs_one_by_one():
  data = fedco.FederatedData.from_clients(
    [{k: v.astype(np.float32) for k, v in c.items()} for c in clients()]
  )
  kwargs = dict(
    batch_size=None, evaluate=False, clients_per_round=M, delays=DELAYS,
    asynchronous=fedco.runtime.Buffered(C, max_staleness=2),
  )  # fmt: skip
  rates = [0.1, 0.05]
  swept = fedco.sweep(
    PROBLEM, fedco.fedavg, data, jnp.zeros(D), rounds=6, grid={"learning_rate": rates},
    algorithm_kwargs={"local_steps": STEPS}, **kwargs,
  )  # fmt: skip
  for i, rate in enumerate(rates):
    alone = fedco.simulate(
      PROBLEM, fedco.fedavg(rate, STEPS), data, jnp.zeros(D), rounds=6, **kwargs
    )
    np.testing.assert_allclose(np.asarray(swept.params)[i], alone.params, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
  "options, message",
  [
    ({"delays": 3.0}, "delays must be a fedco.runtime.Delays"),
    ({"asynchronous": 6}, "asynchronous must be a fedco.runtime.Buffered"),
    ({"asynchronous": fedco.runtime.Buffered(2)}, "asynchronous.concurrency"),
    ({"asynchronous": fedco.runtime.Buffered(10)}, "asynchronous.concurrency"),
    ({"asynchronous": fedco.runtime.Buffered(6), "sampling": "epochs"}, "sampling='epochs'"),
    ({"asynchronous": fedco.runtime.Buffered(6), "straggler_prob": 0.2}, "straggler_prob"),
  ],
)
def test_refusals_in_one_line(options, message):
  data = fedco.FederatedData.from_clients(clients())
  with pytest.raises(ValueError, match=message) as err:
    fedco.Simulator(PROBLEM, algorithm(), data, clients_per_round=M, batch_size=None, **options)
  assert "\n" not in str(err.value)


def test_refuses_delays_out_of_range_and_algorithms_that_send_state():
  with pytest.raises(ValueError, match="delays.straggler_slowdown"):
    fedco.runtime.Delays(straggler_slowdown=0.5)
  with pytest.raises(ValueError, match="delays.step_time"):
    fedco.runtime.Delays(step_time=0)
  with pytest.raises(ValueError, match="asynchronous.max_staleness"):
    fedco.runtime.Buffered(6, max_staleness=-1)
  with pytest.raises(ValueError, match="asynchronous.staleness_exponent"):
    fedco.runtime.Buffered(6, staleness_exponent=-1)
  with pytest.raises(ValueError, match="asynchronous.concurrency"):
    fedco.runtime.Buffered(0)
  data = fedco.FederatedData.from_clients(clients())
  with pytest.raises(ValueError, match="scaffold, whose clients also send"):
    fedco.Simulator(
      PROBLEM, fedco.scaffold(0.1, 2), data, clients_per_round=M, batch_size=None,
      asynchronous=fedco.runtime.Buffered(C),
    )  # fmt: skip


def test_refuses_streamed_clients(tmp_path):
  data = fedco.FederatedData.from_clients(
    [{k: v.astype(np.float32) for k, v in c.items()} for c in clients()]
  )
  store = fedco.data.write_store(str(tmp_path / "store"), data)
  with pytest.raises(ValueError, match="asynchronous="):
    fedco.simulate(
      PROBLEM, algorithm(), store, jnp.zeros(D), rounds=2, clients_per_round=M,
      batch_size=None, evaluate=False, asynchronous=fedco.runtime.Buffered(C),
    )  # fmt: skip
