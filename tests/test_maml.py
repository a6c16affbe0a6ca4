"""MAML / DA-MAML problems (SPEC 4.4, 4.5) and Local-MOML (SPEC 3) against references.

* The inner map's VJP is the exact Hessian-vector product ``v - a H v`` (``H`` from
  ``jax.hessian`` on a two-hidden-layer MLP), chained over unrolled steps; first-order drops
  the term.
* The compositional gradient ``J_g^T grad f(g)`` on one episode equals ``jax.grad`` of the
  MAML loss written out by hand, ``sum_t w_t L_t(w - a grad L_t(w; S_t); Q_t)``, and differs
  from the task-averaged ``f(mean_t g_t)`` the per-task table avoids.
* DA-MAML's outer equals ``sum_t w_t exp(L_t / gamma)`` and stays finite with a shift.
* Local-MOML runs in ``fedco.simulate`` against a float64 NumPy transcription (linear model,
  two clients, four rounds), first- and second-order.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import fedco
from fedco import estimators
from fedco.algorithms.moml import local_moml
from fedco.models.mlp import MLP, init_mlp
from fedco.problems.maml import MAML, da_maml, da_maml_value, maml

A = 0.3  # a large inner step, so the second-order term is far above float32 noise


def _points(rng, n, scale=2.0):
  x = rng.uniform(-scale, scale, (n, 1)).astype(np.float32)
  return x, (np.sin(x) + 0.3 * x).astype(np.float32)


def _episode(rng, tasks, shots=6, weights=None):
  sx, sy = zip(*[_points(rng, shots) for _ in range(tasks)])
  qx, qy = zip(*[_points(rng, shots) for _ in range(tasks)])
  ep = {
    "support_x": np.stack(sx),
    "support_y": np.stack(sy),
    "query_x": np.stack(qx),
    "query_y": np.stack(qy),
  }
  if weights is not None:
    ep["task_weight"] = np.asarray(weights, np.float32)
  return {k: jnp.asarray(v) for k, v in ep.items()}


@pytest.fixture(scope="module")
def net():
  model = MLP(hidden=(6, 5), out=1, activation=jnp.tanh)  # two hidden layers
  return model, init_mlp(model, 1, seed=3)


@functools.lru_cache(maxsize=None)
def _hessian_fn(meta):
  """``(params, x, y) -> Hessian of the task loss`` over the flattened parameters (jitted)."""

  @jax.jit
  def hess(params, x, y):
    flat, unravel = ravel_pytree(params)
    return jax.hessian(lambda f: meta.task_loss(unravel(f), x, y))(flat)

  return hess


def _hessian(meta, params, x, y):
  return np.asarray(_hessian_fn(meta)(params, x, y), np.float64)


@functools.lru_cache(maxsize=None)
def _inner_vjp_fn(meta):

  @jax.jit
  def run(params, ep, cotangent):
    sample, pullback = estimators.inner_vjp(lambda w: meta.inner(w, ep), params)
    return sample, pullback(cotangent)

  return run


def _inner_vjp(meta, params, ep, cotangent):
  """``(g(w; ep), J_g^T cotangent)`` through fedco's oracle, jitted."""
  return _inner_vjp_fn(meta)(params, ep, cotangent)


def _flat(tree):
  return np.asarray(ravel_pytree(tree)[0], np.float64)


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_inner_vjp_is_the_exact_hessian_vector_product(activation):
  model = MLP(hidden=(6, 5), out=1, activation=getattr(jax.nn, activation))
  params = init_mlp(model, 1, seed=3)
  meta = MAML(model.apply, A)
  ep = _episode(np.random.default_rng(0), tasks=1)
  flat, unravel = ravel_pytree(params)
  v = np.asarray(jax.random.normal(jax.random.PRNGKey(1), flat.shape), np.float32)
  table_v = jax.tree.map(lambda a: a[None], unravel(jnp.asarray(v)))
  sample, got = _inner_vjp(meta, params, ep, table_v)
  got = _flat(got)
  H = _hessian(meta, params, ep["support_x"][0], ep["support_y"][0])
  hv = A * H @ v
  assert np.linalg.norm(hv) > 0.05 * np.linalg.norm(v)  # the term is there to be missed
  assert np.any(H[:12, 12:] != 0)  # curvature across layers (hidden_0 has 12 parameters)
  np.testing.assert_allclose(got, v - hv, rtol=1e-4, atol=2e-5 * np.abs(v).max())
  # the value is one gradient step
  g = _flat(jax.grad(meta.task_loss)(params, ep["support_x"][0], ep["support_y"][0]))
  np.testing.assert_allclose(
    _flat(jax.tree.map(lambda a: a[0], sample)), _flat(params) - A * g, rtol=1e-5, atol=1e-6
  )


