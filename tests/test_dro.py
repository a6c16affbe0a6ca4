"""The DRO objectives of SPEC 4.1-4.3 against float64 NumPy references.

* Client-level KL-DRO: the minimax identity (the value ``gamma log mean exp(f/gamma)`` is the
  max over the simplex of ``sum r_i f_i - gamma KL(r || 1/n)``, attained at
  ``softmax(f/gamma)``), float32 stability for ``f/gamma`` up to 1e4 (value, weights and the
  log-form problem's gradient), the log-form problem's objective and training on it, and
  that DRO training lowers the worst client's loss compared with FedAvg.
* Sample-level KL-DRO: the shifted problem is ``log mean exp(l/lam)`` for every shift.
* Sample-level chi^2-DRO: ``mean(l) + var(l)/(2 lam)``, the max over the simplex of the
  chi^2-penalised weighted loss (interior maximiser).

The simulator runs full-batch (``batch_size=None``), so every training run is deterministic.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.problems import (
  chi2_dro_value,
  client_kl_dro,
  client_kl_dro_log,
  kl_dro_value,
  kl_dro_weights,
  log_exp_form_value,
  sample_chi2_dro,
  sample_kl_dro,
  sample_kl_dro_value,
)

D = 2


# ---- NumPy helpers ----------------------------------------------------------------------


def np_kl_dro_value(f, gamma):
  """``gamma log(1/n sum exp(f/gamma))`` in float64 with a max shift."""
  z = np.asarray(f, np.float64) / gamma
  zmax = z.max()
  return gamma * (zmax + np.log(np.mean(np.exp(z - zmax))))


def np_softmax(z):
  z = np.asarray(z, np.float64)
  e = np.exp(z - z.max())
  return e / e.sum()


def np_project_simplex(v):
  """Sort-based Euclidean projection onto the simplex (Duchi et al. 2008), float64."""
  u = np.sort(v)[::-1]
  css = np.cumsum(u) - 1.0
  ks = np.arange(1, v.size + 1)
  rho = ks[u - css / ks > 0][-1]
  return np.maximum(v - css[rho - 1] / rho, 0.0)


def kl_objective(r, f, gamma):
  """``sum r_i f_i - gamma KL(r || 1/n)`` (``0 log 0 = 0``)."""
  n = f.size
  pos = r > 0
  return r @ f - gamma * np.sum(r[pos] * np.log(n * r[pos]))


def mirror_ascent_kl(f, gamma, steps=400):
  """Exponentiated-gradient ascent of ``kl_objective`` from the uniform point.

  The gradient is ``f - gamma (log(n r) + 1)``; with step ``eta`` the log-iterate contracts
  by ``1 - eta gamma`` per step towards the maximiser, so ``eta gamma = 0.3`` converges fast
  without jumping there in one step.
  """
  n = f.size
  eta = 0.3 / gamma
  log_r = np.full(n, -np.log(n))
  for _ in range(steps):
    grad = f - gamma * (log_r + np.log(n) + 1.0)
    log_r = log_r + eta * grad
    log_r = log_r - (log_r.max() + np.log(np.sum(np.exp(log_r - log_r.max()))))
  return np.exp(log_r)


def projected_ascent_chi2(l, lam, steps=2000):
  """Projected gradient ascent of ``sum p_i l_i - lam m/2 sum (p_i - 1/m)^2``."""
  m = l.size
  p = np.full(m, 1.0 / m)
  eta = 0.5 / (lam * m)  # the objective is (lam m)-strongly concave
  for _ in range(steps):
    p = np_project_simplex(p + eta * (l - lam * m * (p - 1.0 / m)))
  return p


def flat(data):
  """``(examples, owner, weights)`` of the flat (example, owner) list, for ``evaluate``."""
  return (
    jax.tree.map(lambda a: a[data.flat_rows], data.examples),
    data.flat_owner,
    data.flat_weights(),
  )


# ---- (a) the minimax identity -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [0.1, 0.5, 2.0, 10.0])
def test_kl_dro_value_is_the_max_over_the_simplex(seed, gamma):
  rng = np.random.default_rng(seed)
  n = 3 + seed
  f = rng.normal(size=n) * (1.0 + seed)
  r_star = mirror_ascent_kl(f, gamma)
  best = kl_objective(r_star, f, gamma)
  # the ascent found the max: no random point of the simplex does better
  others = rng.dirichlet(np.full(n, 0.5), size=500)
  assert max(kl_objective(r, f, gamma) for r in others) <= best + 1e-9
  # the max equals gamma log mean exp(f/gamma) ...
  expected = gamma * np.log(np.mean(np.exp(f / gamma)))
  np.testing.assert_allclose(best, expected, rtol=1e-9, atol=1e-9)
  f32 = jnp.asarray(f, jnp.float32)
  np.testing.assert_allclose(float(kl_dro_value(f32, gamma)), expected, rtol=1e-5, atol=1e-5)
  # ... and the maximiser is softmax(f / gamma)
  np.testing.assert_allclose(r_star, np_softmax(f / gamma), rtol=1e-7, atol=1e-12)
  np.testing.assert_allclose(
    np.asarray(kl_dro_weights(f32, gamma), np.float64), r_star, rtol=1e-5, atol=1e-7
  )
  # Danskin: d value / d f = r*
  np.testing.assert_allclose(
    np.asarray(jax.grad(kl_dro_value)(f32, gamma), np.float64), r_star, rtol=1e-5, atol=1e-7
  )


# ---- (b) float32 stability for f / gamma up to 1e4 --------------------------------------


@pytest.mark.parametrize("gamma", [1e-3, 0.2, 1.0, 50.0])
def test_kl_dro_value_and_weights_are_finite_and_exact_for_huge_ratios(gamma):
  rng = np.random.default_rng(0)
  z = np.concatenate([[1e4, 1e4 - 1.0, 1e4 - 3.0, 9e3, -1e4, 0.0], rng.uniform(-1e4, 1e4, 6)])
  f32 = (z * gamma).astype(np.float32)
  f64 = f32.astype(np.float64)  # the reference sees exactly the float32 inputs
  value = np.asarray(kl_dro_value(jnp.asarray(f32), gamma))
  weights = np.asarray(kl_dro_weights(jnp.asarray(f32), gamma))
  grad = np.asarray(jax.grad(kl_dro_value)(jnp.asarray(f32), gamma))
  assert value.dtype == np.float32 and np.isfinite(value)
  assert np.all(np.isfinite(weights)) and np.all(np.isfinite(grad))
  np.testing.assert_allclose(float(value), np_kl_dro_value(f64, gamma), rtol=1e-6)
  ref_w = np_softmax(f64 / gamma)
  assert ref_w[0] > 0.5 and ref_w[1] > 0.1  # the weights are not a trivial one-hot
  # f32 / gamma carries a rounding error of ~6e-4 at 1e4, hence the weights' rtol
  np.testing.assert_allclose(weights, ref_w, rtol=3e-3, atol=1e-7)
  np.testing.assert_allclose(grad, ref_w, rtol=3e-3, atol=1e-7)
  np.testing.assert_allclose(float(weights.sum()), 1.0, atol=1e-6)
  np.testing.assert_allclose(
    float(log_exp_form_value(jnp.asarray(f32), gamma)),
    np_kl_dro_value(f64, gamma) / gamma,
    rtol=1e-6,
  )


def make_regression(sizes, models, seed=0, noise=0.1):
  rng = np.random.default_rng(seed)
  out = []
  for (w, b), n in zip(models, sizes):
    a = rng.normal(size=(n, D))
    y = a @ np.asarray(w) + b + noise * rng.normal(size=n)
    out.append({"a": a.astype(np.float32), "y": y.astype(np.float32)})
  return out


class Client:
  """Float64 whole-data loss ``off + s 0.5 mean r^2`` and gradient; ``x = [w (D), b]``."""

  def __init__(self, ex, scale=1.0):
    self.a = np.asarray(ex["a"], np.float64)
    self.y = np.asarray(ex["y"], np.float64)
    self.off = float(np.mean(np.asarray(ex["off"], np.float64))) if "off" in ex else 0.0
    self.s = scale
    self.n = self.a.shape[0]

  def residual(self, x):
    return self.a @ x[:D] + x[D] - self.y

  def loss(self, x):
    return self.off + self.s * 0.5 * np.mean(self.residual(x) ** 2)

  def grad(self, x):
    r = self.residual(x)
    return self.s * np.concatenate([self.a.T @ r / self.n, [np.mean(r)]])


def to_vec(params):
  return np.concatenate(
    [np.asarray(params["w"], np.float64).ravel(), np.asarray(params["b"], np.float64).reshape(1)]
  )


def to_params(x):
  x = np.asarray(x, np.float32)
  return {"w": jnp.asarray(x[:D]), "b": jnp.asarray(x[D])}


def sq_loss(params, e):
  return 0.5 * (params["w"] @ e["a"] + params["b"] - e["y"]) ** 2


@pytest.mark.parametrize("gamma", [1.0, 1e-3])
def test_log_form_gradient_is_softmax_weighted_for_huge_losses(gamma):
  """f_k / gamma ~ 1e4: the log form's value and gradient stay finite and exact."""
  sizes = (4, 6, 3)
  examples = make_regression(sizes, [([1.0, -1.0], 0.0), ([0.5, 0.5], 0.3), ([-1.0, 2.0], 1.0)])
  for k, (ex, z) in enumerate(zip(examples, (1e4, 1e4 - 1.0, 1e4 - 2.0))):
    ex["off"] = np.full(sizes[k], z * gamma, np.float32)
  scale = gamma  # the model part of f_k / gamma is O(1), so the weights are not one-hot
  loss = lambda p, e: e["off"] + scale * sq_loss(p, e)
  data = fedco.FederatedData.from_clients(examples).with_owner()
  C = [Client(ex, scale) for ex in examples]
  problem = client_kl_dro_log(loss, gamma, len(sizes))
  x = np.array([0.3, -0.2, 0.1])
  objective = lambda p: problem.evaluate(p, *flat(data), len(sizes))[0]
  value, grad = jax.jit(jax.value_and_grad(objective))(to_params(x))
  F = np.array([c.loss(x) for c in C])
  r = np_softmax(F / gamma)
  assert np.max(F / gamma) > 9.9e3 and r.min() > 0.05
  assert np.isfinite(float(value))
  np.testing.assert_allclose(float(value), np_kl_dro_value(F, gamma), rtol=1e-6)
  g = to_vec(grad)
  assert np.all(np.isfinite(g))
  expected = sum(rk * c.grad(x) for rk, c in zip(r, C))
  # float32 losses near 1e4 * gamma carry ~1e-3 of error in f / gamma, hence the tolerance
  np.testing.assert_allclose(g, expected, rtol=3e-3, atol=3e-3 * np.abs(expected).max())
  # the exp form cannot even be evaluated there (documented): this is why the log form ships
  exp_form = client_kl_dro(loss, gamma)
  exp_value = jax.jit(lambda p: exp_form.evaluate(p, *flat(data), len(sizes))[0])(to_params(x))
  assert not np.isfinite(float(exp_value))


