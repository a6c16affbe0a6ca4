"""Byzantine-robust aggregation and Byzantine clients (issue 48, items 4 and 5).

Each rule against a float64 NumPy transcription of its paper's definition (surviving clients
only, ties broken by slot); the rules as servers through the contract kit; a run's
``aggregation=`` reaching the model and the state fields (FedDRO's ``y`` after every step,
AFL's model step); the attack kinds, their clients and their refusals.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import byzantine, testing

M = 7


def _uploads(seed=0, m=M):
  rng = np.random.default_rng(seed)
  values = {"a": rng.normal(size=(m, 3)), "b": rng.normal(size=(m, 2, 2))}
  values["a"][2] += 40.0  # an outlier
  alive = np.array([True, True, True, False, True, True, True][:m])
  weights = rng.uniform(0.5, 2.0, size=m) * alive
  return values, weights / weights.sum(), alive


def _flat(values):
  return np.concatenate([values["a"].reshape(M, -1), values["b"].reshape(M, -1)], 1)


def _unflat(vector):
  return {"a": vector[:3], "b": vector[3:].reshape(2, 2)}


# ---- NumPy transcriptions ----------------------------------------------------------------


def np_median(values, weights, alive):
  del weights
  return {k: np.median(v[alive], axis=0) for k, v in values.items()}


def np_trimmed(beta):
  def rule(values, weights, alive):
    del weights
    n = alive.sum()
    b = int(np.floor(beta * n))
    return {k: np.sort(v[alive], axis=0)[b : n - b].mean(axis=0) for k, v in values.items()}

  return rule


def np_krum_scores(x, alive, f):
  live = np.flatnonzero(alive)
  n = len(live)
  k = max(n - f - 2, 1)
  scores = {}
  for i in live:
    d = sorted(float(np.sum((x[i] - x[j]) ** 2)) for j in live if j != i)
    scores[i] = sum(d[:k])
  return scores


def np_multi_krum(f, m):
  def rule(values, weights, alive):
    del weights
    x = _flat(values)
    scores = np_krum_scores(x, alive, f)
    chosen = sorted(scores, key=lambda i: (scores[i], i))[:m]
    return _unflat(x[chosen].mean(axis=0))

  return rule


def np_centered_clipping(tau, iterations, centered):
  def rule(values, weights, alive):
    x = _flat(values)
    w = np.where(alive, weights, 0)
    w = w / w.sum()
    v = np.zeros(x.shape[1]) if centered else np.median(x[alive], axis=0)
    for _ in range(iterations):
      step = np.zeros_like(v)
      for i in np.flatnonzero(alive):
        d = x[i] - v
        step += w[i] * d * min(1.0, tau / np.linalg.norm(d))
      v = v + step
    return _unflat(v)

  return rule


CASES = [
  ("mean", byzantine.mean(), lambda v, w, a: {k: np.tensordot(w, x, 1) for k, x in v.items()}),
  ("median", byzantine.coordinate_median(), np_median),
  ("trimmed_0", byzantine.trimmed_mean(0.0), np_trimmed(0.0)),
  ("trimmed_0.2", byzantine.trimmed_mean(0.2), np_trimmed(0.2)),
  ("trimmed_0.49", byzantine.trimmed_mean(0.49), np_trimmed(0.49)),
  ("krum", byzantine.krum(1), np_multi_krum(1, 1)),
  ("krum_f0", byzantine.krum(0), np_multi_krum(0, 1)),
  ("multi_krum", byzantine.multi_krum(2, 3), np_multi_krum(2, 3)),
  ("multi_krum_all", byzantine.multi_krum(1, 50), np_multi_krum(1, 50)),
  ("cc_1", byzantine.centered_clipping(0.5), np_centered_clipping(0.5, 1, True)),
  ("cc_3", byzantine.centered_clipping(2.0, 3), np_centered_clipping(2.0, 3, True)),
]


@pytest.mark.parametrize("name,rule,reference", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", [0, 1])
def test_rule_matches_its_float64_transcription(name, rule, reference, seed):
  del name
  values, weights, alive = _uploads(seed)
  with jax.enable_x64(True):
    got = rule({k: jnp.asarray(v) for k, v in values.items()}, jnp.asarray(weights), alive)
    want = reference(values, weights, alive)
    for k in values:
      np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-10, atol=1e-12)


def test_centered_clipping_on_values_starts_at_the_median():
  values, weights, alive = _uploads(3)
  rule = byzantine.centered_clipping(1.0, 2)
  with jax.enable_x64(True):
    got = rule({k: jnp.asarray(v) for k, v in values.items()}, weights, alive, centered=False)
  want = np_centered_clipping(1.0, 2, False)(values, weights, alive)
  for k in values:
    np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6)


def test_dead_slots_never_count_even_when_huge():
  values, weights, alive = _uploads(0)
  values["a"][3] = 1e30  # the dropped client
  for _, rule, reference in CASES:
    got = rule({k: jnp.asarray(v, jnp.float32) for k, v in values.items()}, weights, alive)
    want = reference(values, weights, alive)
    np.testing.assert_allclose(np.asarray(got["a"]), want["a"], rtol=2e-4, atol=2e-4)


def test_a_round_nobody_survived_gives_zero_not_nan():
  values, weights, _ = _uploads(0)
  dead = np.zeros(M, bool)
  for _, rule, _ in CASES:
    got = rule({k: jnp.asarray(v, jnp.float32) for k, v in values.items()}, weights * 0, dead)
    assert all(np.all(np.isfinite(np.asarray(a))) for a in jax.tree.leaves(got)), rule.name


def test_rules_refuse_bad_settings_in_one_line():
  for call, match in [
    (lambda: byzantine.trimmed_mean(0.5), "beta"),
    (lambda: byzantine.trimmed_mean(-0.1), "beta"),
    (lambda: byzantine.krum(-1), "f"),
    (lambda: byzantine.multi_krum(1, 0), "m"),
    (lambda: byzantine.centered_clipping(0.0), "tau"),
    (lambda: byzantine.centered_clipping(1.0, 0), "iterations"),
    (lambda: byzantine.attack(1.0), "fraction"),
    (lambda: byzantine.attack(0.1, "flip"), "kind"),
    (lambda: byzantine.attack(0.1, "gaussian", scale=0.0), "scale"),
    (lambda: byzantine.attack(0.1, fields=[]), "fields"),
    (lambda: byzantine.robust_server("median"), "aggregation"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      call()
    assert "\n" not in str(err.value)


# ---- the rules as servers ---------------------------------------------------------------


RULES = {
  "median": byzantine.coordinate_median(),
  "trimmed": byzantine.trimmed_mean(0.2),
  "krum": byzantine.krum(0),
  "multi_krum": byzantine.multi_krum(0, 2),
  "centered_clipping": byzantine.centered_clipping(0.5, 2),
}


@pytest.mark.parametrize("name", sorted(RULES))
def test_robust_servers_pass_the_contract_kit(name):
  rule = RULES[name]

  @fedco.extend.factory(static=("local_steps",))
  def robust_fedavg(learning_rate: float, local_steps: int = 3, *, optimizer=None):
    del optimizer
    return fedco.fedavg(learning_rate, local_steps).replace(server=byzantine.robust_server(rule))

  results = testing.check_algorithm(robust_fedavg, learning_rate=0.05, local_steps=3)
  assert all(v == "passed" or v.startswith("skipped") for v in results.values()), results
  for check in ("inject", "simulate", "server", "sweep", "resume"):
    assert results[check] == "passed", results


# ---- a run's aggregation and attack ------------------------------------------------------


def _quadratic(k=10, n=6, seed=0):
  """Client k's examples around 1 + 0.1 k: the optimum of their mean is about 1.45."""
  rng = np.random.default_rng(seed)
  clients = [
    {"x": (1.0 + 0.1 * c + 0.1 * rng.normal(size=(n, 2))).astype(np.float32)} for c in range(k)
  ]
  problem = fedco.problems.plain(lambda w, e: 0.5 * jnp.sum((w - e["x"]) ** 2))
  return problem, fedco.FederatedData.from_clients(clients)


