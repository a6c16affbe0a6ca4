"""Compression and differential privacy of what clients send (fedco.compression,
fedco.privacy, fedco.runtime.uplink)."""

import functools
import os
import tempfile

import chex
import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

import fedco
from fedco.runtime import uplink as uplink_lib
from tests import helpers


def _portfolio_data(sizes=(24, 8, 40, 16, 12, 30)):
  return fedco.FederatedData.from_clients(
    [{"r": r} for r in helpers.portfolio_clients(sizes=sizes)]
  )


# ---- codecs ------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [None, 4.0])
def test_stochastic_quantization_is_unbiased_and_on_its_grid(scale):
  codec = fedco.compression.stochastic_quantization(2, scale=scale)
  value = {"a": jnp.array([-3.0, -1.1, 0.0, 0.37, 2.5]), "b": jnp.array([[1.9]])}
  state = codec.init(value)
  draws = 40_000
  keys = jax.random.split(jax.random.PRNGKey(0), draws)
  decoded = jax.jit(jax.vmap(lambda k: codec.update(value, state, key=k)[0]))(keys)
  flat = np.concatenate(
    [np.asarray(decoded["a"]), np.asarray(decoded["b"]).reshape(draws, 1)], axis=1
  )
  target = np.array([-3.0, -1.1, 0.0, 0.37, 2.5, 1.9])
  lo, hi = (target.min(), target.max()) if scale is None else (-scale, scale)
  step = (hi - lo) / 3  # 2 bits: 4 levels
  levels = np.round((flat - lo) / step)
  np.testing.assert_allclose(flat, lo + levels * step, atol=1e-5)  # on the grid
  assert levels.min() >= 0 and levels.max() <= 3
  # unbiased: each mean within 5 standard errors of the value
  std_err = np.maximum(flat.std(axis=0), 1e-6) / np.sqrt(draws)
  assert np.all(np.abs(flat.mean(axis=0) - target) < 5 * std_err + 1e-6)
  assert codec.payload_bits(6, jnp.float32) == 6 * 2 + (64 if scale is None else 0)


def test_adaptive_quantization_is_unbiased_in_range_and_its_error_vanishes():
  codec = fedco.compression.adaptive_quantization(3, 2.0)
  value = jnp.array([0.37, -1.2, 1.99])
  state = codec.init(value)
  keys = jax.random.split(jax.random.PRNGKey(4), 40_000)
  draws = np.asarray(jax.jit(jax.vmap(lambda k: codec.update(value, state, key=k)[0]))(keys))
  np.testing.assert_allclose(np.round(draws / (2.0 / 3)), draws / (2.0 / 3), atol=1e-4)
  std_err = draws.std(axis=0) / np.sqrt(len(keys))
  assert np.all(np.abs(draws.mean(axis=0) - value) < 5 * std_err)
  # a settling sequence (a converging tracker): the decoded values close in on it
  target = jnp.array([1.5, -1.5])
  state, key, errors = codec.init(target), jax.random.PRNGKey(5), []
  for t in range(300):
    key, k = jax.random.split(key)
    upload = target + 0.9**t * jnp.array([0.4, -0.7])
    decoded, state = codec.update(upload, state, key=k)
    errors.append(float(jnp.max(jnp.abs(decoded - upload))))
  assert max(errors[:5]) > 1e-2 and max(errors[-20:]) < 1e-6
  assert codec.payload_bits(2, jnp.float32) == 6  # the codes alone