# ---- (c) + (f): the log form on a tiny problem with one hard client ---------------------

SIZES = (12, 10, 3)  # clients 0 and 1 agree; client 2 (few examples) is the hard one
MODELS = [([1.0, -1.0], 0.0), ([1.2, -0.8], 0.2), ([-1.0, 2.0], 1.0)]
GAMMA = 2.0
ROUNDS = 40


@pytest.fixture(scope="module")
def tiny():
  examples = make_regression(SIZES, MODELS)
  data = fedco.FederatedData.from_clients(examples).with_owner()
  C = [Client(ex) for ex in examples]
  return data, C, np.zeros(D + 1)


_RUNS = {}


def tiny_run(name, tiny, rounds=ROUNDS):
  """The tiny problem's runs, each simulated once per session."""
  if name not in _RUNS:
    data, _, x0 = tiny
    log_form = client_kl_dro_log(sq_loss, GAMMA, len(SIZES))
    problem, alg = {
      "fedavg": (fedco.plain(sq_loss), fedco.fedavg(0.1, 5)),
      "comfedl": (client_kl_dro(sq_loss, GAMMA), fedco.comfedl(0.01, 5)),
      "feddro": (log_form, fedco.feddro(0.1, 5, beta=0.5)),
      "mbsgd": (log_form, fedco.mbsgd(0.1)),
    }[name]
    _RUNS[name] = fedco.simulate(problem, alg, data, to_params(x0), rounds=rounds, batch_size=None)
  return _RUNS[name]