def test_table_vjp_sums_each_tasks_product(net):
  model, params = net
  meta = MAML(model.apply, A)
  ep = _episode(np.random.default_rng(1), tasks=3)
  flat, unravel = ravel_pytree(params)
  vs = np.asarray(jax.random.normal(jax.random.PRNGKey(2), (3,) + flat.shape), np.float32)
  table_v = jax.vmap(unravel)(jnp.asarray(vs))
  _, got = _inner_vjp(meta, params, ep, table_v)
  expected = sum(
    vs[t] - A * _hessian(meta, params, ep["support_x"][t], ep["support_y"][t]) @ vs[t]
    for t in range(3)
  )
  np.testing.assert_allclose(_flat(got), expected, rtol=1e-4, atol=2e-5 * np.abs(vs).max())


def test_first_order_drops_the_hessian_term(net):
  model, params = net
  second, first = MAML(model.apply, A), MAML(model.apply, A, first_order=True)
  ep = _episode(np.random.default_rng(2), tasks=2)
  flat, unravel = ravel_pytree(params)
  vs = np.asarray(jax.random.normal(jax.random.PRNGKey(3), (2,) + flat.shape), np.float32)
  table_v = jax.vmap(unravel)(jnp.asarray(vs))
  s2, _ = _inner_vjp(second, params, ep, table_v)
  s1, got = _inner_vjp(first, params, ep, table_v)
  np.testing.assert_allclose(_flat(s1), _flat(s2), rtol=1e-6)  # same forward value
  np.testing.assert_allclose(_flat(got), vs.sum(0), rtol=1e-6, atol=1e-6)


def test_multi_step_equals_unrolled_chain_of_hessians(net):
  model, params = net
  steps = 3
  meta = MAML(model.apply, A, inner_steps=steps)
  one = MAML(model.apply, A)
  ep = _episode(np.random.default_rng(3), tasks=1)
  x, y = ep["support_x"][0], ep["support_y"][0]
  iterates = [params]
  step = jax.jit(lambda w: one.adapt(w, x, y))
  for _ in range(steps):
    iterates.append(step(iterates[-1]))
  flat, unravel = ravel_pytree(params)
  v = np.asarray(jax.random.normal(jax.random.PRNGKey(4), flat.shape), np.float64)
  sample, got = _inner_vjp(
    meta, params, ep, jax.tree.map(lambda a: a[None], unravel(jnp.asarray(v, jnp.float32)))
  )
  np.testing.assert_allclose(
    _flat(jax.tree.map(lambda a: a[0], sample)), _flat(iterates[-1]), rtol=1e-5, atol=1e-6
  )
  expected = v.copy()  # J^T v = (I - aH(w_0))(I - aH(w_1))(I - aH(w_2)) v
  for w in iterates[-2::-1]:
    expected = expected - A * _hessian(one, w, x, y) @ expected
  np.testing.assert_allclose(_flat(got), expected, rtol=2e-4, atol=5e-5 * np.abs(v).max())


def _hand_written_maml_loss(apply_fn, a, params, ep):
  """sum_t w_t L_t(w - a grad L_t(w; S_t); Q_t), written without fedco."""

  def loss(p, x, y):
    return jnp.mean(jnp.sum((jax.vmap(lambda xi: apply_fn(p, xi))(x) - y) ** 2, axis=-1))

  total = 0.0
  for t in range(ep["support_x"].shape[0]):
    g = jax.grad(loss)(params, ep["support_x"][t], ep["support_y"][t])
    adapted = jax.tree.map(lambda p, d: p - a * d, params, g)
    total = total + ep["task_weight"][t] * loss(adapted, ep["query_x"][t], ep["query_y"][t])
  return total


def _problem_grad(problem, params, ep):
  """``(f(g(w; ep); ep), J_g^T grad f)`` through the Problem's batch means, jitted."""

  @jax.jit
  def run(params, ep):
    batch, w1 = jax.tree.map(lambda a: a[None], ep), jnp.ones((1,), jnp.float32)
    _, z = estimators.value_and_compositional_grad(
      lambda w: problem.inner_value(w, batch, w1),
      lambda y: problem.outer_value(y, batch, w1),
      params,
    )
    return problem.client_objective(params, batch, w1), z

  return run(params, ep)