def test_top_k_with_error_feedback_sends_the_whole_sum_over_time():
  codec = fedco.compression.top_k(0.25)
  uploads = jax.random.normal(jax.random.PRNGKey(1), (60, 8))
  state = codec.init(uploads[0])
  sent = []
  for u in uploads:
    decoded, state = codec.update(u, state)
    assert int(jnp.sum(decoded != 0)) <= 2  # k = ceil(0.25 * 8)
    sent.append(decoded)
  sent = jnp.stack(sent)
  # what was sent plus what is still held is exactly what was uploaded
  np.testing.assert_allclose(sent.sum(0) + state.error, uploads.sum(0), atol=1e-4)
  assert float(jnp.max(jnp.abs(state.error))) < 5.0  # the held error stays bounded
  # every coordinate got through, and the running sums track each other
  assert bool(jnp.all(jnp.abs(sent).sum(0) > 0))
  # without error feedback the unsent part is lost
  plain = fedco.compression.top_k(0.25, error_feedback=False)
  lost = sum(plain.update(u, plain.init(u))[0] for u in uploads)
  assert float(jnp.linalg.norm(lost - uploads.sum(0))) > 1.0
  assert codec.payload_bits(8, jnp.float32) == 2 * (32 + 3)


# ---- the runtime's noise -----------------------------------------------------------------


def _zero_gradient_problem():
  return fedco.plain(lambda x, e: 0.0 * jnp.sum(x) * jnp.sum(e["r"]))


def test_noise_on_the_model_mean_has_the_calibrated_std():
  """FedAvg on a zero gradient: each round's server change is the noise alone, of std
  ``z C / m`` for the mean of ``m`` uniformly weighted clients (4 of 6 sampled)."""
  z, clip, m, d, rounds = 2.0, 0.5, 4, 64, 60
  data = _portfolio_data()
  sim = fedco.Simulator(
    _zero_gradient_problem(),
    fedco.fedavg(0.1, 2, weighting="uniform"),
    data,
    clients_per_round=m,
    batch_size=4,
    evaluate=False,
    privacy=fedco.privacy.gaussian(clip, noise_multiplier=z),
  )
  state = sim.init(jnp.zeros((d,)), 0)
  models = []
  for _ in range(rounds):
    state, _ = sim.run(state, 1)
    models.append(np.asarray(state.server["params"]))
  steps = np.diff(np.stack([np.zeros(d)] + models), axis=0).ravel()
  expected = z * clip / m
  assert abs(steps.std() / expected - 1) < 0.05, steps.std()
  assert abs(steps.mean()) < 4 * expected / np.sqrt(steps.size)


@pytest.mark.parametrize("path", ["mean", "shared", "each"])
def test_noise_per_message_std(path):
  """The every-step mean gets ``z C max(w)``, and so does the mean of values that share one
  draw (the model under an averaging server); per-upload noise (servers that read every
  client's value) is ``z C`` on each value, drawn per client."""
  up = uplink_lib.Uplink(
    {}, {"y": 0.3}, 1.5, fedco.privacy.gaussian(0.3, noise_multiplier=1.5), {"y": 1}, 1.0, False
  )
  weights = jnp.array([0.1, 0.2, 0.3, 0.4])
  values = jnp.zeros((4, 500))
  ids, alive = jnp.arange(4), jnp.ones(4, bool)

  def one(key):
    if path == "mean":
      return up.send_mean("y", values, jnp.zeros(500), weights, {}, key, ids, alive)[0]
    sent = up.send_each(
      "y", values, None, weights, {}, key, ids, alive, shared_noise=path == "shared"
    )[0]
    if path == "shared":  # one draw on every value: the weighted mean carries it once
      return jnp.tensordot(weights, sent, axes=1), jnp.max(jnp.abs(sent[0] - sent[3]))
    return sent, 0.0

  keys = jax.random.split(jax.random.PRNGKey(2), 40)
  if path == "mean":
    out = np.asarray(jax.vmap(one)(keys))
  else:
    out, spread = jax.vmap(one)(keys)
    out = np.asarray(out)
    if path == "shared":
      assert float(jnp.max(spread)) == 0.0  # the same draw on every client's value
  expected = 1.5 * 0.3 * (1.0 if path == "each" else 0.4)
  assert abs(out.std() / expected - 1) < 0.03
  if path == "each":  # independent per client
    assert abs(np.corrcoef(out[:, 0].ravel(), out[:, 1].ravel())[0, 1]) < 0.05


