"""FastDRO and primal-dual SGD (SPEC 3) against float64 NumPy references.

The best responses are checked against independent references: CVaR against the sort-based
closed form, chi^2 against a float64 bisection on the divergence plus the optimality of
``p*`` over random feasible points. The two algorithms are then run full-batch in the
federated runtime (each client's batch is its whole data; padding rows weigh 0) next to
NumPy transcriptions of their pseudocode, for several rounds on four clients of different
sizes, with full and partial participation (the sampled clients replayed from the key
schedule). A mini-batch run checks that ``example_rows`` name the drawn examples.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.algorithms import sample_dro
from tests import test_robust as tr

RTOL, ATOL = 1e-4, 1e-5


# ---- best responses ---------------------------------------------------------------------


def cvar_sorted(losses, alpha, w):
  """Fill the largest losses up to their cap ``w_i / alpha`` until the mass is 1."""
  order = np.argsort(-losses, kind="stable")
  p = np.zeros_like(losses)
  left = 1.0
  for i in order:
    if w[i] <= 0:
      continue
    take = min(w[i] / alpha, left)
    p[i] = take
    left -= take
  return p


def chi2_reference(losses, rho, w):
  """float64 bisection on ``eta`` for ``p(eta) ~ w (l - eta)_+`` at divergence ``rho``."""
  real = w > 0

  def p_at(eta):
    e = w * np.maximum(losses - eta, 0.0)
    return e / e.sum() if e.sum() > 0 else np.full_like(e, np.nan)

  def div(p):
    return 0.5 * np.sum(w[real] * (p[real] / w[real] - 1.0) ** 2)

  lo, hi = losses[real].min() - 1e3, losses[real].max()
  for _ in range(200):
    mid = 0.5 * (lo + hi)
    if div(p_at(mid)) <= rho:
      lo = mid
    else:
      hi = mid
  return p_at(lo), div


@pytest.mark.parametrize("seed", range(5))
def test_cvar_best_response_is_the_sorted_fill(seed):
  rng = np.random.default_rng(seed)
  n = 3 + 4 * seed
  losses = rng.exponential(size=n)
  w = rng.dirichlet(np.ones(n)) if seed % 2 else np.full(n, 1.0 / n)
  if seed == 4:  # padding rows weigh 0 and must get no mass
    w[:2] = 0.0
    w = w / w.sum()
    losses[:2] = 100.0
  for alpha in (0.1, 0.3, 0.5, 1.0):
    p = np.asarray(
      sample_dro.cvar_best_response(
        jnp.asarray(losses, jnp.float32), alpha, jnp.asarray(w, jnp.float32)
      ),
      np.float64,
    )
    ref = cvar_sorted(losses.astype(np.float32).astype(np.float64), alpha, w)
    np.testing.assert_allclose(p, ref, atol=2e-5)
    assert np.all(p <= w / alpha + 1e-6) and abs(p.sum() - 1) < 1e-5
  # alpha = 1 is the empirical distribution (ERM)
  np.testing.assert_allclose(
    sample_dro.cvar_best_response(
      jnp.asarray(losses, jnp.float32), 1.0, jnp.asarray(w, jnp.float32)
    ),
    w,
    atol=1e-6,
  )


@pytest.mark.parametrize("seed", range(5))
def test_chi2_best_response_matches_reference_and_is_optimal(seed):
  rng = np.random.default_rng(10 + seed)
  n = 4 + 3 * seed
  losses = rng.exponential(size=n).astype(np.float32).astype(np.float64)
  w = np.full(n, 1.0 / n)
  if seed == 3:
    w[0] = 0.0
    w = w / w.sum()
  for rho in (0.05, 0.5, 2.0):
    p = np.asarray(
      sample_dro.chi2_best_response(
        jnp.asarray(losses, jnp.float32), rho, jnp.asarray(w, jnp.float32)
      ),
      np.float64,
    )
    ref, div = chi2_reference(losses, rho, w)
    assert abs(p.sum() - 1) < 1e-5 and np.all(p >= 0)
    assert div(p) <= rho * (1 + 1e-3) + 1e-6
    np.testing.assert_allclose(p, ref, atol=5e-4)
    # no random feasible point does better
    for _ in range(200):
      q = rng.dirichlet(np.ones(n)) * (w > 0)
      q = q / q.sum()
      q = w + (q - w) * min(1.0, np.sqrt(rho / max(div(q), 1e-12)))  # shrink into the ball
      assert q @ losses <= p @ losses + 1e-5
  # a ball large enough to hold the worst example: all mass on it
  p = sample_dro.chi2_best_response(
    jnp.asarray(losses, jnp.float32), 1e6, jnp.asarray(w, jnp.float32)
  )
  assert float(p[int(np.argmax(np.where(w > 0, losses, -1)))]) == pytest.approx(1.0, abs=1e-6)
  # equal losses: the empirical distribution
  p = sample_dro.chi2_best_response(jnp.ones(n), 0.5, jnp.asarray(w, jnp.float32))
  np.testing.assert_allclose(p, w, atol=1e-6)


# ---- federated runs against NumPy transcriptions ----------------------------------------


class PerExample(tr.Client):
  """Per-example losses and gradients of client k's rows, float64 (``x = [w, b]``)."""

  def losses(self, x):
    return 0.5 * self.residual(x) ** 2

  def example_grads(self, x):
    r = self.residual(x)
    return np.concatenate([self.a * r[:, None], r[:, None]], axis=1)  # [n, D + 1]


