"""``fedco.testing``: an algorithm written outside the package passes the contract kit and
runs in ``simulate``, ``sweep`` and on an 8-device mesh; deliberately broken variants fail
it with a message naming what broke; the float64 helper serves a NumPy transcription."""

import json
import os
import re
import sys
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
import fedco.testing
from tests import helpers
from tests.user_algorithm import shared_momentum

CHEAP = ("builds", "state", "jit", "chain", "inject")


def test_a_user_algorithm_passes_every_check_on_eight_devices():
  """Every check, the mesh one on 8 devices, in a process of its own (the flag must come
  before jax's import): simulate against the per-client loop, sweep, resume, mesh."""
  env = {
    **os.environ,
    "PYTHONPATH": str(helpers.ROOT),
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": helpers.xla_flags(8),
  }
  out = helpers.run(
    [sys.executable, str(helpers.ROOT / "tests" / "user_algorithm.py")],
    env=env,
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert report.pop("devices") == 8
  # its shared momentum buffer is a state field it sends: asynchrony refuses it
  skipped = report.pop("asynchronous")
  assert skipped.startswith("skipped: asynchronous= does not support"), skipped
  assert "whose clients also send or receive the state fields" in skipped, skipped
  assert report == {c: "passed" for c in fedco.testing.CHECKS if c != "asynchronous"}, report
  assert "shared_momentum" not in fedco.ALGORITHMS


@pytest.mark.parametrize(
  "broken,check,named",
  [
    (dict(momentum_dtype=jnp.bfloat16), "state", r"state\.m changed from bfloat16"),
    (
      dict(plan_field="momentum"),
      "builds",
      r"the plan names field 'momentum', which the "
      r"state does not have",
    ),
    (
      dict(server=optax.set_to_zero()),
      "server",
      "after a round the server model equals the round's start: the server ignores",
    ),
  ],
)
def test_a_broken_variant_fails_naming_what_broke(broken, check, named):
  kwargs = dict(learning_rate=0.1, local_steps=3, beta=0.5)
  with pytest.raises(
    fedco.testing.ContractError, match=rf"check_algorithm\(shared_momentum\): {check}: {named}"
  ):
    fedco.testing.check_algorithm(shared_momentum, checks=(check,), **kwargs, **broken)


def test_the_cheap_checks_and_the_report():
  report = fedco.testing.check_algorithm(
    shared_momentum, checks=CHEAP + ("mesh",), learning_rate=0.1, local_steps=3
  )
  assert list(report) == list(CHEAP) + ["mesh"]
  assert all(report[c] == "passed" for c in CHEAP)
  assert report["mesh"].startswith("skipped: one device")
  with pytest.raises(ValueError, match=r"checks: \['speed'\] are not checks; allowed"):
    fedco.testing.check_algorithm(shared_momentum, checks=("speed",))


def test_loop_reference_is_independent_of_the_runtime():
  """The loop follows the plan: a server that doubles the mean update is seen there too."""
  data = fedco.testing.default_data()
  problem = fedco.testing.default_problem("plain")
  alg = shared_momentum(0.1, 3).replace(server=optax.sgd(2.0))
  loop = fedco.testing.loop_reference(problem, alg, data, jnp.zeros(3), rounds=2)
  run = fedco.simulate(problem, alg, data, jnp.zeros(3), rounds=2, batch_size=None, evaluate=False)
  np.testing.assert_allclose(run.state.server["m"], loop["m"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(run.params, loop["params"], rtol=1e-5, atol=1e-6)
  plain = fedco.testing.loop_reference(
    problem, shared_momentum(0.1, 3), data, jnp.zeros(3), rounds=2
  )
  assert np.max(np.abs(np.asarray(plain["params"]) - np.asarray(loop["params"]))) > 1e-3


def test_run_float64_serves_a_numpy_transcription():
  """FedAvg on 0.5 ||x - r||^2 in float64, partial participation: x moves to each sampled
  client's mean geometrically; NumPy follows the same clients round by round."""
  rng = np.random.default_rng(0)
  clients = [{"r": rng.normal(k, 1.0, size=(n, 2))} for k, n in enumerate((3, 5, 4, 6))]
  problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2))
  lr, steps = 0.3, 2
  out = fedco.testing.run_float64(
    problem,
    fedco.fedavg(lr, steps, weighting="uniform"),
    clients,
    np.zeros(2),
    rounds=4,
    clients_per_round=2,
  )
  x = np.zeros(2)
  for r, ids in enumerate(out["clients"]):
    models = []
    for k in ids:
      y = x.copy()
      for _ in range(steps):
        y = y - lr * (y - clients[k]["r"].mean(0))
      models.append(y)
    x = np.mean(models, axis=0)
    np.testing.assert_allclose(out["trajectory"][r], x, rtol=1e-12)
  assert out["params"].dtype == np.float64 and len(out["clients"][0]) == 2
  np.testing.assert_allclose(out["params"], x, rtol=1e-12)


def test_a_user_algorithm_gets_compression_and_privacy_of_its_own_fields():
  """Its every_round field ``m`` is a sent field like a built-in's ``y``: codecs, clip
  bounds, bytes and epsilon apply to it with no extra code."""
  data = fedco.testing.default_data(sizes=(12, 5, 20, 9, 14, 7))
  problem = fedco.testing.default_problem("plain")
  alg = shared_momentum(0.1, 3)
  plain_run = fedco.simulate(problem, alg, data, jnp.zeros(3), rounds=4, batch_size=4)
  squeezed = fedco.simulate(
    problem,
    alg,
    data,
    jnp.zeros(3),
    rounds=4,
    batch_size=4,
    compression={"m": fedco.compression.stochastic_quantization(4)},
  )
  up = squeezed.ledger["bytes_up_per_client_per_round"]
  assert up["m"] < plain_run.ledger["bytes_up_per_client_per_round"]["m"]
  assert np.all(np.isfinite(squeezed.metrics["objective"]))
  private = fedco.simulate(
    problem,
    alg,
    data,
    jnp.zeros(3),
    rounds=4,
    batch_size=4,
    clients_per_round=3,
    privacy=fedco.privacy.gaussian(1.0, noise_multiplier=1.0),
  )
  assert set(private.ledger["uplink"]["clip"]) == {"params", "m"}
  assert private.metrics["epsilon"][-1] > 0


@pytest.mark.parametrize(
  "annotation", ["int", "Optional[int]", "int | None", "extend.Optimizer", "Optional[Optimizer]"]
)
def test_factory_refuses_a_structural_argument_left_out_of_static(annotation):
  # however the int or the optimizer is written (postponed annotations are strings)
  def make(learning_rate: float = 0.1, local_steps: int = 2, *, inner=None):
    return None

  make.__annotations__["inner"] = annotation
  with pytest.raises(ValueError, match=r"leaves out \['inner'\]"):
    fedco.extend.factory(static=("local_steps",))(make)
  fedco.extend.factory(static=("local_steps", "inner"))(make)


def test_factory_refuses_an_unannotated_int_default_left_out_of_static():
  # injected, restart_every=2 would become a traced number (a raw JAX error at its first
  # Python use); a float default or a bool stays a hyperparameter
  def make(learning_rate: float = 0.1, local_steps: int = 2, *, restart_every=2, lam=1.0):
    return None

  with pytest.raises(ValueError, match=r"leaves out \['restart_every'\].*unannotated"):
    fedco.extend.factory(static=("local_steps",))(make)
  fedco.extend.factory(static=("local_steps", "restart_every"))(make)


def test_a_pending_tracker_is_filled_with_its_own_fill_on_every_path():
  # init(inner_value=...), the runtime's init_trackers and update's fill_pending agree
  params, value = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])
  half = lambda v: v / 2
  direct = fedco.extend.pending_or(value, half)
  state = {"u": fedco.extend.pending_or(None, half), "y": fedco.extend.pending_or(None, None)}
  via_runtime = fedco.init_trackers(state, params, value)
  via_update = fedco.extend.fill_pending(state, params, lambda x: x + 2.0)
  for filled in (via_runtime, via_update):
    np.testing.assert_array_equal(filled["u"], direct)
    np.testing.assert_array_equal(filled["y"], value)
  # each init call makes a fresh lambda: the states of two calls still have one structure
  first, second = (fedco.extend.pending_or(None, lambda v: v) for _ in range(2))
  assert jax.tree.structure(first) == jax.tree.structure(second)
  assert jax.tree.structure(first) != jax.tree.structure(fedco.extend.pending_or(None, half))
  # ... but fills that capture other values are other structures: a jitted fill of one is
  # never reused for the other
  scaled = lambda s: {"u": fedco.extend.pending_or(None, lambda v: v * s)}
  assert jax.tree.structure(scaled(1.0)) == jax.tree.structure(scaled(1.0))
  fill = jax.jit(lambda state, v: fedco.init_trackers(state, v, v))
  np.testing.assert_array_equal(fill(scaled(1.0), value)["u"], value)
  np.testing.assert_array_equal(fill(scaled(2.0), value)["u"], 2 * value)
  with pytest.raises(ValueError, match="captures a traced value"):
    jax.jit(lambda s: fedco.extend.pending_or(None, lambda v: v * s))(1.0)