def test_compositional_gradient_equals_grad_of_the_direct_maml_loss(net):
  model, params = net
  ep = _episode(np.random.default_rng(4), tasks=4, weights=[0.5, 0.0, 0.3, 0.2])
  value, z = _problem_grad(maml(model.apply, A), params, ep)
  direct_value, direct = jax.jit(
    jax.value_and_grad(lambda w, ep: _hand_written_maml_loss(model.apply, A, w, ep))
  )(params, ep)
  np.testing.assert_allclose(_flat(z), _flat(direct), rtol=2e-4, atol=1e-5)
  np.testing.assert_allclose(float(value), float(direct_value), rtol=1e-5)
  # the task-averaged composition f(mean_t g_t) is a different objective
  meta = MAML(model.apply, A)
  naive = jax.jit(
    jax.grad(
      lambda w, ep: meta.outer(
        jax.tree.map(lambda a: jnp.broadcast_to(jnp.mean(a, 0), a.shape), meta.inner(w, ep)), ep
      )
    )
  )
  assert np.linalg.norm(_flat(naive(params, ep)) - _flat(direct)) > 1e-2 * np.linalg.norm(
    _flat(direct)
  )


def test_da_maml_outer_is_the_weighted_exp_mean_and_stable(net):
  model, params = net
  meta = MAML(model.apply, A)
  ep = _episode(np.random.default_rng(5), tasks=3, weights=[0.2, 0.5, 0.3])
  losses_fn = jax.jit(lambda w, ep: meta.query_losses(meta.inner(w, ep), ep))
  losses = losses_fn(params, ep)
  gamma = 0.5
  value, z = _problem_grad(da_maml(model.apply, A, gamma), params, ep)
  np.testing.assert_allclose(
    float(value), float(jnp.sum(ep["task_weight"] * jnp.exp(losses / gamma))), rtol=1e-5
  )
  direct = jax.jit(
    jax.grad(lambda w, ep: jnp.sum(ep["task_weight"] * jnp.exp(losses_fn(w, ep) / gamma)))
  )(params, ep)
  np.testing.assert_allclose(_flat(z), _flat(direct), rtol=2e-4, atol=1e-5)
  # tiny gamma: L/gamma far beyond float32's exp range; a shift keeps value and step finite
  tiny = float(jnp.min(losses)) / 1e3
  shift = float(jnp.max(losses))
  v, z = _problem_grad(da_maml(model.apply, A, tiny, shift=shift), params, ep)
  assert float(jnp.max(losses)) / tiny > 500  # exp(L / gamma) alone would overflow
  assert np.isfinite(float(v)) and np.all(np.isfinite(_flat(z)))
  ref = da_maml_value(losses, tiny, ep["task_weight"])  # gamma log sum w exp(L / gamma)
  assert np.isfinite(float(ref)) and float(ref) > 0
  np.testing.assert_allclose(tiny * (np.log(float(v)) + shift / tiny), float(ref), rtol=1e-4)


def test_bad_arguments_raise(net):
  model, _ = net
  with pytest.raises(ValueError, match="inner_lr"):
    maml(model.apply, -1.0)
  with pytest.raises(ValueError, match="inner_steps"):
    maml(model.apply, 0.1, inner_steps=0)
  with pytest.raises(ValueError, match="gamma"):
    da_maml(model.apply, 0.1, 0.0)
  with pytest.raises(ValueError, match="beta"):
    local_moml(0.01, beta=1.5)
  alg = local_moml(0.01, beta=0.7)
  with pytest.raises(ValueError, match="first_order=False"):
    alg.init(jnp.zeros(3), inner_value=jnp.zeros(2))
  local_moml(0.01, beta=0.7, first_order=False).init(jnp.zeros(3), inner_value=jnp.zeros(2))


# ---- Local-MOML against NumPy -----------------------------------------------------------

D, T, SHOTS = 2, 2, 4
LR, BETA, INNER, STEPS, ROUNDS = 0.2, 0.6, 0.1, 3, 4
# client 0 never samples its slot 1 (its memory must stay at the initial value)
WEIGHTS = ([[1.0, 0.0], [1.0, 0.0]], [[0.5, 0.5], [1.0, 0.0], [0.0, 1.0]])


def _linear(params, x):
  return params["w"] @ x + params["b"]


def _moml_clients(seed=0):
  rng = np.random.default_rng(seed)
  clients = []
  for k, weights in enumerate(WEIGHTS):
    n = len(weights)
    true_w = rng.normal(size=(T, D))

    def draw(n, true_w=true_w, k=k):
      x = rng.normal(size=(n, T, SHOTS, D)).astype(np.float32)
      y = (np.einsum("ntsd,td->nts", x, true_w) + 0.5 * k)[..., None].astype(np.float32)
      return x, y

    sx, sy = draw(n)
    qx, qy = draw(n)
    clients.append(
      {
        "support_x": sx,
        "support_y": sy,
        "query_x": qx,
        "query_y": qy,
        "task_weight": np.asarray(weights, np.float32),
      }
    )
  return clients


