"""q-FedAvg, DRFA and AFL against float64 NumPy transcriptions of SPEC section 3.

Every run is full-batch (``batch_size=None``): a local step is a gradient step on the client's
whole-data loss, and the server's loss queries (DRFA) and round-start losses (q-FedAvg, AFL)
are exact client losses too, so the pseudocode is deterministic apart from what the runtime
draws from JAX keys (the sampled clients, DRFA's snapshot step ``k'`` and its queried
clients). Those few integers are replayed here with ``jax.random`` from the simulator's key
schedule; all the math is NumPy.

Problem: ``l(x; e) = 0.5 (w.a + b - y)^2`` with ``x = {"w": [3], "b": []}`` on four clients of
different sizes (3, 5, 8 and 6 examples) drawn from different linear models, so per-client
losses differ and every weighting choice shows up.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.algorithms.base import project_simplex

D = 3
SIZES = (3, 5, 8, 6)
K = len(SIZES)
ROUNDS = 4
STEPS = 4
RTOL, ATOL = 1e-4, 1e-5


# ---- data and float64 client oracles ----------------------------------------------------


def make_examples(sizes=SIZES, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for k, n in enumerate(sizes):
    a = rng.normal(size=(n, D))
    w_true = rng.normal(size=D) * (1.0 + 0.5 * k)
    y = a @ w_true + 0.5 * k + 0.3 * rng.normal(size=n)
    out.append({"a": a.astype(np.float32), "y": y.astype(np.float32)})
  return out


class Client:
  """Client k's whole-data loss and gradient in float64; ``x`` is ``[w (D), b]``."""

  def __init__(self, ex):
    self.a = np.asarray(ex["a"], np.float64)
    self.y = np.asarray(ex["y"], np.float64)
    self.n = self.a.shape[0]

  def residual(self, x):
    return self.a @ x[:D] + x[D] - self.y

  def loss(self, x):
    return 0.5 * np.mean(self.residual(x) ** 2)

  def grad(self, x):
    r = self.residual(x)
    return np.concatenate([self.a.T @ r / self.n, [np.mean(r)]])


def loss_fn(params, e):
  return 0.5 * (params["w"] @ e["a"] + params["b"] - e["y"]) ** 2


PROBLEM = fedco.plain(loss_fn)


def to_vec(params):
  return np.concatenate(
    [np.asarray(params["w"], np.float64).ravel(), np.asarray(params["b"], np.float64).reshape(1)]
  )


def to_params(x):
  x = np.asarray(x, np.float32)
  return {"w": jnp.asarray(x[:D]), "b": jnp.asarray(x[D])}


def local_sgd(c, x, lr, steps):
  """All iterates ``[x_0, x_1, ..., x_steps]`` of full-batch GD on client ``c``."""
  xs = [x]
  for _ in range(steps):
    xs.append(xs[-1] - lr * c.grad(xs[-1]))
  return xs


# ---- the simplex projection, brute force ------------------------------------------------


def project_simplex_brute(v):
  """argmin_{p in simplex} ||p - v||^2 by enumerating every support set.

  On a support ``S`` the equality-constrained minimiser is ``p_S = v_S - theta`` with
  ``theta = (sum v_S - 1)/|S|``; the projection is the feasible candidate (all entries
  ``>= 0``) closest to ``v``.
  """
  v = np.asarray(v, np.float64)
  n = v.size
  best, best_dist = None, np.inf
  for size in range(1, n + 1):
    for support in itertools.combinations(range(n), size):
      s = list(support)
      theta = (v[s].sum() - 1.0) / size
      p = np.zeros(n)
      p[s] = v[s] - theta
      if np.all(p >= -1e-12):
        dist = np.sum((p - v) ** 2)
        if dist < best_dist:
          best, best_dist = p, dist
  return best