class _AdamState(NamedTuple):
  count: jax.Array
  mu: optax.Params  # the same name as the mean inside optax.adam's state
  opt_state: optax.OptState


@fedco.extend.factory(static=("local_steps", "optimizer"))
def _clashing(
  learning_rate: Optional[float] = None,
  local_steps: int = 2,
  *,
  optimizer: fedco.extend.Optimizer = optax.adam,
):
  opt = fedco.extend.param_optimizer(learning_rate, optimizer, default=0.1)

  def init(params, *, inner_value=None):
    params = fedco.extend.strong(params)
    return _AdamState(
      jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params), opt.init(params)
    )

  def update(updates, state, params=None, **unused):
    step, opt_state = opt.update(updates, state.opt_state, params)
    return step, _AdamState(state.count + 1, state.mu, opt_state)

  plan = fedco.extend.make_plan(local_steps, every_round=("mu",))
  return fedco.extend.Algorithm(init, update, plan, fedco.extend.averaging_server(), "c", "plain")


def test_a_plan_field_the_state_holds_twice_is_named_as_a_clash():
  with pytest.raises(
    fedco.testing.ContractError, match=r"builds: .*'mu'.*more than one field.*rename"
  ):
    fedco.testing.check_algorithm(_clashing, checks=("builds",), learning_rate=0.1)