def sampled(seed, rounds, m):
  return [s[0] for s in tr.replay_keys(seed, rounds, tr.K, m, 2)]


def fastdro_reference(C, x0, lr, steps, geometry, size, schedule):
  x = np.array(x0, np.float64)
  xs = []
  for S in schedule:
    finals = []
    for k in S:
      xk = x.copy()
      for _ in range(steps):
        w = np.full(C[k].n, 1.0 / C[k].n)
        l = C[k].losses(xk)
        if geometry == "cvar":
          p = cvar_sorted(l, size, w)
        else:
          p, _ = chi2_reference(l, size, w)
        xk = xk - lr * p @ C[k].example_grads(xk)
      finals.append(xk)
    x = np.mean(finals, axis=0)
    xs.append(x)
  return xs


@pytest.mark.parametrize(
  "geometry, size, m, steps, seed",
  [("cvar", 0.3, tr.K, 1, 0), ("chi2", 0.5, tr.K, 2, 0), ("cvar", 0.5, 2, 2, 1)],
)
def test_fastdro_matches_transcription(geometry, size, m, steps, seed):
  examples = tr.make_examples()
  data = fedco.FederatedData.from_clients(examples)
  C = [PerExample(ex) for ex in examples]
  x0 = 0.5 * np.random.default_rng(1).normal(size=tr.D + 1)
  x0 = x0.astype(np.float32).astype(np.float64)
  lr, rounds = 0.05, 4
  alg = fedco.fastdro(lr, steps, geometry=geometry, size=size)
  res = fedco.simulate(
    tr.PROBLEM,
    alg,
    data,
    tr.to_params(x0),
    rounds=rounds,
    batch_size=None,
    clients_per_round=m,
    seed=seed,
  )
  schedule = sampled(seed, rounds, m)
  np.testing.assert_array_equal(np.asarray(res.metrics["clients"]), np.stack(schedule))
  xs = fastdro_reference(C, x0, lr, steps, geometry, size, schedule)
  assert np.max(np.abs(xs[-1] - x0)) > 1e-2
  np.testing.assert_allclose(tr.to_vec(res.params), xs[-1], rtol=5e-4, atol=5e-5)


def primal_dual_reference(C, x0, lr, eta_p, reg, steps, schedule, offsets):
  n_total = sum(c.n for c in C)
  K = len(C)
  x = np.array(x0, np.float64)
  p = np.full(n_total, 1.0 / n_total)
  xs, ps = [], []
  for S in schedule:
    m = len(S)
    finals, v = [], np.zeros(n_total)
    sizes = np.array([C[k].n for k in S], np.float64)
    for k in S:
      rows = offsets[k] + np.arange(C[k].n)
      xk = x.copy()
      for _ in range(steps):
        l = C[k].losses(xk)
        v[rows] += (K / m) * C[k].n * l / C[k].n  # n_k/b sum_j l_j e_j, b = n_k
        xk = xk - lr * (n_total * p[rows] / C[k].n) @ C[k].example_grads(xk)
      finals.append(xk)
    x = np.tensordot(sizes / sizes.sum(), np.stack(finals), axes=1)
    p = project_sorted(p + eta_p * (v - reg * n_total * (p - 1.0 / n_total)))
    xs.append(x)
    ps.append(p)
  return xs, ps