def test_log_form_objective_is_kl_dro_value_of_client_losses(tiny):
  data, C, _ = tiny
  K = len(SIZES)
  log_form = client_kl_dro_log(sq_loss, GAMMA, K)
  plain = fedco.plain(sq_loss)
  rng = np.random.default_rng(3)
  for x in [np.zeros(D + 1)] + [rng.normal(size=D + 1) for _ in range(3)]:
    obj, _ = log_form.evaluate(to_params(x), *flat(data), K)
    _, client_losses = plain.evaluate(to_params(x), *flat(data), K)
    F = np.array([c.loss(x) for c in C])
    np.testing.assert_allclose(np.asarray(client_losses, np.float64), F, rtol=1e-5)
    np.testing.assert_allclose(float(obj), np_kl_dro_value(F, GAMMA), rtol=1e-5)
    np.testing.assert_allclose(float(obj), float(kl_dro_value(client_losses, GAMMA)), rtol=1e-5)
    # the inner value is the vector of client losses: 1/K sum_k g_k(x) = (F_1, ..., F_K)
    ex, owner, w = flat(data)
    g = jax.ops.segment_sum(
      w[:, None] * jax.vmap(log_form.inner, (None, 0))(to_params(x), ex), owner, num_segments=K
    ).mean(0)
    np.testing.assert_allclose(np.asarray(g, np.float64), F, rtol=1e-5)