def _run(algorithm, rounds=30, **options):
  problem, data = _quadratic()
  return fedco.simulate(
    problem,
    algorithm,
    data,
    jnp.zeros(2),
    rounds=rounds,
    batch_size=None,
    seed=0,
    evaluate=False,
    **options,
  )


def test_the_mean_rule_and_an_attack_of_nobody_change_nothing():
  plain = _run(fedco.fedavg(0.3, 2), rounds=5).params
  ruled = _run(fedco.fedavg(0.3, 2), rounds=5, aggregation=byzantine.mean()).params
  nobody = _run(fedco.fedavg(0.3, 2), rounds=5, byzantine=byzantine.attack(0.0)).params
  np.testing.assert_allclose(ruled, plain, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(nobody, plain)


def test_sign_flipping_clients_drag_the_mean_but_not_the_median():
  attack = byzantine.attack(0.3, "sign_flip", scale=5.0)
  honest = _run(fedco.fedavg(0.3, 2)).params
  mean = _run(fedco.fedavg(0.3, 2), byzantine=attack).params
  median = _run(
    fedco.fedavg(0.3, 2), byzantine=attack, aggregation=byzantine.coordinate_median()
  ).params
  krum = _run(fedco.fedavg(0.3, 2), byzantine=attack, aggregation=byzantine.krum(3)).params
  assert not np.abs(np.asarray(mean) - np.asarray(honest)).max() < 1.0  # far, or diverged
  assert np.abs(np.asarray(median) - np.asarray(honest)).max() < 0.5
  assert np.abs(np.asarray(krum) - np.asarray(honest)).max() < 0.5


def test_the_attack_is_deterministic_and_hits_only_its_clients():
  spec = byzantine.attack(0.3, "gaussian", scale=2.0, seed=4)
  ids = spec.clients(10)
  assert ids.tolist() == byzantine.attack(0.3, seed=4).clients(10).tolist()
  assert len(ids) == 3 and ids.tolist() != byzantine.attack(0.3, seed=5).clients(10).tolist()
  a = _run(fedco.fedavg(0.3, 2), rounds=3, byzantine=spec).params
  b = _run(fedco.fedavg(0.3, 2), rounds=3, byzantine=spec).params
  np.testing.assert_array_equal(a, b)
  uploads = jnp.ones((4, 3))
  bad = jnp.array([False, True, False, True])
  keys = jax.random.split(jax.random.key(0), 4)
  out = np.asarray(byzantine.attack(0.5, "sign_flip", scale=2.0).corrupt(uploads, bad, keys))
  np.testing.assert_array_equal(out, [[1] * 3, [-2] * 3, [1] * 3, [-2] * 3])


def _dro(k=10):
  _, data = _quadratic(k)
  loss = lambda w, e: 0.5 * jnp.sum((w - e["x"]) ** 2)
  return fedco.problems.client_kl_dro_log(loss, 1.0, k), data.with_owner("client")


def test_feddro_y_reports_reach_the_rule_after_every_step():
  """Inflated ``y`` reports (the clients' inner values, sent every step) move FedDRO's
  model through the mean; the median ignores them."""
  problem, data = _dro()
  run = lambda **o: (
    fedco.simulate(
      problem,
      fedco.feddro(0.05, 3, beta=0.5),
      data,
      jnp.zeros(2),
      rounds=20,
      batch_size=None,
      seed=1,
      evaluate=False,
      progress=False,
      check_finite=False,
      **o,
    ).params
  )
  attack = byzantine.attack(0.2, "scale", scale=50.0, fields="y")
  honest, mean, median = (
    run(),
    run(byzantine=attack),
    run(byzantine=attack, aggregation=byzantine.coordinate_median()),
  )
  off = lambda p: np.abs(np.asarray(p) - np.asarray(honest)).max()
  assert not off(mean) < 1.0  # far off, or diverged (it does: NaN)
  assert off(median) < 0.1


def test_afl_takes_its_model_step_through_the_rule():
  problem, data = _quadratic()
  attack = byzantine.attack(0.2, "gaussian", scale=30.0, fields="params")
  run = lambda **o: _run(fedco.afl(0.3, weights_lr=0.01), rounds=20, **o).params
  honest, mean, median = (
    run(),
    run(byzantine=attack),
    run(byzantine=attack, aggregation=byzantine.coordinate_median()),
  )
  assert np.abs(np.asarray(mean) - np.asarray(honest)).max() > 1.0
  assert np.abs(np.asarray(median) - np.asarray(honest)).max() < 0.3


def test_a_run_refuses_what_the_rule_cannot_reach_and_unknown_attacked_fields():
  with pytest.raises(ValueError, match="aggregation cannot reach") as err:
    _run(fedco.scaffold(0.1, 2), rounds=1, aggregation=byzantine.coordinate_median())
  assert "\n" not in str(err.value)
  with pytest.raises(ValueError, match=r"byzantine.fields names \['y'\]"):
    _run(fedco.fedavg(0.1, 2), rounds=1, byzantine=byzantine.attack(0.1, fields="y"))
  with pytest.raises(ValueError, match="aggregation must be a fedco.byzantine rule"):
    _run(fedco.fedavg(0.1, 2), rounds=1, aggregation="median")
  with pytest.raises(ValueError, match="byzantine must be"):
    _run(fedco.fedavg(0.1, 2), rounds=1, byzantine=0.1)


def test_flip_labels_flips_only_the_byzantine_clients():
  clients = [{"x": np.zeros((3, 1), np.float32), "y": np.array([0, 1, 2])} for _ in range(5)]
  data = fedco.FederatedData.from_clients(clients)
  spec = byzantine.attack(0.4, seed=2)
  flipped = byzantine.flip_labels(data, spec, 3)
  bad = set(spec.clients(5).tolist())
  for k in range(5):
    want = [2, 1, 0] if k in bad else [0, 1, 2]
    assert np.asarray(flipped.client(k)["y"]).tolist() == want


# ---- in an experiment's config -------------------------------------------------------------


def test_a_methods_aggregation_and_attack_are_checked_and_built():
  import ml_collections

  from fedco.experiment import config_methods

  entry = ml_collections.ConfigDict(
    {
      "aggregation": {"rule": "multi_krum", "f": 1, "m": 3},
      "byzantine": {"fraction": 0.2, "kind": "scale", "scale": 5.0, "fields": ["loss"]},
    }
  )
  settings = config_methods.uplink_settings("--config.methods.m", entry)
  method = config_methods.Method("m", "afl", {}, 0.1, 1, uplink=settings)
  built = method.simulator_kwargs()
  assert built["aggregation"].describe() == {"rule": "multi_krum", "f": 1, "m": 3}
  assert built["byzantine"] == byzantine.attack(0.2, "scale", scale=5.0, fields="loss")
  for change, match in [
    ({"aggregation": {"rule": "kurm"}}, r"--config\.methods\.m\.aggregation\.rule"),
    ({"aggregation": {"rule": "krum", "g": 1}}, r"--config\.methods\.m\.aggregation\.g is not"),
    (
      {"aggregation": {"rule": "trimmed_mean", "beta": 0.7}},
      r"--config\.methods\.m\.aggregation: beta",
    ),
    ({"byzantine": {"fraction": 1.5}}, r"--config\.methods\.m\.byzantine: fraction"),
    ({"byzantine": 0.1}, r"--config\.methods\.m\.byzantine must be"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      config_methods.uplink_settings("--config.methods.m", ml_collections.ConfigDict(change))
    assert "\n" not in str(err.value)


def test_a_huge_byzantine_value_leaves_no_trace_in_the_median_or_trimmed_mean():
  """Float32 uploads with one surviving client at 1e30: the rules that drop it return the
  honest clients' statistic to float32 round-off (no cancellation of the outlier)."""
  values, weights, alive = _uploads(1)
  values["a"][5] = 1e30
  for rule, reference in [
    (byzantine.coordinate_median(), np_median),
    (byzantine.trimmed_mean(0.2), np_trimmed(0.2)),
  ]:
    got = rule({k: jnp.asarray(v, jnp.float32) for k, v in values.items()}, weights, alive)
    want = reference(values, weights, alive)
    for k in values:
      np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-5)