def test_host_randomness_fails_the_jit_check_naming_the_leaf_and_the_cause():
  with pytest.raises(
    fedco.testing.ContractError, match=r"jit: .* differ in params, by up to .*host randomness"
  ):
    fedco.testing.check_algorithm(
      shared_momentum, checks=("jit",), learning_rate=0.1, local_steps=3, host_noise=True
    )


def test_client_key_is_each_clients_own_and_the_loop_references():
  # the kit's simulate check compares fedco.simulate with loop_reference, which derives
  # client_key from the client's id and step as the simulator does: it fails if either
  # derived it otherwise (one key for every client, or none per step)
  report = fedco.testing.check_algorithm(
    shared_momentum,
    checks=("jit", "simulate", "sweep"),
    learning_rate=0.1,
    local_steps=3,
    client_noise=0.01,
  )
  assert set(report.values()) == {"passed"}, report


# ---- idiomatic optax code, and broken algorithms named by the check they fail ---------------


class _MomentumState(NamedTuple):
  count: jax.Array
  momentum: optax.Params


@fedco.extend.factory(static=("local_steps", "optimizer"))
def _idiomatic(
  learning_rate: Optional[float] = None,
  local_steps: int = 3,
  *,
  beta: float = 0.5,
  optimizer: fedco.extend.Optimizer = None,
  broken: Optional[str] = None,
):
  """Local heavy-ball SGD written as optax writes its transforms: the buffer is
  ``jax.tree.map(jnp.zeros_like, params)`` (no ``extend.strong``). ``broken`` breaks it
  on purpose: ``"nan"`` (updates of NaN), ``"traced_if"`` (a Python ``if`` on an array),
  ``"lr_branch"`` / ``"factory_branch"`` (a Python ``if`` on the learning rate in update /
  in the factory), ``"wrong_kind"`` (declared ``"plain"`` but reads ``inner_fn``),
  ``"weak_drift"`` (a buffer weak-typed whatever the params, made strong by update)."""
  del optimizer
  rate = 0.1 if learning_rate is None else learning_rate
  if broken == "factory_branch" and learning_rate > 0.5:
    rate = 0.5

  def init(params, *, inner_value=None):
    del inner_value
    if broken == "weak_drift":
      return _MomentumState(
        jnp.zeros([], jnp.int32), jax.tree.map(lambda p: jnp.full(jnp.shape(p), 0.0), params)
      )
    return _MomentumState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

  def update(updates, state, params=None, *, inner_fn=None, **unused):
    del unused
    if broken == "traced_if" and jnp.sum(updates) > 0:
      updates = -updates
    if broken == "lr_branch" and learning_rate > 0.5:
      updates = 2.0 * updates
    if broken == "wrong_kind":
      updates = jax.grad(lambda x: jnp.sum(inner_fn(x)))(params)
    m = jax.tree.map(lambda m, g: beta * m + g, state.momentum, updates)
    if broken == "nan":
      m = jax.tree.map(lambda v: v * jnp.nan, m)
    step = jax.tree.map(lambda v: -rate * v, m)
    return step, _MomentumState(state.count + 1, m)

  plan = fedco.extend.make_plan(local_steps, every_round=("momentum",))
  return fedco.extend.Algorithm(
    init, update, plan, fedco.extend.averaging_server(), "idiomatic", "plain"
  )