@pytest.mark.parametrize("m, steps, reg, seed", [(tr.K, 1, 0.0, 0), (2, 2, 0.5, 1)])
def test_primal_dual_matches_transcription(m, steps, reg, seed):
  examples = tr.make_examples()
  data = fedco.FederatedData.from_clients(examples)
  C = [PerExample(ex) for ex in examples]
  offsets = np.concatenate([[0], np.cumsum([c.n for c in C])[:-1]])
  n_total = sum(c.n for c in C)
  x0 = 0.5 * np.random.default_rng(1).normal(size=tr.D + 1)
  x0 = x0.astype(np.float32).astype(np.float64)
  lr, eta_p, rounds = 0.02, 0.002, 4
  alg = fedco.primal_dual_dro(lr, steps, num_examples=n_total, weights_lr=eta_p, reg=reg)
  sim = fedco.Simulator(tr.PROBLEM, alg, data, batch_size=None, clients_per_round=m)
  state, metrics = sim.run(sim.init(tr.to_params(x0), seed=seed), rounds)
  schedule = sampled(seed, rounds, m)
  np.testing.assert_array_equal(np.asarray(metrics["clients"]), np.stack(schedule))
  xs, ps = primal_dual_reference(C, x0, lr, eta_p, reg, steps, schedule, offsets)
  p = np.asarray(state.server["p"], np.float64)
  assert np.max(np.abs(ps[-1] - 1.0 / n_total)) > 1e-3  # the weights move
  np.testing.assert_allclose(p, ps[-1], rtol=1e-3, atol=1e-5)
  np.testing.assert_allclose(tr.to_vec(state.server["params"]), xs[-1], rtol=5e-4, atol=5e-5)


def project_sorted(v):
  u = np.sort(v)[::-1]
  css = np.cumsum(u) - 1.0
  k = np.arange(1, v.size + 1)
  rho = k[u - css / k > 0][-1]
  return np.maximum(v - css[rho - 1] / rho, 0.0)


def test_primal_dual_minibatch_rows_name_the_drawn_examples():
  """One mini-batch round: the ascent lands on exactly the rows the runtime drew."""
  examples = tr.make_examples()
  data = fedco.FederatedData.from_clients(examples)
  counts = np.asarray(data.counts)
  n_total, b, eta_p, seed = int(counts.sum()), 2, 0.05, 3
  alg = fedco.primal_dual_dro(1e-3, num_examples=n_total, weights_lr=eta_p)
  sim = fedco.Simulator(tr.PROBLEM, alg, data, batch_size=b)
  x0 = np.zeros(tr.D + 1)
  state, _ = sim.run(sim.init(tr.to_params(x0), seed=seed), 1)
  # replay the key schedule: round key -> client key -> step key -> (inner, outer, next)
  key, _ = jax.random.split(jax.random.PRNGKey(seed))
  _, _, k_round, _, _ = jax.random.split(key, 5)
  flat_y = np.concatenate([np.zeros(0)] + [ex["y"] for ex in examples]).astype(np.float64)
  index = np.asarray(data.index)
  v = np.zeros(n_total)
  for k in range(tr.K):
    skey = jax.random.fold_in(jax.random.fold_in(k_round, k), 0)
    _, kf, _ = jax.random.split(skey, 3)
    rows = index[k][np.asarray(jax.random.randint(kf, (b,), 0, counts[k]))]
    for r in rows:  # n_k / b * loss at x0 = 0, for each draw (repeats add up)
      v[r] += tr.K / tr.K * counts[k] * 0.5 * flat_y[r] ** 2 / b
  ref = project_sorted(np.full(n_total, 1.0 / n_total) + eta_p * v)
  assert np.sum(v > 0) >= tr.K  # the check can fail: several rows drawn
  np.testing.assert_allclose(np.asarray(state.server["p"], np.float64), ref, atol=1e-6)


def test_bad_arguments():
  with pytest.raises(ValueError, match="geometry"):
    fedco.fastdro(0.1, geometry="kl")
  with pytest.raises(ValueError, match="size"):
    fedco.fastdro(0.1, geometry="cvar", size=1.5)
  with pytest.raises(ValueError, match="size"):
    fedco.fastdro(0.1, geometry="chi2", size=0.0)
  with pytest.raises(ValueError, match="learning_rate"):
    fedco.fastdro(-0.1)
  with pytest.raises(ValueError, match="num_examples"):
    fedco.primal_dual_dro(0.1, num_examples=0)
  with pytest.raises(ValueError, match="weights_lr"):
    fedco.primal_dual_dro(0.1, num_examples=10, weights_lr=-1.0)
  with pytest.raises(ValueError, match="reg"):
    fedco.primal_dual_dro(0.1, num_examples=10, reg=-1.0)
  alg = fedco.fastdro(0.1)
  state = alg.init({"w": jnp.zeros(2)})
  with pytest.raises(ValueError, match="example_losses_fn"):
    alg.update(None, state, {"w": jnp.zeros(2)})
