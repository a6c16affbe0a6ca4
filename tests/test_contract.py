"""Optax contract tests over every algorithm of ``fedco.ALGORITHMS``.

The checks a user's algorithm gets too (fixed state dtypes, one trace, jit = no jit,
inactive clips in chains, injected hyperparameters, simulate = a per-client loop) run
through ``fedco.testing.check_algorithm`` in ``tests/test_kit_registry.py``; these are the
rest.

Each algorithm is used the way a user would in their own (centralised, one-client) loop:
``init``/``update`` with keyword-only oracle arguments, then ``optax.apply_updates``; then
composed with optax (``optax.chain``, ``fedco.chain``, ``inject_hyperparams``) in that loop
and in ``fedco.simulate``. Settings per registry entry live in ``tests/registry.py``.
"""

import functools
import inspect

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco.algorithms import set_fields
from fedco.problems import portfolio, portfolio_stationary_point
from tests import helpers, registry

LABELS = sorted(registry.CASES)


def test_every_registry_algorithm_has_test_settings():
  assert set(registry.SETTINGS) == set(fedco.ALGORITHMS)
  for name, factory in fedco.ALGORITHMS.items():
    assert isinstance(factory(**registry.kwargs(registry.SETTINGS[name][0][0])), fedco.Algorithm), (
      name
    )


@functools.lru_cache(maxsize=None)
def _setup():
  returns = helpers.portfolio_clients(sizes=(64,), seed=3)[0]
  problem = portfolio(1.0)
  examples = {"r": jnp.asarray(returns)}
  x_star = portfolio_stationary_point([returns], 1.0)
  return problem, examples, x_star


@pytest.fixture(scope="module")
def setup():
  return _setup()


def _oracles(problem, examples):
  """Full-batch oracles: the compositional ones, and the plain ones on the single loss Phi."""
  _, kwargs = helpers.full_batch_args(problem, examples)
  phi = lambda x: problem.outer_value(
    problem.inner_value(
      x, examples, jnp.full((examples["r"].shape[0],), 1.0 / examples["r"].shape[0])
    ),
    None,
    None,
  )
  plain = {
    "extra_fn": phi,
    "example_losses_fn": lambda x: phi(x)[None],
    "example_weights": jnp.ones(1),
    "example_rows": jnp.zeros(1, jnp.int32),
  }
  return kwargs, phi, plain


def _step_fn(opt, problem, examples, algorithm=None):
  """One user-loop step; ``algorithm`` is the fedco algorithm inside ``opt`` (a chain)."""
  algorithm = opt if algorithm is None else algorithm
  kwargs, phi, plain = _oracles(problem, examples)

  def step(params, state, **extra):
    for field in algorithm.plan.round_start:  # the caller plays the server (MBSGD's y_bar)
      state = set_fields(state, **{field: kwargs["inner_fn"](params)})
    grads = None
    if algorithm.problem_kind == "plain":
      grads = jax.grad(phi)(params)
      extra = {**plain, **extra}
    extra.setdefault("round_key", jax.random.PRNGKey(0))  # DRFA's shared round key
    updates, state = opt.update(grads, state, params, **kwargs, **extra)
    return optax.apply_updates(params, updates), state

  return step


def _init(opt, problem, examples, params):
  """``init`` with the trackers filled from the full-batch inner value (a scan-ready state)."""
  kwargs, _, _ = _oracles(problem, examples)
  return fedco.init_trackers(opt.init(params), params, kwargs["inner_fn"](params))


def _run(opt, steps, params=None, algorithm=None, jit=True, state=None):
  problem, examples, _ = _setup()
  params = jnp.full((3,), 0.1, jnp.float32) if params is None else params
  state = _init(opt, problem, examples, params) if state is None else state
  step = _step_fn(opt, problem, examples, algorithm)
  step = jax.jit(step) if jit else step
  for _ in range(steps):
    params, state = step(params, state)
  return params, state


@pytest.mark.parametrize("label", LABELS)
def test_converges_on_portfolio(label, setup):
  _, _, x_star = setup
  algorithm = registry.build(label)
  params, state = _run(algorithm, 600, params=jnp.zeros(3))
  model = registry.model_of(algorithm, params, state)
  np.testing.assert_allclose(np.asarray(model), x_star, atol=2e-3)


@pytest.mark.parametrize("label", LABELS)
def test_ignores_unknown_extra_args(label, setup):
  problem, examples, _ = setup
  opt = registry.build(label)
  params = jnp.full((3,), 0.1, jnp.float32)
  state = _init(opt, problem, examples, params)
  step = _step_fn(opt, problem, examples)
  a, _ = step(params, state)
  b, _ = step(params, state, some_unknown_argument=jnp.ones(7))
  chex.assert_trees_all_close(a, b)