def test_an_idiomatic_optax_algorithm_passes_every_check_with_a_note_for_own_loops():
  # its state from weak-typed params would be weak, and the first update makes it strong:
  # fedco never meets that (simulate and sweep strong-type the params), so the kit only
  # notes it for the user's own loops, with the fix
  with pytest.warns(UserWarning, match=r"state\.momentum starts weak-typed.*extend\.strong"):
    report = fedco.testing.check_algorithm(_idiomatic, learning_rate=0.1, local_steps=3)
  assert report.pop("mesh").startswith("skipped: one device")
  skipped = report.pop("asynchronous")
  assert skipped.startswith("skipped: asynchronous= does not support"), skipped
  assert "whose clients also send or receive the state fields" in skipped, skipped
  assert report == {c: "passed" for c in fedco.testing.CHECKS if c not in ("mesh", "asynchronous")}
  # weak-typed params of the user's own: the kit takes them strongly typed, as simulate does
  with pytest.warns(UserWarning, match=r"state\.momentum starts weak-typed"):
    report = fedco.testing.check_algorithm(
      _idiomatic, checks=CHEAP, params=jnp.full((3,), 0.1), learning_rate=0.1
    )
  assert set(report.values()) == {"passed"}, report


def test_the_simulator_strong_types_weak_params_so_no_program_traces_twice():
  problem, data = fedco.testing.default_problem("plain"), fedco.testing.default_data()
  weak, strong = jnp.full((3,), 0.1), jnp.full((3,), 0.1, jnp.float32)
  assert weak.weak_type and not strong.weak_type
  sim = fedco.Simulator(problem, _idiomatic(0.1, 2), data, batch_size=None, evaluate=False)
  state = sim.init(weak, 0)
  assert not any(getattr(leaf, "weak_type", False) for leaf in jax.tree.leaves(state))
  for _ in range(2):  # the state each run returns has the types of the one it was given
    state, _ = sim.run(state, 1, final_round=2)
  assert sim._run._cache_size() == 1
  runs = [
    fedco.simulate(problem, _idiomatic(0.1, 2), data, p, rounds=2, batch_size=None)
    for p in (weak, strong)
  ]
  np.testing.assert_array_equal(runs[0].params, runs[1].params)
  np.testing.assert_array_equal(runs[0].params, state.server["params"])


def test_a_state_whose_weak_type_drifts_still_fails_naming_the_field():
  with pytest.raises(
    fedco.testing.ContractError,
    match=r"check_algorithm\(idiomatic\): state: state\.momentum changed weak type across",
  ):
    fedco.testing.check_algorithm(
      _idiomatic, checks=("state",), learning_rate=0.1, broken="weak_drift"
    )


@pytest.mark.filterwarnings("ignore:.*starts weak-typed:UserWarning")  # the passed state check
@pytest.mark.parametrize(
  "broken,named",
  [
    # the first check that runs a step sees the NaN (simulate would stop on it later)
    ("nan", r"state: after update 1: params holds nan on the kit's problem"),
    ("traced_if", r"state: raised TracerBoolConversionError: .*jnp\.where"),
    ("lr_branch", r"inject: raised TracerBoolConversionError: .*hyperparameter is traced"),
    ("factory_branch", r"inject: raised TracerBoolConversionError: .*learning_rate"),
    ("wrong_kind", r"state: raised TypeError: .*problem_kind \('plain'\)"),
  ],
)
def test_a_broken_algorithm_fails_naming_the_check_and_what_to_do(broken, named):
  # every check chosen: the error names the first that fails, in one leading line
  with pytest.raises(fedco.testing.ContractError) as caught:
    fedco.testing.check_algorithm(_idiomatic, learning_rate=0.1, broken=broken)
  first = str(caught.value).splitlines()[0]
  assert re.match(rf"fedco\.testing\.check_algorithm\(idiomatic\): {named}", first), first


def test_a_problem_of_another_kind_is_refused_naming_problem():
  with pytest.raises(
    ValueError, match=r"^problem: .*needs a compositional problem.*of kind 'global'"
  ):
    fedco.testing.check_algorithm(
      fedco.feddro, problem=fedco.testing.default_problem("plain"), learning_rate=0.1
    )