def test_clipping_bounds_each_clients_delta():
  up = uplink_lib.Uplink(
    {},
    {"params": 1.0},
    0.0,
    fedco.privacy.gaussian(1.0, noise_multiplier=0),
    {"params": 1},
    1.0,
    False,
  )
  values = jnp.array([[3.0, 4.0], [0.3, 0.4]])
  deltas, _ = up.encode(
    "params", values, jnp.zeros(2), {}, jnp.zeros((2, 2), jnp.uint32), jnp.ones(2, bool)
  )
  np.testing.assert_allclose(deltas, [[0.6, 0.8], [0.3, 0.4]], rtol=1e-6)


# ---- accounting ----------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _private_feddro_run():
  """FedDRO (y every step: I = 2 messages, plus the model) on 3 of 6 clients, z = 1.3."""
  data = _portfolio_data()
  return fedco.simulate(
    fedco.problems.portfolio(1.0),
    fedco.feddro(0.05, 2, beta=0.5),
    data,
    jnp.full((3,), 0.3),
    rounds=5,
    clients_per_round=3,
    batch_size=4,
    eval_every=1,
    privacy=fedco.privacy.gaussian({"params": 1.0, "y": 2.0}, noise_multiplier=1.3, delta=1e-5),
  )


def _direct_epsilon(z, q, messages, rounds, delta, init_messages=1):
  """The mean of the trackers' start over all clients (``init_messages`` Gaussians), then
  ``rounds`` of ``messages`` Gaussians on a Poisson sample at rate ``q``."""
  gaussian = dp_accounting.GaussianDpEvent(z)
  event = dp_accounting.PoissonSampledDpEvent(
    q, dp_accounting.ComposedDpEvent([gaussian] * messages)
  )
  accountant = rdp.RdpAccountant()
  accountant.compose(dp_accounting.ComposedDpEvent([gaussian] * init_messages))
  accountant.compose(event, rounds)
  return accountant.get_epsilon(delta)


def test_reported_epsilon_equals_a_direct_dp_accounting_computation():
  result = _private_feddro_run()
  direct = [_direct_epsilon(1.3, 0.5, 3, r, 1e-5) for r in range(1, 6)]
  np.testing.assert_allclose(result.metrics["epsilon"], direct, rtol=1e-9)
  uplink = result.ledger["uplink"]
  assert uplink["messages_per_round"] == {"params": 1, "y": 2}
  assert uplink["messages_at_init"] == 1
  assert uplink["epsilon"] == pytest.approx(direct[-1], rel=1e-9)
  assert np.all(np.isfinite(result.metrics["objective"]))


def test_target_epsilon_is_calibrated_over_the_runs_rounds():
  data = _portfolio_data((10, 12, 14, 9))
  private = fedco.privacy.gaussian(1.0, epsilon=3.0, delta=1e-6)
  sim = fedco.Simulator(
    fedco.problems.portfolio(1.0),
    fedco.feddro(0.05, 3),
    data,
    clients_per_round=2,
    batch_size=4,
    privacy=fedco.privacy.gaussian(1.0, epsilon=3.0, delta=1e-6, rounds=40),
  )
  z = sim.config.uplink.noise_multiplier
  spent = _direct_epsilon(z, 0.5, 4, 40, 1e-6)
  assert 2.97 < spent <= 3.0 + 1e-6
  assert sim.epsilon(40) == pytest.approx(spent, rel=1e-9)
  with pytest.raises(ValueError, match="no rounds"):
    fedco.Simulator(fedco.problems.portfolio(1.0), fedco.feddro(0.05, 3), data, privacy=private)


# ---- ledgers, resumes and refusals ---------------------------------------------------------