def test_mbsgd_on_log_form_is_gradient_descent_on_kl_dro(tiny):
  """Full batch, MBSGD's y_bar is the vector of client losses, so its step is
  ``x -= lr sum_k softmax(F/gamma)_k grad F_k(x)``: exact GD on the KL-DRO value."""
  data, C, x0 = tiny
  res = tiny_run("mbsgd", tiny)
  x = x0.copy()
  objs = []
  for _ in range(ROUNDS):
    F = np.array([c.loss(x) for c in C])
    r = np_softmax(F / GAMMA)
    x = x - 0.1 * sum(rk * c.grad(x) for rk, c in zip(r, C))
    objs.append(np_kl_dro_value([c.loss(x) for c in C], GAMMA))
  np.testing.assert_allclose(to_vec(res.params), x, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
    np.asarray(res.metrics["objective"], np.float64), objs, rtol=1e-4, atol=1e-5
  )
  start = np_kl_dro_value([c.loss(x0) for c in C], GAMMA)
  assert objs[-1] < start - 0.3
  assert np.all(np.diff(objs) <= 1e-9)  # GD with a small step decreases it monotonically


def test_feddro_on_log_form_decreases_the_objective(tiny):
  data, C, x0 = tiny
  res = tiny_run("feddro", tiny)
  objs = np.asarray(res.metrics["objective"], np.float64)
  start = np_kl_dro_value([c.loss(x0) for c in C], GAMMA)
  assert objs[0] < start and objs[-1] < start - 0.3
  assert objs[-1] <= objs[: ROUNDS // 2].min()
  x = to_vec(res.params)
  np.testing.assert_allclose(objs[-1], np_kl_dro_value([c.loss(x) for c in C], GAMMA), rtol=1e-5)


def test_dro_lowers_the_worst_client_loss_compared_with_fedavg(tiny):
  data, C, x0 = tiny
  worst = {}
  for name in ("fedavg", "comfedl", "feddro"):
    x = to_vec(tiny_run(name, tiny).params)
    F = np.array([c.loss(x) for c in C])
    worst[name] = F.max()
    if name == "fedavg":
      assert np.argmax(F) == 2  # the small, different client is the one FedAvg neglects
  assert worst["comfedl"] < 0.5 * worst["fedavg"], worst
  assert worst["feddro"] < 0.5 * worst["fedavg"], worst


# ---- (d) sample-level KL-DRO ------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(12,), (6, 6)])
@pytest.mark.parametrize("lam", [0.5, 2.0])
def test_sample_kl_dro_is_log_mean_exp_for_every_shift(sizes, lam):
  examples = make_regression(
    sizes, [([1.0, -1.0], 0.0), ([-0.5, 1.0], 0.5)][: len(sizes)], noise=0.5
  )
  data = fedco.FederatedData.from_clients(examples)
  x = to_params([0.2, 0.1, -0.3])
  ex, owner, w = flat(data)
  l = np.asarray(jax.vmap(sq_loss, (None, 0))(x, ex))  # equal sizes: a plain sample mean
  ref = np.log(np.mean(np.exp(l.astype(np.float64) / lam)))
  np.testing.assert_allclose(float(sample_kl_dro_value(jnp.asarray(l), lam)), ref, rtol=1e-6)
  values, grads = [], []
  for shift in (0.0, float(l.max()), float(l.mean()), -3.0, 10.0):
    problem = sample_kl_dro(sq_loss, lam, shift=shift)
    obj = lambda p, problem=problem: problem.evaluate(p, ex, owner, w, len(sizes))[0]
    value, grad = jax.jit(jax.value_and_grad(obj))(x)
    values.append(float(value))
    grads.append(to_vec(grad))
  np.testing.assert_allclose(values, ref, rtol=1e-5, atol=1e-6)
  for g in grads[1:]:
    np.testing.assert_allclose(g, grads[0], rtol=1e-4, atol=1e-6)
  # the value function is exact far beyond exp's float32 range
  huge = jnp.asarray(l) + 1e4 * lam
  np.testing.assert_allclose(float(sample_kl_dro_value(huge, lam)), ref + 1e4, rtol=1e-6)


# ---- (e) sample-level chi^2-DRO ---------------------------------------------------------


@pytest.mark.parametrize("lam", [1.0, 3.0])
def test_sample_chi2_dro_is_mean_plus_variance_and_the_interior_max(lam):
  examples = make_regression((10,), [([1.0, -1.0], 0.0)], noise=0.4)
  data = fedco.FederatedData.from_clients(examples)
  C = Client(examples[0])
  x = np.array([0.8, -0.7, 0.2])
  ex, owner, w = flat(data)
  problem = sample_chi2_dro(sq_loss, lam)
  obj = lambda p: problem.evaluate(p, ex, owner, w, 1)[0]
  value, grad = jax.jit(jax.value_and_grad(obj))(to_params(x))
  l = 0.5 * C.residual(x) ** 2
  m = l.size
  expected = l.mean() + np.var(l) / (2 * lam)  # population variance
  np.testing.assert_allclose(float(value), expected, rtol=1e-5)
  np.testing.assert_allclose(
    float(chi2_dro_value(jnp.asarray(l, jnp.float32), lam)), expected, rtol=1e-5
  )
  # the dual: max over the simplex of sum p l - lam m/2 sum (p - 1/m)^2, interior here
  p = projected_ascent_chi2(l, lam)
  assert p.min() > 1e-3, "pick a spread of losses with an interior maximiser"
  dual = p @ l - lam * m / 2 * np.sum((p - 1.0 / m) ** 2)
  np.testing.assert_allclose(dual, expected, rtol=1e-8)
  np.testing.assert_allclose(p, 1.0 / m + (l - l.mean()) / (lam * m), atol=1e-8)
  # Danskin: the gradient is the p*-weighted sum of the per-example loss gradients
  r = C.residual(x)
  per_example = r[:, None] * np.concatenate([C.a, np.ones((m, 1))], axis=1)
  np.testing.assert_allclose(to_vec(grad), p @ per_example, rtol=1e-4, atol=1e-6)