def _phi(x):  # features [x, 1] of the linear model
  return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)


def _grad(theta, x, y):  # grad of mean_s (theta . phi - y)^2
  f = _phi(np.asarray(x, np.float64))
  r = f @ theta - np.asarray(y, np.float64)[..., 0]
  return 2 * np.mean(r[..., None] * f, axis=-2)


def _hess(x):
  f = _phi(np.asarray(x, np.float64))
  return 2 * np.einsum("...si,...sj->...ij", f, f) / f.shape[-2]


def _moml_reference(clients, theta0, first_order):
  """Local-MOML in float64 with full-batch oracles (means over each client's episodes)."""

  def g(c, theta):  # [T, D+1]: slot t = mean_e (theta - a grad L(theta; S_e,t))
    return np.stack(
      [
        np.mean(
          [
            theta - INNER * _grad(theta, c["support_x"][e, t], c["support_y"][e, t])
            for e in range(len(c["task_weight"]))
          ],
          axis=0,
        )
        for t in range(T)
      ]
    )

  def grad_f(c, u):  # d/du_t of mean_e sum_t w_e,t L(u_t; Q_e,t)
    return np.stack(
      [
        np.mean(
          [
            c["task_weight"][e, t] * _grad(u[t], c["query_x"][e, t], c["query_y"][e, t])
            for e in range(len(c["task_weight"]))
          ],
          axis=0,
        )
        for t in range(T)
      ]
    )

  theta = np.array(theta0, np.float64)
  memories = [g(c, theta) for c in clients]
  init = [m.copy() for m in memories]
  for _ in range(ROUNDS):
    local = []
    for k, c in enumerate(clients):
      th, u = theta.copy(), memories[k]
      sampled = np.any(c["task_weight"] > 0, axis=0)  # the tasks the outer batch weighs
      for _ in range(STEPS):
        u = np.where(sampled[:, None], (1 - BETA) * u + BETA * g(c, th), u)
        v = grad_f(c, u)
        if first_order:
          z = v.sum(0)
        else:
          H = np.mean(_hess(c["support_x"]), axis=0)  # [T, D+1, D+1], constant
          z = sum(v[t] - INNER * H[t] @ v[t] for t in range(T))
        th = th - LR * z
      memories[k] = u
      local.append(th)
    theta = np.mean(local, axis=0)
  return theta, memories, init


@pytest.mark.parametrize("first_order", [True, False])
def test_local_moml_matches_numpy_transcription(first_order):
  clients = _moml_clients()
  data = fedco.FederatedData.from_clients(clients)
  problem = maml(_linear, INNER)
  params0 = {"w": jnp.asarray([0.3, -0.2], jnp.float32), "b": jnp.asarray(0.1, jnp.float32)}
  res = fedco.simulate(
    problem,
    local_moml(LR, STEPS, beta=BETA, first_order=first_order),
    data,
    params0,
    rounds=ROUNDS,
    batch_size=None,
    evaluate=False,
  )
  theta0 = np.array([0.3, -0.2, 0.1])
  theta, memories, init = _moml_reference(clients, theta0, first_order)
  got = np.concatenate(
    [np.asarray(res.params["w"], np.float64), np.asarray(res.params["b"], np.float64)[None]]
  )
  assert np.max(np.abs(theta - theta0)) > 1e-2  # the run moves
  np.testing.assert_allclose(got, theta, rtol=1e-4, atol=1e-5)
  u = res.state.clients.u  # [K, T, ...]
  for k in range(len(clients)):
    mem = np.concatenate(
      [np.asarray(u["w"][k], np.float64), np.asarray(u["b"][k], np.float64)[:, None]], axis=1
    )
    np.testing.assert_allclose(mem, memories[k], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(memories[0][1], init[0][1])  # never sampled: untouched


def test_scgd_family_runs_on_the_task_table():
  """Local-SCGD(M) keep one tracker entry per task slot (leaves [T, ...]) under simulate."""
  clients = _moml_clients(1)
  data = fedco.FederatedData.from_clients(clients)
  problem = maml(_linear, INNER)
  params0 = {"w": jnp.zeros(2, jnp.float32), "b": jnp.zeros((), jnp.float32)}
  res = fedco.simulate(
    problem,
    fedco.local_scgdm(1.0, 2, beta=0.1, alpha=0.8, gamma=0.7),
    data,
    params0,
    rounds=2,
    batch_size=1,
    evaluate=False,
  )
  assert res.state.clients.u["w"].shape == (2, T, D)
  assert np.all(np.isfinite(np.asarray(res.params["w"])))