@pytest.mark.parametrize("seed", range(6))
def test_project_simplex_matches_brute_force_and_kkt(seed):
  rng = np.random.default_rng(seed)
  n = 2 + seed % 5
  vectors = [rng.normal(size=n) * scale for scale in (0.1, 1.0, 5.0)]
  vectors += [
    rng.dirichlet(np.ones(n)),  # already in the simplex
    np.full(n, 3.0),  # ties
    np.concatenate([[10.0], -rng.uniform(size=n - 1)]),  # a vertex
    rng.uniform(size=n) / n * 0.5,
  ]  # all below the simplex
  for v in vectors:
    v32 = np.asarray(v, np.float32)
    p = np.asarray(project_simplex(jnp.asarray(v32)), np.float64)
    assert p.shape == (n,)
    assert np.all(p >= 0.0)
    np.testing.assert_allclose(p.sum(), 1.0, atol=1e-6)
    ref = project_simplex_brute(v32)
    np.testing.assert_allclose(p, ref, atol=2e-6)
    # KKT: p_i = max(v_i - theta, 0) for one theta (positive entries share v_i - p_i = theta,
    # and zero entries have v_i <= theta)
    pos = p > 1e-6
    theta = np.mean(v32[pos] - p[pos])
    np.testing.assert_allclose(v32[pos] - p[pos], theta, atol=2e-6)
    assert np.all(v32[~pos] <= theta + 2e-6)
    # no random point of the simplex is closer to v
    others = rng.dirichlet(np.ones(n), size=200)
    assert np.all(np.sum((others - v32) ** 2, 1) >= np.sum((ref - v32) ** 2) - 1e-9)


# ---- key schedule of the simulator (integers only) --------------------------------------


def replay_keys(seed, rounds, n, m, tau):
  """The simulator's per-round draws: sampled ids, DRFA's ``k'`` and its queried clients.

  ``SimState.key`` starts as the first half of ``split(PRNGKey(seed))``; each round splits it
  into ``(key, k_sample, k_round, k_res, k_agg)``; DRFA splits ``k_agg`` into
  ``(k_ids, k_loss)``.
  """
  key, _ = jax.random.split(jax.random.PRNGKey(seed))
  out = []
  for _ in range(rounds):
    key, k_sample, k_round, _, k_agg = jax.random.split(key, 5)
    ids = np.arange(n) if m == n else np.sort(np.asarray(jax.random.permutation(k_sample, n))[:m])
    k_prime = int(jax.random.randint(k_round, (), 1, tau))
    k_ids, _ = jax.random.split(k_agg)
    queried = np.sort(np.asarray(jax.random.permutation(k_ids, n))[:m])
    out.append((ids, k_prime, queried))
  return out


# ---- NumPy references (SPEC 3) ----------------------------------------------------------


def fedavg_reference(C, x0, lr, steps, sampled):
  x = np.array(x0, np.float64)
  xs = []
  for S in sampled:
    x = np.mean([local_sgd(C[k], x, lr, steps)[-1] for k in S], axis=0)
    xs.append(x)
  return xs


def qfedavg_reference(C, x0, lr, steps, q, sampled):
  """q-FFL: dW = (x - x_k)/lr, Delta_k = F_k^q dW, h_k = q F_k^(q-1)|dW|^2 + F_k^q/lr."""
  x = np.array(x0, np.float64)
  xs = []
  for S in sampled:
    delta, h = np.zeros_like(x), 0.0
    for k in S:
      F = C[k].loss(x)
      dw = (x - local_sgd(C[k], x, lr, steps)[-1]) / lr
      delta = delta + F**q * dw
      h += q * F ** (q - 1.0) * np.sum(dw**2) + F**q / lr
    x = x - delta / h
    xs.append(x)
  return xs


def drfa_reference(C, x0, lr, tau, gamma_lambda, schedule, m):
  """DRFA: x -= sum_{i in S} (N/m) lam_i (x - x_i); v_Q = (N/m) F_Q(x'); lam = P(lam + g tau v)."""
  n = len(C)
  x = np.array(x0, np.float64)
  lam = np.array([c.n for c in C], np.float64)
  lam = lam / lam.sum()
  xs, lams = [], []
  for S, k_prime, Q in schedule:
    finals, snaps = [], []
    for i in S:
      it = local_sgd(C[i], x, lr, tau)
      finals.append(it[-1])
      snaps.append(it[k_prime])  # the model after k' local steps
    x_new = x - sum((n / m) * lam[i] * (x - xi) for i, xi in zip(S, finals))
    snapshot = np.mean(snaps, axis=0)
    v = np.zeros(n)
    for i in Q:
      v[i] = (n / m) * C[i].loss(snapshot)
    lam = project_simplex_brute(lam + gamma_lambda * tau * v)
    x = x_new
    xs.append(x)
    lams.append(lam)
  return xs, lams


