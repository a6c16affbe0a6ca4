"""Shared optax-style contract tests over a registry of every fedco algorithm.

Each algorithm is used the way a user would in their own (centralised, one-client) loop:
``init``/``update`` with keyword-only oracle arguments, then ``optax.apply_updates``.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.problems import portfolio, portfolio_stationary_point
from tests import helpers

# name -> (factory, kwargs for the portfolio problem)
REGISTRY = {
    "comfedl": lambda: fedco.comfedl(0.1, 5),
    "local_scgd": lambda: fedco.local_scgd(0.1, 0.9, 5),
    "local_scgdm": lambda: fedco.local_scgdm(1.0, 0.1, 0.8, 0.7, 5),
    "fedavg": lambda: fedco.fedavg(0.1, 5),
    "fedavg_co_I": lambda: fedco.fedavg_co(0.1, 5, case="I"),
    "fedavg_co_II": lambda: fedco.fedavg_co(0.1, 5, case="II"),
    "fedavg_co_modified": lambda: fedco.fedavg_co(0.1, 5, case="modified"),
    "mbsgd": lambda: fedco.mbsgd(0.1),
    "feddro": lambda: fedco.feddro(0.1, 0.5, 5),
    "ds_feddro": lambda: fedco.ds_feddro(0.1, 0.5, 5),
    "qfedavg": lambda: fedco.qfedavg(0.1, 5, q=0.2),
    "drfa": lambda: fedco.drfa(0.1, 5),
    "afl": lambda: fedco.afl(0.1),
    "gcivr": lambda: fedco.gcivr(0.1, refresh_every=5),
    # the portfolio's inner is not shaped like the parameters: MOML's full J_g^T direction
    "local_moml": lambda: fedco.local_moml(0.1, 0.7, 5, first_order=False),
    # sample reweighting on the one-"example" loss [Phi(x)]: p* = [1], i.e. GD on Phi
    "fastdro": lambda: fedco.fastdro(0.1, geometry="cvar", size=0.5),
    "primal_dual_dro": lambda: fedco.primal_dual_dro(0.1, 1, weights_lr=0.1),
    "per_fedavg": lambda: fedco.per_fedavg(0.1, 5),
    "fedmaml": lambda: fedco.fedmaml(0.1, 5),
    "tr_maml": lambda: fedco.tr_maml(0.1, 0.08, 5),
    "ditto": lambda: fedco.ditto(0.1, 0.1, 5),
}

assert set(REGISTRY) >= {"comfedl", "fedavg"} and len(REGISTRY) == 21


@pytest.fixture(scope="module")
def setup():
  returns = helpers.portfolio_clients(sizes=(64,), seed=3)[0]
  problem = portfolio(1.0)
  examples = {"r": jnp.asarray(returns)}
  x_star = portfolio_stationary_point([returns], 1.0)
  return problem, examples, x_star


def _step_fn(opt, problem, examples):
  grad_h_fn, kwargs = helpers.full_batch_args(problem, examples)
  phi = lambda x: problem.outer_value(problem.inner_value(
      x, examples, jnp.full((examples["r"].shape[0],), 1.0 / examples["r"].shape[0])), None, None)

  def step(params, state, **extra):
    for field in opt.plan.round_start:  # the caller plays the server (MBSGD's y_bar)
      state = state._replace(**{field: kwargs["inner_fn"](params)})
    grads = None
    if opt.problem_kind == "plain":  # the plain oracles, on the single loss Phi
      grads = jax.grad(phi)(params)
      extra = {"extra_fn": phi, "example_losses_fn": lambda x: phi(x)[None],
               "example_weights": jnp.ones(1), "example_rows": jnp.zeros(1, jnp.int32),
               **extra}
    extra.setdefault("round_key", jax.random.PRNGKey(0))  # DRFA's shared round key
    updates, state = opt.update(grads, state, params, **kwargs, **extra)
    return optax.apply_updates(params, updates), state

  return step


def _init(opt, problem, examples, params):
  _, kwargs = helpers.full_batch_args(problem, examples)
  return opt.init(params, inner_value=kwargs["inner_fn"](params))


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_converges_on_portfolio(name, setup):
  problem, examples, x_star = setup
  opt = REGISTRY[name]()
  params = jnp.zeros(3)
  state = _init(opt, problem, examples, params)
  step = jax.jit(_step_fn(opt, problem, examples))
  for _ in range(600):
    params, state = step(params, state)
  np.testing.assert_allclose(np.asarray(params), x_star, atol=2e-3)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_ignores_unknown_extra_args(name, setup):
  problem, examples, _ = setup
  opt = REGISTRY[name]()
  params = jnp.full((3,), 0.1)
  state = _init(opt, problem, examples, params)
  step = _step_fn(opt, problem, examples)
  a, _ = step(params, state)
  b, _ = step(params, state, some_unknown_argument=jnp.ones(7))
  chex.assert_trees_all_close(a, b)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_does_not_recompile_and_keeps_dtypes(name, setup):
  chex.clear_trace_counter()
  problem, examples, _ = setup
  opt = REGISTRY[name]()
  params = jnp.full((3,), 0.1, jnp.float32)
  state = _init(opt, problem, examples, params)
  step = jax.jit(chex.assert_max_traces(_step_fn(opt, problem, examples), n=1))
  p1, s1 = step(params, state)
  p2, s2 = step(p1, s1)
  p3, _ = step(p2, s2)
  chex.assert_trees_all_equal_dtypes(p3, params)
  chex.assert_trees_all_equal_dtypes(s2, state)
  chex.assert_trees_all_equal_shapes(s2, state)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_jit_and_no_jit_agree(name, setup):
  problem, examples, _ = setup
  opt = REGISTRY[name]()
  params = jnp.full((3,), 0.1)
  state = _init(opt, problem, examples, params)
  step = _step_fn(opt, problem, examples)
  jstep = jax.jit(step)
  p, s, jp, js = params, state, params, state
  for _ in range(3):
    p, s = step(p, s)
    jp, js = jstep(jp, js)
  chex.assert_trees_all_close(p, jp, rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(s, js, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["comfedl", "local_scgd", "fedavg", "feddro", "ds_feddro",
                                  "fedavg_co_II"])
def test_accepts_an_optax_parameter_step(name, setup):
  """``optimizer=optax.adam(...)`` replaces the paper's SGD step and still converges."""
  problem, examples, x_star = setup
  factories = {
      "comfedl": lambda o: fedco.comfedl(optimizer=o),
      "local_scgd": lambda o: fedco.local_scgd(gamma=0.9, optimizer=o),
      "fedavg": lambda o: fedco.fedavg(optimizer=o),
      "feddro": lambda o: fedco.feddro(beta=0.5, optimizer=o),
      "ds_feddro": lambda o: fedco.ds_feddro(beta=0.5, optimizer=o),
      "fedavg_co_II": lambda o: fedco.fedavg_co(case="II", optimizer=o),
  }
  opt = factories[name](optax.adam(0.02))
  params = jnp.zeros(3)
  state = _init(opt, problem, examples, params)
  step = jax.jit(_step_fn(opt, problem, examples))
  for _ in range(1500):
    params, state = step(params, state)
  np.testing.assert_allclose(np.asarray(params), x_star, atol=1e-2)


def test_local_scgdm_agrees_under_inject_hyperparams(setup):
  """The default parameter step equals an injected ``sgd(beta*eta)`` optimizer."""
  problem, examples, _ = setup
  plain_opt = fedco.local_scgdm(1.0, 0.1, 0.8, 0.7, 5)
  injected = fedco.local_scgdm(1.0, 0.1, 0.8, 0.7, 5,
                               optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1))
  params = jnp.full((3,), 0.1)
  results = []
  for opt in (plain_opt, injected):
    state = _init(opt, problem, examples, params)
    p = params
    step = jax.jit(_step_fn(opt, problem, examples))
    for _ in range(5):
      p, state = step(p, state)
    results.append(p)
  chex.assert_trees_all_close(results[0], results[1], rtol=1e-6)


def test_missing_oracle_is_a_clear_error(setup):
  problem, examples, _ = setup
  opt = fedco.feddro(0.1, 0.5, 5)
  params = jnp.zeros(3)
  state = _init(opt, problem, examples, params)
  with pytest.raises(ValueError, match="inner_fn"):
    opt.update(None, state, params, outer_fn=lambda y: y.sum())
  with pytest.raises(ValueError, match="inner_value"):
    opt.init(params)
