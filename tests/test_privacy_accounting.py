"""The privacy accountants of fedco.privacy: RDP (the default) and PLD (issue 48, decision
106). PLD is checked against RDP (never looser, clearly tighter where it should be),
against a fresh ``dp_accounting`` ``PLDAccountant`` composing the run's event (the
incremental composition over round counts), and through ``calibrate``."""

import functools
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp

import fedco

DELTA = 1e-5
ROUNDS = [1, 10, 100]


# ---- PLD against RDP ---------------------------------------------------------------------


@pytest.mark.parametrize("init_messages", [0, 1])
@pytest.mark.parametrize("messages", [1, 3])
@pytest.mark.parametrize("sampling_rate", [0.01, 0.1, 1.0])
@pytest.mark.parametrize("noise_multiplier", [0.8, 1.1, 2.0])
def test_pld_is_never_looser_than_rdp(noise_multiplier, sampling_rate, messages, init_messages):
  args = (noise_multiplier, sampling_rate, messages, ROUNDS, DELTA)
  by_rdp = fedco.privacy.epsilon_spent(*args, init_messages=init_messages)
  by_pld = fedco.privacy.epsilon_spent(*args, init_messages=init_messages, accountant="pld")
  assert by_pld.shape == by_rdp.shape == (len(ROUNDS),)
  assert np.all(np.isfinite(by_pld)) and np.all(by_pld > 0)
  assert np.all(by_pld <= by_rdp * (1 + 1e-6)), (by_pld, by_rdp)
  assert np.all(np.diff(by_pld) > 0)  # more rounds spend more


def test_pld_is_clearly_tighter_on_a_typical_setting():
  # z = 1.1, 1% of the clients a round, one message, 100 rounds: RDP 0.956, PLD 0.550
  # (measured; 42% tighter). At full participation the gap is smaller, about 5%.
  by_rdp = fedco.privacy.epsilon_spent(1.1, 0.01, 1, 100, DELTA)
  by_pld = fedco.privacy.epsilon_spent(1.1, 0.01, 1, 100, DELTA, accountant="pld")
  assert by_pld <= 0.6 * by_rdp, (by_pld, by_rdp)
  everyone = [
    fedco.privacy.epsilon_spent(2.0, 1.0, 3, 100, DELTA, accountant=a) for a in ("rdp", "pld")
  ]
  assert everyone[1] <= 0.96 * everyone[0], everyone


def test_explicit_rdp_is_the_default_bit_for_bit():
  args = (1.1, 0.1, 3, [1, 7, 40], DELTA)
  np.testing.assert_array_equal(
    fedco.privacy.epsilon_spent(*args, init_messages=1),
    fedco.privacy.epsilon_spent(*args, init_messages=1, accountant="rdp"),
  )


# ---- PLD against a fresh dp_accounting PLDAccountant -------------------------------------


def _pld_ready(event):
  """``event`` with every composition of Gaussians replaced by the one Gaussian it equals
  (multiplier ``(sum z_i^-2)^-1/2``: Gaussians on the same data; the reduction dp_accounting's
  RDP accountant makes). dp_accounting's PLDAccountant refuses a Poisson sample of a
  composition, which every round of ``run_event`` at ``q < 1`` is."""
  if isinstance(event, dp_accounting.ComposedDpEvent):
    events = [_pld_ready(e) for e in event.events]
    if events and all(isinstance(e, dp_accounting.GaussianDpEvent) for e in events):
      return dp_accounting.GaussianDpEvent(sum(e.noise_multiplier**-2 for e in events) ** -0.5)
    return dp_accounting.ComposedDpEvent(events)
  if isinstance(event, dp_accounting.SelfComposedDpEvent):
    return dp_accounting.SelfComposedDpEvent(_pld_ready(event.event), event.count)
  if isinstance(event, dp_accounting.PoissonSampledDpEvent):
    return dp_accounting.PoissonSampledDpEvent(event.sampling_probability, _pld_ready(event.event))
  return event


def _fresh_pld(event) -> float:
  accountant = pld.PLDAccountant(value_discretization_interval=fedco.privacy.PLD_DISCRETIZATION)
  return accountant.compose(_pld_ready(event)).get_epsilon(DELTA)


def test_the_pld_ready_event_is_the_same_for_rdp():
  for args, init in [((1.1, 0.1, 3, 10), 2), ((0.8, 0.01, 1, 5), 0), ((2.0, 1.0, 3, 4), 1)]:
    event = fedco.privacy.run_event(*args, init_messages=init)
    by_rdp = [rdp.RdpAccountant().compose(e).get_epsilon(DELTA) for e in (event, _pld_ready(event))]
    np.testing.assert_allclose(by_rdp[0], by_rdp[1], rtol=1e-9, err_msg=str(args))
  with pytest.raises(dp_accounting.UnsupportedEventError):  # why _pld_ready exists
    pld.PLDAccountant().compose(fedco.privacy.run_event(1.1, 0.1, 1, 10))


# Unsorted, repeated counts: epsilon_spent composes them in increasing order and answers in
# the order asked.
COUNTS = [10, 1, 25, 10, 0]


