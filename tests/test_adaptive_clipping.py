"""Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy 2021; issue 48, item 1).

A float64 NumPy transcription of the paper's Algorithm 1 (FedAvg with the clip bound moved
geometrically toward a target quantile of the clients' update norms, by a noised count)
against a run, round by round, the count's noise replayed from the runtime's key schedule;
the upload's noise multiplier and the accounting; which fields adapt; refusals.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.runtime import rounds as rounds_lib

K, STEPS, LR = 6, 2, 0.2


def _data():
  rng = np.random.default_rng(0)
  return fedco.FederatedData.from_clients(
    [{"x": (0.4 * k + 0.1 * rng.normal(size=(4, 2))).astype(np.float32)} for k in range(K)]
  )


PROBLEM = fedco.problems.plain(lambda w, e: 0.5 * jnp.sum((w - e["x"]) ** 2))


def _count_noise(state):
  """The count's standard normal draw of the round ``state`` starts (the runtime's keys)."""
  k_up = jax.random.fold_in(state.key, rounds_lib.UPLINK_STREAM)
  k_bits = jax.random.fold_in(k_up, rounds_lib.ADAPTIVE_STREAM)
  return float(jax.random.normal(jax.random.fold_in(k_bits, 0)))


@pytest.mark.parametrize("target", [0.3, 0.7])
def test_adaptive_clipping_matches_its_float64_transcription(target):
  data = _data()
  sigma_b, eta_c, c0 = 0.3, 0.2, 0.3
  spec = fedco.privacy.adaptive_clipping(target, eta_c, count_noise=sigma_b)
  dp = fedco.privacy.gaussian(c0, noise_multiplier=0.0, adaptive=spec)
  sim = fedco.Simulator(
    PROBLEM,
    fedco.fedavg(LR, STEPS, weighting="uniform"),
    data,
    batch_size=None,
    evaluate=False,
    privacy=dp,
  )
  state = sim.init(jnp.zeros(2, jnp.float32), 0)
  means = [np.asarray(data.client(k)["x"], np.float64).mean(0) for k in range(K)]
  w, c = np.zeros(2), c0
  bounds = []
  for _ in range(8):
    noise = _count_noise(state)
    state, metrics = sim.run(state, 1)
    # Algorithm 1: local SGD, clip each update to C, average; bits, noised count, C's step
    updates = []
    for m in means:
      local = w.copy()
      for _ in range(STEPS):
        local = local - LR * (local - m)
      updates.append(local - w)
    norms = np.array([np.linalg.norm(u) for u in updates])
    clipped = [u * min(1.0, c / n) for u, n in zip(updates, norms)]
    w = w + np.mean(clipped, axis=0)
    fraction = (np.sum(norms <= c) + sigma_b * noise) / K
    assert float(np.asarray(metrics["clip_params"])[0]) == pytest.approx(c, rel=1e-5)
    c = c * np.exp(-eta_c * (fraction - target))
    bounds.append(c)
    np.testing.assert_allclose(np.asarray(state.server["params"]), w, rtol=1e-5, atol=1e-6)
    assert float(state.server_opt_state.bounds["params"]) == pytest.approx(c, rel=1e-5)
  # the bound moved toward the target quantile of the norms (not stuck at its start)
  assert abs(bounds[-1] - c0) > 0.05


def test_the_upload_takes_z_delta_and_the_accounting_is_unchanged():
  z, sigma_b = 1.2, 2.0
  spec = fedco.privacy.adaptive_clipping(count_noise=sigma_b)
  adaptive = fedco.Simulator(
    PROBLEM,
    fedco.fedavg(LR, STEPS, weighting="uniform"),
    _data(),
    batch_size=None,
    privacy=fedco.privacy.gaussian(0.5, noise_multiplier=z, adaptive=spec),
  )
  fixed = fedco.Simulator(
    PROBLEM,
    fedco.fedavg(LR, STEPS, weighting="uniform"),
    _data(),
    batch_size=None,
    privacy=fedco.privacy.gaussian(0.5, noise_multiplier=z),
  )
  up = adaptive.config.uplink
  want = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
  assert up.multiplier("params") == pytest.approx(want) and want > z
  assert fixed.config.uplink.multiplier("params") == z
  assert adaptive.epsilon(50) == fixed.epsilon(50)
  # the default count noise is the paper's clients_per_round / 20
  default = fedco.privacy.gaussian(
    0.5, noise_multiplier=0.0, adaptive=fedco.privacy.adaptive_clipping()
  )
  sim = fedco.Simulator(
    PROBLEM, fedco.fedavg(LR, STEPS, weighting="uniform"), _data(), batch_size=None, privacy=default
  )
  assert sim.config.uplink.count_noise == pytest.approx(K / 20)


def test_the_noise_on_an_adapted_upload_has_z_delta_times_the_current_bound():
  """Many clients sending zero changes: the server's mean moves by the noise alone, whose
  std is ``z_Delta C max_w`` with the round's bound."""
  z, sigma_b, c0, k = 0.8, 0.45, 0.5, 40  # z_Delta = 1.75, far from z
  zeros = fedco.FederatedData.from_clients(
    [{"x": np.zeros((2, 200), np.float32)} for _ in range(k)]
  )
  spec = fedco.privacy.adaptive_clipping(count_noise=sigma_b)
  dp = fedco.privacy.gaussian(c0, noise_multiplier=z, adaptive=spec)
  sim = fedco.Simulator(
    PROBLEM,
    fedco.fedavg(1e-9, 1, weighting="uniform"),
    zeros,
    batch_size=None,
    evaluate=False,
    privacy=dp,
  )
  state = sim.init(jnp.zeros(200, jnp.float32), 0)
  moved = np.asarray(sim.run(state, 1)[0].server["params"])
  want = fedco.privacy.update_multiplier(z, sigma_b) * c0 / k
  assert np.std(moved) == pytest.approx(want, rel=0.15)