def afl_reference(C, x0, lr, eta_lambda, sampled, m):
  """AFL: one step per client; x -= sum_S (N/m) lam_k (x - x_k); lam = P(lam + eta F)."""
  n = len(C)
  x = np.array(x0, np.float64)
  lam = np.full(n, 1.0 / n)
  xs, lams = [], []
  for S in sampled:
    F = np.zeros(n)
    x_new = x.copy()
    for k in S:
      F[k] = C[k].loss(x)  # at the round's model
      x_k = x - lr * C[k].grad(x)
      x_new = x_new - (n / m) * lam[k] * (x - x_k)
    lam = project_simplex_brute(lam + eta_lambda * F)
    x = x_new
    xs.append(x)
    lams.append(lam)
  return xs, lams


# ---- fixtures and checks ----------------------------------------------------------------


@pytest.fixture(scope="module")
def setup():
  examples = make_examples()
  data = fedco.FederatedData.from_clients(examples)
  C = [Client(ex) for ex in examples]
  rng = np.random.default_rng(1)
  x0 = (0.5 * rng.normal(size=D + 1)).astype(np.float32).astype(np.float64)
  return data, C, x0


_RUNS = {}


def run(alg, data, x0, rounds=ROUNDS, *, cache_key=None, **kw):
  """``fedco.simulate`` full-batch; runs named by ``cache_key`` are shared between tests."""
  if cache_key is not None and cache_key in _RUNS:
    return _RUNS[cache_key]
  res = fedco.simulate(PROBLEM, alg, data, to_params(x0), rounds=rounds, batch_size=None, **kw)
  if cache_key is not None:
    _RUNS[cache_key] = res
  return res


def check_trajectory(result, C, xs_ref, x0):
  x = to_vec(result.params)
  assert np.max(np.abs(xs_ref[-1] - x0)) > 1e-2  # the run moves, so the check can fail
  np.testing.assert_allclose(x, xs_ref[-1], rtol=RTOL, atol=ATOL)
  objs = [np.mean([c.loss(xr) for c in C]) for xr in xs_ref]
  losses = [[c.loss(xr) for c in C] for xr in xs_ref]
  np.testing.assert_allclose(
    np.asarray(result.metrics["objective"], np.float64), objs, rtol=RTOL, atol=ATOL
  )
  np.testing.assert_allclose(
    np.asarray(result.metrics["client_losses"], np.float64), losses, rtol=RTOL, atol=ATOL
  )


def sampled_ids(result, rounds, m, seed, tau=2):
  """The run's sampled clients, checked against the replayed key schedule."""
  ids = np.asarray(result.metrics["clients"])
  assert ids.shape == (rounds, m)
  schedule = replay_keys(seed, rounds, K, m, tau)
  np.testing.assert_array_equal(ids, np.stack([s[0] for s in schedule]))
  return ids


# ---- q-FedAvg ---------------------------------------------------------------------------


@pytest.mark.parametrize("q, m, seed", [(0.0, K, 0), (0.5, K, 0), (2.0, 2, 1)])
def test_qfedavg(setup, q, m, seed):
  data, C, x0 = setup
  lr = 0.1
  res = run(
    fedco.qfedavg(lr, STEPS, q=q),
    data,
    x0,
    clients_per_round=m,
    seed=seed,
    cache_key=("qfedavg", q, m, seed),
  )
  ids = sampled_ids(res, ROUNDS, m, seed)
  if m < K:
    assert len({tuple(r) for r in ids}) > 1, "pick a seed whose rounds sample differently"
  xs_ref = qfedavg_reference(C, x0, lr, STEPS, q, ids)
  check_trajectory(res, C, xs_ref, x0)
  if q > 0:  # q matters on this data, so q = 0 and q > 0 cannot pass the same check
    xs_avg = fedavg_reference(C, x0, lr, STEPS, ids)
    assert np.max(np.abs(xs_avg[-1] - xs_ref[-1])) > 1e-3
  # ledger: each sampled client sends its model and its loss F_k, receives the model
  assert res.ledger["up_per_client_per_round"] == {"params": D + 1, "loss": 1}
  assert res.ledger["down_per_client_per_round"] == {"params": D + 1}
  assert res.ledger["clients_per_round"] == m
  assert res.ledger["total_up"] == ROUNDS * m * (D + 2)
  assert res.ledger["total_down"] == ROUNDS * m * (D + 1)