def test_ledger_counts_the_codecs_bytes():
  data = _portfolio_data()
  result = fedco.simulate(
    fedco.problems.portfolio(1.0),
    fedco.feddro(0.05, 3),
    data,
    jnp.full((3,), 0.3),
    rounds=2,
    batch_size=4,
    evaluate=False,
    compression={"y": fedco.compression.stochastic_quantization(4)},
  )
  ledger = result.ledger
  y_size = ledger["up_per_client_per_round"]["y"] // 3
  assert ledger["bytes_up_per_client_per_round"] == {"params": 12, "y": 3 * (y_size * 4 + 64) / 8}
  assert ledger["bytes_down_per_client_per_round"] == {"params": 12, "y": 3 * y_size * 4}
  assert ledger["total_bytes_up"] == 2 * 6 * (12 + 3 * (y_size * 4 + 64) / 8)
  assert ledger["uplink"] == {"codecs": {"y": "quantize4"}}


def test_a_compressed_run_resumes_bit_identically():
  """Top-k's error memory is part of the checkpointed state."""
  data = _portfolio_data()
  kwargs = dict(
    rounds=6,
    clients_per_round=4,
    batch_size=4,
    evaluate=False,
    compression={
      "params": fedco.compression.top_k(0.34),
      "y": fedco.compression.stochastic_quantization(3),
    },
  )
  run = lambda **kw: fedco.simulate(
    fedco.problems.portfolio(1.0),
    fedco.feddro(0.05, 2),
    data,
    jnp.full((3,), 0.3),
    **{**kwargs, **kw},
  )
  whole = run()
  assert float(jnp.max(jnp.abs(whole.state.uplink["params"].error))) > 0
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "ckpt")
    run(rounds=3, checkpoint_dir=folder)
    resumed = run(checkpoint_dir=folder)
  chex.assert_trees_all_equal(resumed.state, whole.state)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (
      dict(compression={"u": fedco.compression.top_k(0.5)}),
      r"compression names field 'u', which feddro does not send; it sends \['params', 'y'\]",
    ),
    (dict(compression={"y": "top_k"}), r"compression\['y'\] must be a fedco.compression codec"),
    (
      dict(privacy=fedco.privacy.gaussian({"params": 1.0}, noise_multiplier=1.0)),
      r"privacy.clip has no bound for \['y'\]",
    ),
    (
      dict(
        privacy=fedco.privacy.gaussian({"params": 1.0, "y": 1.0, "m": 2.0}, noise_multiplier=1.0)
      ),
      r"privacy.clip names \['m'\]",
    ),
    (dict(privacy={"clip": 1.0}), "privacy must be fedco.privacy.gaussian"),
  ],
)
def test_bad_uplink_arguments_are_one_line_errors(kwargs, message):
  with pytest.raises(ValueError, match=message) as err:
    fedco.Simulator(
      fedco.problems.portfolio(1.0), fedco.feddro(0.05, 2), _portfolio_data(), **kwargs
    )
  assert "\n" not in str(err.value)


@pytest.mark.parametrize(
  "call, message",
  [
    (lambda: fedco.compression.stochastic_quantization(0), "bits"),
    (lambda: fedco.compression.stochastic_quantization(4, scale=-1.0), "scale"),
    (lambda: fedco.compression.top_k(0.0), "fraction"),
    (lambda: fedco.compression.adaptive_quantization(1, 1.0), "bits"),
    (lambda: fedco.compression.adaptive_quantization(3, 1.0, shrink=1.5), "shrink"),
    (lambda: fedco.privacy.gaussian(1.0), "exactly one of noise_multiplier and epsilon"),
    (lambda: fedco.privacy.gaussian(-1.0, noise_multiplier=1.0), "clip"),
    (lambda: fedco.privacy.gaussian(1.0, epsilon=1.0, delta=2.0), "delta"),
  ],
)
def test_bad_codec_and_mechanism_arguments(call, message):
  with pytest.raises(ValueError, match=message):
    call()