def test_only_fields_sent_once_at_a_rounds_end_adapt():
  from fedco.runtime import uplink_setup

  assert uplink_setup.adapted_fields(fedco.feddro(0.1, 2, beta=0.5).plan) == ("params",)
  assert uplink_setup.adapted_fields(fedco.ds_feddro(0.1, 2, beta=0.5).plan) == ("params", "y")
  assert uplink_setup.adapted_fields(fedco.afl(0.1).plan) == ("params", "loss")


def test_adaptive_clipping_refuses_bad_settings_in_one_line():
  for call, match in [
    (lambda: fedco.privacy.adaptive_clipping(1.0), "target_quantile"),
    (lambda: fedco.privacy.adaptive_clipping(0.5, 0.0), "learning_rate"),
    (lambda: fedco.privacy.adaptive_clipping(0.5, count_noise=0.0), "count_noise"),
    (lambda: fedco.privacy.gaussian(1.0, noise_multiplier=1.0, adaptive=0.5), "adaptive"),
    (lambda: fedco.privacy.update_multiplier(2.0, 1.0), "count_noise"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      call()
    assert "\n" not in str(err.value)
  spec = fedco.privacy.adaptive_clipping(count_noise=0.1)
  with pytest.raises(ValueError, match="count_noise=0.1 must exceed half"):
    fedco.Simulator(
      PROBLEM,
      fedco.fedavg(LR, STEPS, weighting="uniform"),
      _data(),
      batch_size=None,
      privacy=fedco.privacy.gaussian(0.5, noise_multiplier=1.0, adaptive=spec),
    )


def test_a_methods_privacy_takes_adaptive_clipping_from_the_config():
  import ml_collections

  from fedco.experiment import config_methods

  entry = ml_collections.ConfigDict(
    {"privacy": {"epsilon": 4.0, "clip": 0.5, "adaptive": {"target_quantile": 0.6}}}
  )
  settings = config_methods.uplink_settings("--config.methods.m", entry)
  method = config_methods.Method("m", "fedavg", {}, 0.1, 2, uplink=settings)
  dp = method.simulator_kwargs()["privacy"]
  assert dp.adaptive == fedco.privacy.adaptive_clipping(0.6) and dp.epsilon == 4.0
  bad = ml_collections.ConfigDict(
    {"privacy": {"epsilon": 4.0, "clip": 0.5, "adaptive": {"target": 0.6}}}
  )
  with pytest.raises(ValueError, match=r"--config\.methods\.m\.privacy\.adaptive\.target is not"):
    config_methods.uplink_settings("--config.methods.m", bad)


def test_the_default_count_noise_rises_to_z_where_the_papers_is_too_small():
  """K / 20 = 0.3 cannot pay for z = 2 (it must exceed z / 2): the default becomes z, the
  update's multiplier 2 / sqrt(3/4)."""
  dp = fedco.privacy.gaussian(0.5, noise_multiplier=2.0, adaptive=fedco.privacy.adaptive_clipping())
  sim = fedco.Simulator(
    PROBLEM, fedco.fedavg(LR, STEPS, weighting="uniform"), _data(), batch_size=None, privacy=dp
  )
  assert sim.config.uplink.count_noise == 2.0
  assert sim.config.uplink.multiplier("params") == pytest.approx(2.0 / 0.75**0.5)


def test_the_count_query_is_inside_the_accounted_budget():
  """The upload (sensitivity C, noise z_Delta C) and the count of clients within C (each
  bit's centred sensitivity 1/2, noise sigma_b) composed, as dp-accounting's RDP accountant
  sees them, cost exactly the one Gaussian of multiplier z that the run accounts."""
  import dp_accounting
  from dp_accounting import rdp

  z, sigma_b = 1.3, 2.0
  z_delta = fedco.privacy.update_multiplier(z, sigma_b)
  pair = dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(z_delta), dp_accounting.GaussianDpEvent(2 * sigma_b)]
  )
  one = dp_accounting.GaussianDpEvent(z)
  eps = [rdp.RdpAccountant().compose(e, 50).get_epsilon(1e-5) for e in (pair, one)]
  assert eps[0] == pytest.approx(eps[1], rel=1e-9)
  # and the count alone is not free: the update at z with the count beside it costs more
  more = dp_accounting.ComposedDpEvent(
    [dp_accounting.GaussianDpEvent(z), dp_accounting.GaussianDpEvent(2 * sigma_b)]
  )
  assert rdp.RdpAccountant().compose(more, 50).get_epsilon(1e-5) > eps[1] * 1.01