def test_qfedavg_with_q0_is_uniform_fedavg(setup):
  data, C, x0 = setup
  lr = 0.1
  q0 = run(
    fedco.qfedavg(lr, STEPS, q=0.0),
    data,
    x0,
    clients_per_round=K,
    seed=0,
    cache_key=("qfedavg", 0.0, K, 0),
  )
  avg = run(fedco.fedavg(lr, STEPS, weighting="uniform"), data, x0)
  np.testing.assert_allclose(to_vec(q0.params), to_vec(avg.params), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(q0.metrics["objective"], avg.metrics["objective"], rtol=1e-5)
  xs_ref = fedavg_reference(C, x0, lr, STEPS, [range(K)] * ROUNDS)
  check_trajectory(q0, C, xs_ref, x0)
  # uniform, not size-weighted: the sample-weighted mean differs on this data
  sizes = np.array(SIZES, np.float64)
  x = np.array(x0)
  for _ in range(ROUNDS):
    x = sum(n * local_sgd(c, x, lr, STEPS)[-1] for n, c in zip(sizes, C)) / sizes.sum()
  assert np.max(np.abs(x - xs_ref[-1])) > 1e-3


# ---- DRFA -------------------------------------------------------------------------------


@pytest.mark.parametrize("m, seed", [(K, 1), (2, 1)])
def test_drfa(setup, m, seed):
  data, C, x0 = setup
  lr, gamma_lambda = 0.1, 0.003
  res = run(
    fedco.drfa(lr, STEPS, weights_lr=gamma_lambda), data, x0, clients_per_round=m, seed=seed
  )
  schedule = replay_keys(seed, ROUNDS, K, m, STEPS)
  ids = sampled_ids(res, ROUNDS, m, seed, STEPS)
  # the replayed draws exercise what they should: k' changes between rounds, and (with
  # partial participation) the queried clients are not the trained ones
  assert len({s[1] for s in schedule}) > 1
  if m < K:
    assert any(not np.array_equal(s[0], s[2]) for s in schedule)
    assert len({tuple(r) for r in ids}) > 1
  xs_ref, lams_ref = drfa_reference(C, x0, lr, STEPS, gamma_lambda, schedule, m)
  check_trajectory(res, C, xs_ref, x0)
  lam = np.asarray(res.state.server_opt_state.weights, np.float64)
  np.testing.assert_allclose(lam.sum(), 1.0, atol=1e-6)
  np.testing.assert_allclose(lam, lams_ref[-1], rtol=RTOL, atol=ATOL)
  lam0 = np.array(SIZES, np.float64) / sum(SIZES)
  assert np.max(np.abs(lams_ref[-1] - lam0)) > 1e-2  # lambda moved
  # another snapshot step would give another lambda: the check sees k'
  shifted = [(S, 1 + k % (STEPS - 1), Q) for S, k, Q in schedule]
  _, lams_shifted = drfa_reference(C, x0, lr, STEPS, gamma_lambda, shifted, m)
  assert np.max(np.abs(lams_shifted[-1] - lams_ref[-1])) > 1e-3
  # ledger: each sampled client sends its model and its step-k' snapshot, receives the model
  assert res.ledger["up_per_client_per_round"] == {"params": D + 1, "snapshot": D + 1}
  assert res.ledger["down_per_client_per_round"] == {"params": D + 1}
  assert res.ledger["clients_per_round"] == m
  assert res.ledger["total_up"] == ROUNDS * m * 2 * (D + 1)


# ---- AFL --------------------------------------------------------------------------------


@pytest.mark.parametrize("m, seed", [(K, 0), (2, 1)])
def test_afl(setup, m, seed):
  data, C, x0 = setup
  lr, eta_lambda, rounds = 0.1, 0.02, 6
  res = run(
    fedco.afl(lr, weights_lr=eta_lambda), data, x0, rounds=rounds, clients_per_round=m, seed=seed
  )
  ids = sampled_ids(res, rounds, m, seed)
  if m < K:
    assert len({tuple(r) for r in ids}) > 1
  xs_ref, lams_ref = afl_reference(C, x0, lr, eta_lambda, ids, m)
  check_trajectory(res, C, xs_ref, x0)
  lam = np.asarray(res.state.server_opt_state.weights, np.float64)
  np.testing.assert_allclose(lam.sum(), 1.0, atol=1e-6)
  np.testing.assert_allclose(lam, lams_ref[-1], rtol=RTOL, atol=ATOL)
  assert np.max(np.abs(lams_ref[-1] - 1.0 / K)) > 1e-2  # lambda moved
  # ledger: each sampled client sends its model and its loss F_k, receives the model
  assert res.ledger["up_per_client_per_round"] == {"params": D + 1, "loss": 1}
  assert res.ledger["down_per_client_per_round"] == {"params": D + 1}
  assert res.ledger["total_up"] == rounds * m * (D + 2)