@pytest.mark.parametrize("injected", [False, True])
def test_drfa_loss_queries_are_refused_under_privacy(injected):
  problem = fedco.plain(lambda x, e: jnp.sum((x - e["r"]) ** 2))
  drfa = fedco.inject_hyperparams(fedco.drfa) if injected else fedco.drfa
  with pytest.raises(ValueError, match="queries client losses outside its communication plan"):
    fedco.Simulator(
      problem,
      drfa(0.1, 2),
      _portfolio_data(),
      batch_size=4,
      privacy=fedco.privacy.gaussian(1.0, noise_multiplier=1.0),
    )


def test_the_trackers_start_is_private_too():
  """FedDRO's y_bar_0 is every client's inner value at x_0: clipped and noised like any
  upload (with noise 0, the mean of the clipped values)."""
  data = _portfolio_data()
  problem, alg = fedco.problems.portfolio(1.0), fedco.feddro(0.05, 2)
  start = lambda **kw: (
    fedco.Simulator(problem, alg, data, batch_size=4, **kw).init(jnp.full((3,), 0.3), 0).shared["y"]
  )
  plain = start()
  clipped = start(privacy=fedco.privacy.gaussian(1e-3, noise_multiplier=0.0))
  noisy = start(privacy=fedco.privacy.gaussian(1e-3, noise_multiplier=1e3))
  assert float(jnp.linalg.norm(jnp.ravel(clipped))) <= 1e-3 + 1e-9
  assert float(jnp.linalg.norm(jnp.ravel(plain))) > 0.01
  assert float(jnp.max(jnp.abs(noisy - clipped))) > 0.01


@pytest.mark.parametrize(
  "algorithm, kwargs, message",
  [
    (
      lambda: fedco.fedavg(0.1, 2),
      dict(privacy=fedco.privacy.gaussian(1.0, noise_multiplier=1.0)),
      "privacy needs uniform client weights: fedavg weighs clients by their data sizes",
    ),
    (
      lambda: fedco.mbsgd(0.1),
      dict(compression={"y": fedco.compression.top_k(0.5)}),
      r"compression\['y'\] keeps an error-feedback memory, but mbsgd sends 'y' as a value",
    ),
  ],
)
def test_private_data_sizes_and_memory_on_values_are_refused(algorithm, kwargs, message):
  problem = fedco.problems.portfolio(1.0)
  if algorithm().problem_kind == "plain":
    problem = fedco.plain(lambda x, e: jnp.sum((x - e["r"]) ** 2))
  with pytest.raises(ValueError, match=message):
    fedco.Simulator(problem, algorithm(), _portfolio_data(), **kwargs)


def test_a_private_sweep_reports_each_runs_epsilon_as_simulate_does():
  data = _portfolio_data()
  kwargs = dict(
    rounds=3,
    batch_size=4,
    clients_per_round=3,
    evaluate=False,
    privacy=fedco.privacy.gaussian(1.0, epsilon=2.0),
  )
  swept = fedco.sweep(
    fedco.problems.portfolio(1.0),
    fedco.feddro,
    data,
    jnp.full((3,), 0.3),
    grid={"learning_rate": [0.02, 0.05]},
    seeds=(0,),
    algorithm_kwargs={"local_steps": 2},
    **kwargs,
  )
  alone = fedco.simulate(
    fedco.problems.portfolio(1.0), fedco.feddro(0.02, 2), data, jnp.full((3,), 0.3), **kwargs
  )
  assert swept.metrics["epsilon"].shape == (2, 3)
  np.testing.assert_allclose(swept.metrics["epsilon"][0], alone.metrics["epsilon"])
  assert swept.metrics["epsilon"][0, -1] == pytest.approx(2.0, rel=1e-4)
  chex.assert_trees_all_close(swept.params[0], alone.params, rtol=1e-5, atol=1e-6)