@pytest.mark.parametrize("label", LABELS)
def test_init_without_inner_value_fills_trackers_on_first_update(label, setup):
  """``init(params)`` (optax's signature) works for every algorithm; the first update fills
  the trackers from its own sample, which here (full batch) is the inner value itself."""
  problem, examples, _ = setup
  opt = registry.build(label)
  params = jnp.full((3,), 0.1, jnp.float32)
  bare = opt.init(params)
  filled = _init(opt, problem, examples, params)
  p_bare, s_bare = _run(opt, 3, state=bare)
  p_filled, s_filled = _run(opt, 3, state=filled)
  assert not fedco.algorithms.base.has_pending(s_bare)
  chex.assert_trees_all_close(p_bare, p_filled, rtol=1e-6, atol=1e-7)
  chex.assert_trees_all_close(s_bare, s_filled, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("label", LABELS)
def test_chain_with_active_clip_bounds_every_step(label, setup):
  alg = registry.build(label)
  problem, examples, _ = setup
  chained = fedco.chain(alg, optax.clip_by_global_norm(1e-3))
  params = jnp.full((3,), 0.1, jnp.float32)
  state = _init(chained, problem, examples, params)
  step = jax.jit(_step_fn(chained, problem, examples, alg))
  for _ in range(3):
    new, state = step(params, state)
    assert float(jnp.linalg.norm(new - params)) <= 1e-3 * (1 + 1e-5)
    params = new
  assert float(jnp.linalg.norm(params - 0.1)) > 0  # it still moves


def test_fedco_chain_keeps_the_plan_and_needs_one_algorithm():
  alg = fedco.feddro(0.1, 5, beta=0.5)
  chained = fedco.chain(optax.clip_by_global_norm(1.0), alg)
  assert isinstance(chained, fedco.Algorithm)
  assert isinstance(chained, optax.GradientTransformationExtraArgs)
  assert (chained.plan, chained.server, chained.name, chained.problem_kind) == (
    alg.plan,
    alg.server,
    alg.name,
    alg.problem_kind,
  )
  with pytest.raises(ValueError, match="exactly one fedco algorithm"):
    fedco.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))
  with pytest.raises(ValueError, match="exactly one fedco algorithm"):
    fedco.chain(alg, fedco.comfedl(0.1))


def test_simulate_refuses_a_plain_optax_chain_with_a_hint():
  problem = portfolio(1.0)
  data = fedco.FederatedData.from_clients(
    [{"r": r} for r in helpers.portfolio_clients(sizes=(8, 8))]
  )
  with pytest.raises(ValueError, match="fedco.chain"):
    fedco.simulate(
      problem,
      optax.chain(registry.inactive_clip(), fedco.feddro(0.1)),
      data,
      jnp.zeros(3),
      rounds=1,
    )


# ---- injectable hyperparameters ----------------------------------------------------------


def test_inject_hyperparams_takes_schedules_and_server_rates():
  problem, examples, _ = _setup()
  schedule = optax.exponential_decay(0.2, transition_steps=1, decay_rate=0.5)
  injected = fedco.inject_hyperparams(fedco.ds_feddro)(
    schedule, 5, beta=0.5, server_lr_x=1.3, server_lr_y=1.4
  )
  params = jnp.full((3,), 0.1, jnp.float32)
  state = _init(injected, problem, examples, params)
  step = jax.jit(_step_fn(injected, problem, examples))
  p1, state = step(params, state)
  p2, state = step(p1, state)
  first, s1 = _run(fedco.ds_feddro(0.2, 5, beta=0.5), 1)
  chex.assert_trees_all_close(p1, first, rtol=1e-6)
  second, _ = _run(fedco.ds_feddro(0.1, 5, beta=0.5), 1, params=first, state=s1)
  chex.assert_trees_all_close(p2, second, rtol=1e-6)  # the schedule's 0.2 * 0.5
  # the server's rates are server state: a changed gamma_x changes the aggregate
  server = injected.server
  values = {"params": params, "y": jnp.zeros(2)}
  s0 = server.init(values, jnp.ones(2, jnp.int32))
  assert set(s0.hyperparams) >= {"server_lr_x", "server_lr_y", "beta"}
  info = fedco.algorithms.RoundInfo(
    jnp.arange(2), jnp.full(2, 0.5), jnp.ones(2, jnp.int32), 2, jax.random.PRNGKey(0), None
  )
  clients = {"params": jnp.stack([params + 1.0, params + 1.0]), "y": jnp.ones((2, 2))}
  update = jax.jit(chex.assert_max_traces(server.update, n=1))
  chex.clear_trace_counter()
  new, _ = update(values, s0, clients, info)
  np.testing.assert_allclose(new["params"], params + 1.3, rtol=1e-6)
  s0.hyperparams["server_lr_x"] = jnp.asarray(1.0, jnp.float32)
  new, _ = update(values, s0, clients, info)
  np.testing.assert_allclose(new["params"], params + 1.0, rtol=1e-6)