@pytest.mark.parametrize(
  "noise_multiplier, sampling_rate, messages, init_messages",
  [(1.1, 0.01, 1, 0), (0.8, 0.1, 1, 1), (1.1, 0.1, 3, 2), (2.0, 1.0, 3, 1), (1.1, 1.0, 1, 0)],
)
def test_pld_equals_a_fresh_accountant_on_the_runs_event(
  noise_multiplier, sampling_rate, messages, init_messages
):
  # At q = 1 epsilon_spent's epsilon is the Gaussian's exact one, the accountant's is on its
  # grid: they agree to about 1e-7 (above epsilon 0.1).
  mine = fedco.privacy.epsilon_spent(
    noise_multiplier, sampling_rate, messages, COUNTS, DELTA,
    init_messages=init_messages, accountant="pld",
  )  # fmt: skip
  for t, eps in zip(COUNTS, mine):
    if t == 0:  # run_event needs a round; before round 1 only the at_init means count
      event = fedco.privacy.init_event(noise_multiplier, init_messages)
      expected = _fresh_pld(event) if init_messages else 0.0
    else:
      event = fedco.privacy.run_event(
        noise_multiplier, sampling_rate, messages, t, init_messages=init_messages
      )
      expected = _fresh_pld(event)
    np.testing.assert_allclose(eps, expected, rtol=1e-6, atol=1e-9, err_msg=f"t={t}")


def test_pld_without_noise_or_rounds():
  for accountant in ("rdp", "pld"):
    spent = functools.partial(fedco.privacy.epsilon_spent, accountant=accountant)
    assert spent(0.0, 0.1, 2, 3, DELTA) == math.inf
    assert spent(0.0, 0.1, 2, 0, DELTA) == 0.0
    assert spent(0.0, 0.1, 2, 0, DELTA, init_messages=1) == math.inf
  assert fedco.privacy.epsilon_spent(1.1, 0.1, 2, 0, DELTA, accountant="pld") == 0.0
  only_init = fedco.privacy.epsilon_spent(1.1, 0.1, 2, 0, DELTA, init_messages=1, accountant="pld")
  assert only_init == pytest.approx(_fresh_pld(dp_accounting.GaussianDpEvent(1.1)), rel=1e-9)


# ---- calibrate ---------------------------------------------------------------------------


def test_calibrate_by_pld_hits_the_target_with_less_noise_than_rdp():
  target, q, m, rounds, rtol = 2.0, 0.1, 1, 20, 1e-4
  z_pld = fedco.privacy.calibrate(target, DELTA, q, m, rounds, rtol=rtol, accountant="pld")
  spent = lambda z: fedco.privacy.epsilon_spent(z, q, m, rounds, DELTA, accountant="pld")
  # The bracket calibrate ends on: z spends at most the target, z less rtol more than it.
  assert spent(z_pld) <= target < spent(z_pld * (1 - rtol))
  assert spent(z_pld) == pytest.approx(target, rel=rtol)  # measured: 6e-5 below
  # RDP needs more noise for the same target: 1.484 against 1.362 (measured; 1% is enough
  # precision for RDP's z here, and ten bisection steps cheaper).
  z_rdp = fedco.privacy.calibrate(target, DELTA, q, m, rounds, rtol=1e-2)
  assert z_pld < 0.95 * z_rdp, (z_pld, z_rdp)


# ---- bad accountants ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["RDP", "moments", "pld ", None, 1])
def test_a_bad_accountant_is_refused_in_one_line(bad):
  calls = {
    "epsilon_spent": lambda: fedco.privacy.epsilon_spent(1.0, 0.1, 1, 10, DELTA, accountant=bad),
    "epsilon_spent z=0": lambda: fedco.privacy.epsilon_spent(
      0.0, 0.1, 1, 10, DELTA, accountant=bad
    ),
    "calibrate": lambda: fedco.privacy.calibrate(8.0, DELTA, 0.1, 1, 10, accountant=bad),
    "gaussian": lambda: fedco.privacy.gaussian(1.0, noise_multiplier=1.0, accountant=bad),
  }
  for name, call in calls.items():
    with pytest.raises(ValueError) as raised:
      call()
    message = str(raised.value)
    assert "\n" not in message, name
    assert message.startswith("accountant must be one of 'rdp', 'pld'"), (name, message)
    assert message.endswith(f"got {bad!r}"), (name, message)


def test_the_mechanism_carries_its_accountant():
  assert fedco.privacy.gaussian(1.0, noise_multiplier=1.0).accountant == "rdp"
  dp = fedco.privacy.gaussian(1.0, epsilon=4.0, accountant="pld")
  assert dp.accountant == "pld" and dp.over(10).accountant == "pld"


def test_a_run_accounts_with_the_mechanisms_accountant():
  """``gaussian(..., accountant="pld")`` reaches the run: its calibrated noise is smaller
  than RDP's for the same target, its per-round epsilon ends at the target, and the ledger
  says which accountant."""
  import jax.numpy as jnp

  import fedco

  rng = np.random.default_rng(0)
  data = fedco.FederatedData.from_clients(
    [{"x": rng.normal(size=(5, 2)).astype(np.float32)} for _ in range(20)]
  )
  problem = fedco.problems.plain(lambda w, e: 0.5 * jnp.sum((w - e["x"]) ** 2))
  runs = {}
  for name in ("rdp", "pld"):
    runs[name] = fedco.simulate(
      problem,
      fedco.fedavg(0.1, 1, weighting="uniform"),
      data,
      jnp.zeros(2),
      rounds=10,
      batch_size=None,
      clients_per_round=4,
      evaluate=False,
      progress=False,
      privacy=fedco.privacy.gaussian(1.0, epsilon=3.0, accountant=name),
    )
  z = {k: r.ledger["uplink"]["noise_multiplier"] for k, r in runs.items()}
  assert z["pld"] < z["rdp"]
  for name, run in runs.items():
    assert float(run.metrics["epsilon"][-1]) == pytest.approx(3.0, rel=1e-3), name
    assert run.ledger["uplink"]["epsilon"] == pytest.approx(3.0, rel=1e-3), name
  assert runs["pld"].ledger["uplink"]["accountant"] == "pld"
  assert "accountant" not in runs["rdp"].ledger["uplink"]
