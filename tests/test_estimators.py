"""The VJP oracle, the trackers and the shipped problems."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import estimators
from fedco.problems import (
  client_kl_dro,
  kl_dro_value,
  kl_dro_weights,
  portfolio,
  portfolio_stationary_point,
)
from tests import helpers


def test_compositional_grad_equals_grad_of_composition_for_pytrees():
  """With deterministic sampling, J_g^T grad f(g(x)) + grad h == jax.grad(f o g + h)."""
  rng = np.random.default_rng(0)
  params = {
    "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
    "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
  }
  batch = {"x": jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)}

  def inner(p, e):  # a pytree-valued inner map
    h = jnp.tanh(e["x"] @ p["w"] + p["b"])
    return {"mean": h, "sq": h**2}

  def outer(y):
    return jnp.sum(jnp.log1p(y["mean"] ** 2)) + jnp.sum(y["sq"]) ** 2

  extra = lambda p, e: 0.1 * jnp.sum(p["w"] ** 2) + jnp.sum(e["x"]) * jnp.sum(p["b"])
  problem = fedco.local_inner(inner, outer, extra)
  grad_h_fn, kw = fedco.oracle_args(problem, batch, batch, batch)
  _, z = estimators.value_and_compositional_grad(kw["inner_fn"], kw["outer_fn"], params)
  z = jax.tree.map(jnp.add, z, grad_h_fn(params))
  w = jnp.full((6,), 1 / 6)
  exact = jax.grad(lambda p: problem.client_objective(p, batch, w))(params)
  for k in params:
    np.testing.assert_allclose(np.asarray(z[k]), np.asarray(exact[k]), rtol=1e-5, atol=1e-6)


def test_trackers_follow_their_formulas():
  y, new, old = jnp.array([1.0, 2.0]), jnp.array([3.0, -1.0]), jnp.array([0.5, 0.5])
  np.testing.assert_allclose(estimators.fresh().update(y, new, None), new)
  np.testing.assert_allclose(
    estimators.moving_average(0.25).update(y, new, None), 0.75 * y + 0.25 * new
  )
  np.testing.assert_allclose(estimators.hybrid(0.25).update(y, new, old), 0.75 * (y - old) + new)
  with pytest.raises(ValueError, match="s_old"):
    estimators.hybrid(0.5).update(y, new, None)


def test_hybrid_tracker_is_exact_for_a_deterministic_map():
  """If y = g(x_old) exactly, the hybrid update gives g(x_new) exactly, for any beta."""
  g = lambda x: jnp.sin(x) * 3.0
  x_old, x_new = jnp.array([0.2, -1.0]), jnp.array([0.5, 0.3])
  out = estimators.hybrid(0.3).update(g(x_old), g(x_new), g(x_old))
  np.testing.assert_allclose(out, g(x_new), rtol=1e-6)


def test_portfolio_objective_and_stationary_point():
  clients = helpers.portfolio_clients()
  data = fedco.FederatedData.from_clients([{"r": c} for c in clients])
  problem = portfolio(2.0)
  x_star = portfolio_stationary_point(clients, 2.0)
  objective = lambda x: problem.evaluate(
    x, {"r": data.examples["r"][data.flat_rows]}, data.flat_owner, data.flat_weights(), 3
  )[0]
  grad = jax.grad(objective)(jnp.asarray(x_star, jnp.float32))
  assert float(jnp.linalg.norm(grad)) < 1e-4
  # closed form: -mu^T x + lam x^T C x with client-averaged moments
  x = jnp.array([0.3, -0.2, 0.1])
  mu = np.mean([c.mean(0) for c in clients], 0)
  second = np.mean([c.T @ c / len(c) for c in clients], 0)
  cov = second - np.outer(mu, mu)
  expected = -mu @ np.asarray(x) + 2.0 * np.asarray(x) @ cov @ np.asarray(x)
  np.testing.assert_allclose(float(objective(x)), expected, rtol=1e-4)


def test_kl_dro_value_and_weights_are_stable_and_correct():
  losses = jnp.array([0.5, 1.0, 3.0])
  gamma = 0.5
  expected = gamma * np.log(np.mean(np.exp(np.asarray(losses) / gamma)))
  np.testing.assert_allclose(float(kl_dro_value(losses, gamma)), expected, rtol=1e-6)
  np.testing.assert_allclose(
    np.asarray(kl_dro_weights(losses, gamma)),
    np.exp(losses / gamma) / np.exp(losses / gamma).sum(),
    rtol=1e-6,
  )
  huge = jnp.array([1e4, 0.0, 5e3], jnp.float32)  # f / gamma up to 1e4
  value = kl_dro_value(huge, 1.0)
  assert np.isfinite(float(value)) and abs(float(value) - (1e4 - np.log(3))) < 1e-1
  assert np.all(np.isfinite(np.asarray(kl_dro_weights(huge, 1.0))))
  prior = np.array([500.0, 20.0, 20.0])  # a data-size prior: r_k ~ p_k exp(l_k / gamma)
  tilted = prior * np.exp(np.asarray(losses) / gamma)
  np.testing.assert_allclose(
    np.asarray(kl_dro_weights(losses, gamma, prior)), tilted / tilted.sum(), rtol=1e-6
  )
  assert np.all(np.isfinite(np.asarray(kl_dro_weights(huge, 1.0, prior))))


def test_client_kl_dro_step_is_exp_weighted_gradient():
  """ComFedL's u = exp(l_B/gamma)/gamma * grad l_B for the deterministic exp outer."""
  loss = lambda x, e: 0.5 * jnp.sum((x - e["t"]) ** 2)
  problem = client_kl_dro(loss, 0.7)
  batch = {"t": jnp.array([[1.0, 2.0], [0.0, -1.0]])}
  x = jnp.array([0.3, 0.4])
  _, kw = fedco.oracle_args(problem, batch, batch)
  _, z = estimators.value_and_compositional_grad(kw["inner_fn"], kw["outer_fn"], x)
  l_b = 0.5 * jnp.mean(jnp.sum((x - batch["t"]) ** 2, -1))
  expected = jnp.exp(l_b / 0.7) / 0.7 * (x - batch["t"].mean(0))
  np.testing.assert_allclose(np.asarray(z), np.asarray(expected), rtol=1e-5)
  with pytest.raises(ValueError, match="gamma"):
    client_kl_dro(loss, -1.0)