def test_readme_style_chain_with_schedule_converges():
  problem, examples, x_star = _setup()
  schedule = optax.cosine_decay_schedule(0.1, 600)
  opt = fedco.chain(
    optax.clip_by_global_norm(1.0), fedco.inject_hyperparams(fedco.feddro)(schedule, 5, beta=0.5)
  )
  params, _ = _run(opt, 600, params=jnp.zeros(3), algorithm=fedco.feddro(0.1))
  np.testing.assert_allclose(np.asarray(params), x_star, atol=5e-3)


# ---- the parameter step ------------------------------------------------------------------


@pytest.mark.parametrize(
  "label", ["comfedl", "local_scgd", "fedavg", "feddro", "ds_feddro", "fedavg_co_II"]
)
def test_accepts_an_optax_parameter_step(label, setup):
  """``optimizer=optax.adam(...)`` replaces the paper's SGD step and still converges; a
  factory ``optimizer=optax.adam`` is fed ``learning_rate`` and gives the same steps."""
  _, _, x_star = setup
  kw = registry.kwargs(label)
  del kw["learning_rate"]
  instance = registry.factory(label)(**kw, optimizer=optax.adam(0.02))
  fed = registry.factory(label)(0.02, **kw, optimizer=optax.adam)
  params, _ = _run(instance, 1500, params=jnp.zeros(3))
  np.testing.assert_allclose(np.asarray(params), x_star, atol=1e-2)
  a, _ = _run(instance, 5)
  b, _ = _run(fed, 5)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


@pytest.mark.parametrize("name", sorted(fedco.ALGORITHMS))
def test_learning_rate_and_an_optimizer_instance_is_an_error(name):
  factory = fedco.ALGORITHMS[name]
  kw = registry.kwargs(registry.SETTINGS[name][0][0])
  if name in ("local_scgdm", "qfedavg"):  # their learning rate also sets other rates
    alg = factory(**kw, optimizer=optax.sgd(0.1))
    assert isinstance(alg, fedco.Algorithm)
    return
  with pytest.raises(ValueError, match=r"^pass learning_rate or optimizer, not both"):
    factory(**kw, optimizer=optax.adam(1e-2))


@pytest.mark.parametrize("name", sorted(fedco.ALGORITHMS))
def test_signature_convention(name):
  """``learning_rate`` first, ``local_steps`` second where there are local steps, the rest
  keyword-only, ``optimizer=`` on every algorithm, type hints, one name per concept."""
  parameters = list(inspect.signature(fedco.ALGORITHMS[name]).parameters.values())
  assert parameters[0].name == "learning_rate"
  positional = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]
  assert positional in (["learning_rate"], ["learning_rate", "local_steps"]), positional
  names = {p.name for p in parameters}
  assert "optimizer" in names
  assert not names & {"weight_lr", "tau", "lr", "eta"}
  assert all(p.annotation is not inspect.Parameter.empty for p in parameters), name
  assert set(fedco.ALGORITHMS[name].static_args) <= names


def test_local_scgdm_agrees_under_injected_optimizer(setup):
  """The default parameter step equals an injected ``sgd(beta*eta)`` optimizer."""
  plain_opt = fedco.local_scgdm(1.0, 5, beta=0.1, alpha=0.8, gamma=0.7)
  injected = fedco.local_scgdm(
    1.0,
    5,
    beta=0.1,
    alpha=0.8,
    gamma=0.7,
    optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1),
  )
  a, _ = _run(plain_opt, 5)
  b, _ = _run(injected, 5)
  chex.assert_trees_all_close(a, b, rtol=1e-6)


def test_missing_oracle_is_a_clear_error(setup):
  problem, examples, _ = setup
  opt = fedco.feddro(0.1, 5, beta=0.5)
  params = jnp.zeros(3)
  state = _init(opt, problem, examples, params)
  with pytest.raises(ValueError, match="inner_fn"):
    opt.update(None, state, params, outer_fn=lambda y: y.sum())
  with pytest.raises(ValueError, match="inner_value"):
    fedco.init_trackers(opt.init(params), params, None)
