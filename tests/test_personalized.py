"""Personalized (one task per client) MAML and DA-MAML, and the problem's outer link."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.models import MLP, cross_entropy
from fedco.problems import personalized

A = 0.3


def setup(seed=0, n=6):
  model = MLP(hidden=(5, 4), out=3, activation=jnp.tanh)
  params = model.init(jax.random.PRNGKey(seed), jnp.zeros(2))
  rng = np.random.default_rng(seed)
  support = {
    "x": jnp.asarray(rng.normal(size=(n, 2)), jnp.float32),
    "y": jnp.asarray(rng.integers(0, 3, n), jnp.int32),
  }
  query = {
    "x": jnp.asarray(rng.normal(size=(n, 2)), jnp.float32),
    "y": jnp.asarray(rng.integers(0, 3, n), jnp.int32),
  }
  return model, params, support, query


def batch_loss(model, params, batch):
  return jnp.mean(
    jax.vmap(lambda x, y: cross_entropy(model.apply(params, x), y))(batch["x"], batch["y"])
  )


def direct(model, params, support, query):
  grads = jax.grad(lambda p: batch_loss(model, p, support))(params)
  adapted = jax.tree.map(lambda p, g: p - A * g, params, grads)
  return batch_loss(model, adapted, query)


def composed(problem, params, support, query):
  _, kwargs = fedco.oracle_args(problem, support, query)
  z = fedco.estimators.compositional_grad(
    fedco.estimators.inner_vjp(kwargs["inner_fn"], params)[1],
    kwargs["outer_fn"],
    kwargs["inner_fn"](params),
  )
  return z, kwargs


def test_compositional_gradient_is_exact_maml_gradient():
  """J_g^T grad f = v - a H v: the gradient of L(w - a grad L(w; B); B~), Hessian included."""
  model, params, support, query = setup()
  problem = personalized.personalized_maml(model.apply, A, cross_entropy)
  z, kwargs = composed(problem, params, support, query)
  ref = jax.grad(lambda p: direct(model, p, support, query))(params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), z, ref)
  np.testing.assert_allclose(
    kwargs["outer_fn"](kwargs["inner_fn"](params)), direct(model, params, support, query), rtol=1e-6
  )
  # first order drops exactly the Hessian term
  fo = personalized.personalized_maml(model.apply, A, cross_entropy, first_order=True)
  z_fo, kw = composed(fo, params, support, query)
  ref_fo = jax.grad(lambda y: batch_loss(model, y, query))(kw["inner_fn"](params))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), z_fo, ref_fo)
  diff = max(
    float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(z_fo), jax.tree.leaves(z))
  )
  assert diff > 1e-4


@pytest.mark.parametrize("gamma, shift", [(0.5, 0.0), (0.2, 1.0)])
def test_da_maml_applies_exp_to_the_mean_query_loss(gamma, shift):
  model, params, support, query = setup(1)
  problem = personalized.personalized_maml(model.apply, A, cross_entropy, gamma=gamma, shift=shift)
  z, kwargs = composed(problem, params, support, query)
  value = lambda p: jnp.exp((direct(model, p, support, query) - shift) / gamma)
  np.testing.assert_allclose(
    kwargs["outer_fn"](kwargs["inner_fn"](params)), value(params), rtol=1e-5
  )
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), z, jax.grad(value)(params)
  )


def test_evaluate_links_each_clients_mean_loss():
  """Client losses are exp(L_k(adapted_k)/gamma) with the link on the client's own mean."""
  model, params, support, query = setup(2, n=5)
  gamma = 0.7
  problem = personalized.personalized_maml(model.apply, A, cross_entropy, gamma=gamma)
  data = fedco.FederatedData.from_clients([support, query])
  obj, losses = problem.evaluate(
    params,
    jax.tree.map(lambda a: a[data.flat_rows], data.examples),
    data.flat_owner,
    data.flat_weights(),
    2,
  )
  ref = [jnp.exp(direct(model, params, b, b) / gamma) for b in (support, query)]
  np.testing.assert_allclose(losses, ref, rtol=1e-5)
  np.testing.assert_allclose(obj, np.mean(ref), rtol=1e-5)


def test_adapt_is_one_gradient_step():
  model, params, support, _ = setup(3)
  w = jnp.full((support["y"].shape[0],), 1.0 / support["y"].shape[0])
  adapted = personalized.adapt(model.apply, cross_entropy, params, support, w, A)
  grads = jax.grad(lambda p: batch_loss(model, p, support))(params)
  ref = jax.tree.map(lambda p, g: p - A * g, params, grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), adapted, ref)


def test_bad_arguments():
  model, *_ = setup()
  with pytest.raises(ValueError, match="inner_lr"):
    personalized.personalized_maml(model.apply, -1.0, cross_entropy)
  with pytest.raises(ValueError, match="gamma"):
    personalized.personalized_maml(model.apply, 0.1, cross_entropy, gamma=0.0)
  with pytest.raises(ValueError, match="loss"):
    personalized.personalized_maml(model.apply, 0.1, None)
  with pytest.raises(ValueError, match="outer_link"):
    fedco.Problem(None, None, lambda p, e: 0.0, outer_link=jnp.exp)


def test_normalised_comfedl_on_da_maml_steps_on_the_query_loss_inside_the_link():
  """One round, whole-data batches, 3 clients: the server model equals the mean of each
  client's steps ``x - eta exp(F_k(x)/gamma - L) grad F_k(x)``, where ``F_k`` is the MAML
  loss (query loss of the adapted model, inside DA-MAML's link) and ``L`` is
  ``log(1/3 sum_k exp(F_k(x_bar)/gamma))`` from the clients' reports at the server model."""
  model, params, _, _ = setup()
  rng = np.random.default_rng(3)
  clients = [
    {"x": rng.normal(size=(n, 2)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int32)}
    for n in (4, 6, 5)
  ]
  gamma, eta, steps = 0.5, 0.2, 2
  problem = personalized.personalized_maml(model.apply, A, cross_entropy, gamma=gamma, shift=1.0)
  alg = fedco.comfedl(eta, steps, normalized=True, gamma=gamma)
  result = fedco.simulate(
    problem,
    alg,
    fedco.FederatedData.from_clients(clients),
    params,
    rounds=1,
    batch_size=None,
    evaluate=False,
  )
  batches = [{k: jnp.asarray(v) for k, v in c.items()} for c in clients]
  loss = lambda p, b: direct(model, p, b, b)  # whole data: support = query
  log_z = jax.nn.logsumexp(
    jnp.array([loss(params, b) for b in batches]) / gamma, b=jnp.full(3, 1 / 3)
  )
  finals = []
  for b in batches:
    x = params
    for _ in range(steps):
      value, grad = jax.value_and_grad(loss)(x, b)
      weight = jnp.exp(value / gamma - log_z)
      x = jax.tree.map(lambda p, g, weight=weight: p - eta * weight * g, x, grad)
    finals.append(x)
  expected = jax.tree.map(lambda *xs: sum(xs) / 3, *finals)
  moved = max(
    float(jnp.max(jnp.abs(a - b)))
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(params))
  )
  assert moved > 1e-3
  for got, want in zip(jax.tree.leaves(result.params), jax.tree.leaves(expected)):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-6)
  np.testing.assert_allclose(result.state.clients.log_normalizer[0], log_z, rtol=1e-5)
