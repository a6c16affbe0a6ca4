"""DP-FTRL with tree aggregation (Kairouz et al. 2021; issue 48, item 3).

A float64 NumPy transcription of DP-FTRLM (the server TensorFlow Federated's DP-FTRL uses:
a running sum of the rounds' mean clipped changes, released through a binary tree whose
nodes each carry their own noise, momentum on the noisy prefix sums, the model stepped from
the tree's start, a restart every epoch) against the server, round by round, over three
trees with dropped clients; the tree's noise (each node drawn once, shared by every prefix
that uses it, the right variance); the accounting against ``dp_accounting``; the
``"epochs"`` client schedule; runs, the epsilon they report, and refusals.
"""

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting import rdp

import fedco
from fedco.algorithms.core import ftrl
from fedco.runtime import streaming

# ---- the server against its transcription --------------------------------------------------


def _dyadic_nodes(t):
  """The tree nodes ``(level, index)`` whose ranges tile ``[1, t]``, left to right: the
  largest aligned block from each start (node ``(l, j)`` covers ``(j-1) 2^l + 1 .. j 2^l``)."""
  nodes, start = [], 1
  while start <= t:
    level = 0
    while (start - 1) % 2 ** (level + 1) == 0 and start + 2 ** (level + 1) - 1 <= t:
      level += 1
    nodes.append((level, (start - 1) // 2**level + 1))
    start += 2**level
  return nodes


def test_dyadic_nodes_tile_the_prefix():
  for t in range(1, 40):
    covered = []
    for level, j in _dyadic_nodes(t):
      covered += list(range((j - 1) * 2**level + 1, j * 2**level + 1))
    assert covered == list(range(1, t + 1))
    assert len(_dyadic_nodes(t)) == bin(t).count("1")


class _Transcription:
  """DP-FTRLM in float64 NumPy: restart every ``per_tree`` rounds (start = the current
  model, sum and buffer zero, the round's key the tree's), the round's gradient
  ``-sum(alive clipped changes) / m``, the noisy prefix sum from the tree's nodes, momentum,
  ``x = x0 - lr * direction``."""

  def __init__(self, x, lr, mu, nesterov, std, per_tree, m, efficient=False):
    self.x, self.lr, self.mu, self.nesterov = x, lr, mu, nesterov
    self.std, self.per_tree, self.m, self.efficient = std, per_tree, m, efficient
    self.step = per_tree

  def own(self, level, index):
    noise = ftrl.node_noise(self.key, level, index, {"params": jnp.zeros(self.x.shape)}, 1.0)
    return self.std * np.asarray(noise["params"], np.float64)

  def node(self, level, index):
    """A node's noise: its own, or Honaker's inverse-variance combination of its own with
    its two children's estimates (variances sigma^2 and 2 v_(l-1)), recursively."""
    if not self.efficient or level == 0:
      return self.own(level, index)
    v_child = lambda l: 1.0 if l == 0 else 1 / (1 + 1 / (2 * v_child(l - 1)))
    w = 1 / (1 + 1 / (2 * v_child(level - 1)))  # own's share of the inverse variances
    children = self.node(level - 1, 2 * index - 1) + self.node(level - 1, 2 * index)
    return w * self.own(level, index) + (1 - w) * children

  def round(self, uploads, alive, key):
    if self.step == self.per_tree:
      self.x0, self.total, self.buffer = self.x.copy(), 0 * self.x, 0 * self.x
      self.key, self.step = np.asarray(key), 0
    self.step += 1
    changes = [u - self.x for u, a in zip(uploads, alive) if a]
    self.total = self.total - sum(changes, 0 * self.x) / self.m
    noisy = self.total + sum((self.node(*n) for n in _dyadic_nodes(self.step)), 0 * self.x)
    self.buffer = self.mu * self.buffer + noisy
    direction = self.mu * self.buffer + noisy if self.nesterov else self.buffer
    self.x = self.x0 - self.lr * direction
    return self.x


@pytest.mark.parametrize(
  "mu, nesterov, efficient",
  [(0.0, False, False), (0.9, False, False), (0.5, True, False), (0.9, False, True)],
)
def test_ftrl_server_matches_its_float64_transcription(mu, nesterov, efficient):
  m, per_tree, lr, std = 4, 5, 0.7, 0.3
  rng = np.random.default_rng(1)
  with jax.enable_x64(True):
    server = ftrl.ftrl_aggregator(
      lr,
      noise_std=std,
      rounds_per_tree=per_tree,
      clients_per_round=m,
      momentum=mu,
      nesterov=nesterov,
      efficient=efficient,
    )
    values = {"params": jnp.asarray(rng.normal(size=3))}
    state = server.init(values, jnp.ones(m, int))
    x = np.asarray(values["params"])
    reference = _Transcription(x, lr, mu, nesterov, std, per_tree, m, efficient)
    update = jax.jit(server.update)
    for r in range(3 * per_tree):  # three trees
      uploads = values["params"][None] + jnp.asarray(rng.normal(size=(m, 3)))
      alive = jnp.asarray(rng.random(m) > 0.25)
      key = jax.random.fold_in(jax.random.PRNGKey(7), r)
      info = fedco.extend.RoundInfo(
        ids=jnp.arange(m),
        weights=jnp.full(m, 1 / m),
        counts=jnp.ones(m, int),
        num_clients=10,
        key=key,
        client_losses=None,
        alive=alive,
      )
      values, state = update(values, state, {"params": uploads}, info)
      expected = reference.round(list(np.asarray(uploads)), list(np.asarray(alive)), key)
      np.testing.assert_allclose(np.asarray(values["params"]), expected, rtol=1e-12, atol=1e-12)
    assert int(state.step) == per_tree


def test_prefix_noise_reuses_each_node_and_has_the_trees_variance():
  key, like = jax.random.PRNGKey(3), {"a": jnp.zeros(2), "b": jnp.zeros((3,))}
  noise = lambda t: ftrl.prefix_noise(key, t, like, 1.0, 4)
  node = lambda level, j: ftrl.node_noise(key, level, j, like, 1.0)
  # 7 = nodes (2, 1) + (1, 3) + (0, 7); 6 = (2, 1) + (1, 3): they differ by leaf 7 exactly
  diff = jax.tree.map(jnp.subtract, noise(7), noise(6))
  close = lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # float32 sums
  jax.tree.map(close, diff, node(0, 7))
  eight = jax.tree.map(np.asarray, noise(8))
  jax.tree.map(np.testing.assert_array_equal, eight, node(3, 1))
  # the variance of step t's noise is popcount(t) std^2 (20,000 keys, one coordinate)
  keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
  one = jnp.zeros(())
  for t, bits in ((1, 1), (6, 2), (7, 3), (15, 4)):
    draws = jax.vmap(lambda k, t=t: ftrl.prefix_noise(k, t, one, 0.5, 4))(keys)
    assert abs(float(jnp.var(draws)) / (bits * 0.25) - 1) < 0.05, t


def test_efficient_prefix_noise_has_honakers_variance():
  """Step ``2^l``'s prefix is one node of level ``l``: variance ``2^l / (2^(l+1) - 1)``
  (1, 2/3, 4/7, 8/15) of the plain node's; step 7 the sum of levels 2, 1, 0."""
  keys = jax.random.split(jax.random.PRNGKey(0), 20_000)

  def run(key):
    latest, out = jnp.zeros((4,)), []
    for t in range(1, 9):
      noise, latest = ftrl.efficient_prefix_noise(key, t, latest, 0.5, 4)
      out.append(noise)
    return jnp.stack(out)

  var = np.var(np.asarray(jax.jit(jax.vmap(run))(keys)), axis=0) / 0.25
  for t, expected in ((1, 1.0), (2, 2 / 3), (4, 4 / 7), (8, 8 / 15), (7, 4 / 7 + 2 / 3 + 1)):
    assert abs(var[t - 1] / expected - 1) < 0.05, (t, var[t - 1], expected)


# ---- accounting ---------------------------------------------------------------------------


@pytest.mark.parametrize("z, per_tree, rounds", [(1.0, 10, 10), (3.0, 7, 25), (0.8, 1, 5)])
def test_tree_accounting_is_dp_accountings(z, per_tree, rounds):
  accountant = rdp.RdpAccountant(
    neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL
  )
  expected = accountant.compose(fedco.privacy.tree_event(z, per_tree, rounds)).get_epsilon(1e-5)
  got = fedco.privacy.tree_epsilon_spent(z, per_tree, rounds, 1e-5)
  assert got == pytest.approx(expected, rel=1e-12)
  # zCDP: rho = (trees x depth) / (2 z^2), and the RDP conversion is at least as tight
  # as rho + 2 sqrt(rho log(1/delta))
  trees, rest = divmod(rounds, per_tree)
  rho = (trees * ftrl.tree_depth(per_tree) + ftrl.tree_depth(rest)) / (2 * z**2)
  assert got <= rho + 2 * np.sqrt(rho * np.log(1e5)) + 1e-12
  z_back = fedco.privacy.tree_calibrate(got, 1e-5, per_tree, rounds)
  assert z_back == pytest.approx(z, rel=1e-5)


def test_tree_accounting_grows_with_depth_then_with_trees():
  eps = fedco.privacy.tree_epsilon_spent(4.0, 8, [0, 1, 2, 3, 4, 8, 9, 16, 64], 1e-5)
  assert eps[0] == 0
  assert eps[1] < eps[2] == eps[3] < eps[4] < eps[5]  # depths 1, 2, 2, 3, 4 of 8 steps
  assert eps[5] < eps[6] < eps[7] < eps[8]
  assert fedco.privacy.tree_epsilon_spent(0.0, 8, 3, 1e-5) == np.inf


# ---- the "epochs" client schedule ----------------------------------------------------------


def _quadratic(k=10):
  rng = np.random.default_rng(0)
  return fedco.FederatedData.from_clients(
    [{"x": (1 + 0.1 * c + 0.05 * rng.normal(size=(4, 2))).astype(np.float32)} for c in range(k)]
  )


PROBLEM = fedco.problems.plain(lambda w, e: 0.5 * jnp.sum((w - e["x"]) ** 2))
ALGORITHM = fedco.fedavg(0.2, 2, weighting="uniform")


def test_epoch_schedule_visits_each_client_once_an_epoch():
  data = _quadratic(10)
  run = fedco.simulate(
    PROBLEM,
    ALGORITHM,
    data,
    jnp.zeros(2),
    rounds=9,
    clients_per_round=3,
    sampling="epochs",
    batch_size=None,
    evaluate=False,
    seed=4,
  )
  clients = np.asarray(run.metrics["clients"])
  epochs = clients.reshape(3, 3, 3)  # 3 epochs of 10 // 3 = 3 rounds
  for epoch in epochs:
    assert len(set(epoch.ravel().tolist())) == 9  # nobody twice; one client sits out
  assert not np.array_equal(epochs[0], epochs[1])
  # a streamed run replays the same schedule from the state's first key
  from fedco.runtime import paging

  key = paging.state_key(fedco.Simulator.seed_key(4))
  np.testing.assert_array_equal(streaming.schedule(key, 10, 3, 9, "epochs"), clients)


# ---- runs ---------------------------------------------------------------------------------


def test_noiseless_dp_ftrl_is_clipped_fedavg():
  """z = 0, momentum 0, rate 1: x_t = x_0 + the sum of the mean clipped changes, FedAvg's
  steps under the same clipping."""
  data = _quadratic(10)
  kw = dict(rounds=6, clients_per_round=5, sampling="epochs", batch_size=None, evaluate=False)
  with jax.enable_x64(True):
    x0 = jnp.zeros(2, jnp.float64)
    fixed = fedco.privacy.gaussian(0.05, noise_multiplier=0.0)
    tree = fedco.privacy.dp_ftrl(0.05, noise_multiplier=0.0)
    a = fedco.simulate(PROBLEM, ALGORITHM, data, x0, privacy=fixed, **kw)
    b = fedco.simulate(PROBLEM, ALGORITHM, data, x0, privacy=tree, **kw)
  np.testing.assert_allclose(np.asarray(b.params), np.asarray(a.params), rtol=1e-12)
  assert np.linalg.norm(np.asarray(a.params)) > 0.1  # it moved (clipped at 0.05 a round)


def test_a_private_run_reports_the_trees_epsilon():
  data = _quadratic(10)
  dp = fedco.privacy.dp_ftrl(0.1, momentum=0.9, epsilon=6.0)
  kw = dict(rounds=8, clients_per_round=2, sampling="epochs", batch_size=None, evaluate=False)
  a = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), privacy=dp, **kw)
  b = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), privacy=dp, **kw)
  np.testing.assert_array_equal(np.asarray(a.params), np.asarray(b.params))  # per seed
  eps = np.asarray(a.metrics["epsilon"])
  assert eps[-1] == pytest.approx(6.0, rel=1e-4)
  z = fedco.privacy.tree_calibrate(6.0, 1e-5, 5, 8)
  np.testing.assert_allclose(eps, fedco.privacy.tree_epsilon_spent(z, 5, np.arange(1, 9), 1e-5))
  uplink = a.ledger["uplink"]
  assert uplink["mechanism"] == "dp_ftrl" and uplink["rounds_per_tree"] == 5
  assert uplink["epsilon"] == pytest.approx(6.0, rel=1e-4)
  # the noise is there: the same run without it ends elsewhere
  quiet = fedco.privacy.dp_ftrl(0.1, momentum=0.9, noise_multiplier=0.0)
  c = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), privacy=quiet, **kw)
  assert float(jnp.max(jnp.abs(c.params - a.params))) > 1e-3


def test_dp_ftrl_refusals_are_one_line():
  data = _quadratic(6)
  x0 = jnp.zeros(2)
  dp = fedco.privacy.dp_ftrl(0.1, noise_multiplier=1.0)
  run = lambda alg, **kw: fedco.simulate(
    PROBLEM, alg, data, x0, rounds=2, batch_size=None, privacy=dp, **kw
  )
  kl = fedco.problems.client_kl_dro_log(lambda w, e: jnp.sum((w - e["x"]) ** 2), 1.0, 6)
  cases = [
    (lambda: run(ALGORITHM, clients_per_round=2), "sampling='epochs'"),
    (lambda: run(fedco.fedavg(0.1, 2)), "uniform client weights"),
    (lambda: run(ALGORITHM, aggregation=fedco.byzantine.coordinate_median()), "aggregation"),
    (
      lambda: fedco.simulate(
        kl, fedco.feddro(0.1, 2), data.with_owner(), x0, rounds=2, batch_size=None, privacy=dp
      ),
      "covers the model only",
    ),
    (lambda: run(ALGORITHM, sampling="cyclic"), "sampling must be one of"),
    (lambda: fedco.privacy.dp_ftrl(0.1, momentum=1.0, noise_multiplier=1.0), "momentum"),
    (lambda: fedco.privacy.dp_ftrl(0.1, nesterov=True, noise_multiplier=1.0), "nesterov"),
    (lambda: fedco.privacy.dp_ftrl(0.1), "exactly one of"),
    (lambda: fedco.privacy.dp_ftrl(-1.0, noise_multiplier=1.0), "clip"),
  ]
  for call, match in cases:
    with pytest.raises(ValueError, match=match) as err:
      call()
    assert "\n" not in str(err.value)


def test_the_ftrl_server_passes_the_contract_kit():
  @fedco.extend.factory(static=("local_steps",))
  def ftrl_fedavg(learning_rate: float, local_steps: int = 3, *, optimizer=None):
    del optimizer
    server = ftrl.ftrl_aggregator(
      1.0, noise_std=0.01, rounds_per_tree=4, clients_per_round=3, momentum=0.9, efficient=True
    )
    return fedco.fedavg(learning_rate, local_steps, weighting="uniform").replace(server=server)

  results = fedco.testing.check_algorithm(ftrl_fedavg, learning_rate=0.05, local_steps=3)
  assert all(v == "passed" or v.startswith("skipped") for v in results.values()), results
  for check in ("inject", "simulate", "server", "sweep", "resume"):
    assert results[check] == "passed", results


def test_a_dp_ftrl_run_resumes_mid_tree(tmp_path):
  """The epoch's key and the tree's state are in the checkpoint: 7 rounds, then 2 more,
  equal 9 straight (trees of 5 rounds: the checkpoint lands inside the second)."""
  data = _quadratic(10)
  dp = fedco.privacy.dp_ftrl(0.1, momentum=0.9, noise_multiplier=0.5)
  kw = dict(clients_per_round=2, sampling="epochs", batch_size=None, evaluate=False)
  straight = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), rounds=9, privacy=dp, **kw)
  first = fedco.simulate(
    PROBLEM,
    ALGORITHM,
    data,
    jnp.zeros(2),
    rounds=7,
    privacy=dp,
    checkpoint_dir=tmp_path,
    checkpoint_every=7,
    **kw,
  )
  assert first.state.round == 7
  resumed = fedco.simulate(
    PROBLEM, ALGORITHM, data, jnp.zeros(2), rounds=9, privacy=dp, checkpoint_dir=tmp_path, **kw
  )
  np.testing.assert_array_equal(np.asarray(resumed.params), np.asarray(straight.params))
  np.testing.assert_array_equal(
    np.asarray(resumed.metrics["clients"]), np.asarray(straight.metrics["clients"])
  )


def test_an_experiment_method_asks_for_dp_ftrl_in_its_privacy_entry():
  import ml_collections

  from fedco.experiment import config_methods

  entry = ml_collections.ConfigDict(
    {"privacy": {"mechanism": "dp_ftrl", "clip": 0.5, "epsilon": 4.0, "momentum": 0.9}}
  )
  settings = config_methods.uplink_settings("--config.methods.m", entry)
  method = config_methods.Method("m", "fedavg", {}, 0.1, 2, uplink=settings)
  built = method.simulator_kwargs()
  assert isinstance(built["privacy"], fedco.privacy.TreeDP)
  assert built["privacy"].momentum == 0.9 and built["sampling"] == "epochs"
  plain = ml_collections.ConfigDict({"privacy": {"clip": 0.5, "epsilon": 4.0}})
  method = config_methods.Method(
    "m", "fedavg", {}, 0.1, 2, uplink=config_methods.uplink_settings("--config.methods.m", plain)
  )
  assert isinstance(method.simulator_kwargs()["privacy"], fedco.privacy.ClientDP)
  assert "sampling" not in method.simulator_kwargs()
  for bad, match in (
    ({"mechanism": "tree", "clip": 0.5, "epsilon": 4.0}, "privacy.mechanism must be one of"),
    (
      {"mechanism": "dp_ftrl", "clip": 0.5, "epsilon": 4.0, "adaptive": {"target_quantile": 0.5}},
      "privacy.adaptive is not a privacy setting",
    ),
  ):
    with pytest.raises(ValueError, match=match):
      config_methods.uplink_settings(
        "--config.methods.m", ml_collections.ConfigDict({"privacy": bad})
      )


def test_an_experiment_method_sets_its_own_cohort_and_flips_labels():
  """``participation`` (a method's cohort and schedule) wins over the experiment's
  ``run.simulate``; ``byzantine.kind: "label_flip"`` flips the attack's clients' labels in
  the method's training data only."""
  import types

  import ml_collections

  from fedco.experiment import config_methods, runner

  entry = ml_collections.ConfigDict(
    {
      "participation": {"clients_per_round": 3, "sampling": "epochs"},
      "byzantine": {"fraction": 0.4, "kind": "label_flip", "seed": 1},
    }
  )
  settings = config_methods.uplink_settings("--config.methods.m", entry)
  method = config_methods.Method("m", "fedavg", {}, 0.1, 2, uplink=settings)
  run = types.SimpleNamespace(simulate={"evaluate": False, "clients_per_round": 5})
  kwargs = runner.simulate_kwargs(method, run)
  assert kwargs == {"evaluate": False, "clients_per_round": 3, "sampling": "epochs"}
  data = fedco.FederatedData.from_clients(
    [{"x": np.zeros((3, 1)), "y": np.array([0, 1, 4])} for _ in range(5)]
  )
  flipped = method.training_data(data)
  bad = set(fedco.byzantine.attack(0.4, seed=1).clients(5).tolist())
  assert len(bad) == 2
  for k in range(5):
    expected = [4, 3, 0] if k in bad else [0, 1, 4]  # C = 5 (largest label + 1)
    assert flipped.client(k)["y"].tolist() == expected
  plain = config_methods.Method("p", "fedavg", {}, 0.1, 2)
  assert plain.training_data(data) is data
  assert runner.simulate_kwargs(plain, run) == run.simulate


def test_a_streamed_dp_ftrl_run_is_the_in_memory_one(tmp_path):
  """The host replays the ``"epochs"`` schedule to read each chunk's clients ahead: the
  streamed run samples the same clients and ends at the same model, bit for bit."""
  data = _quadratic(10)
  store = fedco.data.write_store(tmp_path / "clients", [data.client(k) for k in range(10)])
  dp = fedco.privacy.dp_ftrl(0.1, momentum=0.9, noise_multiplier=0.5)
  kw = dict(
    rounds=9, clients_per_round=2, sampling="epochs", batch_size=2, evaluate=False, privacy=dp
  )
  memory = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), **kw)
  streamed = fedco.simulate(PROBLEM, ALGORITHM, store, jnp.zeros(2), chunk_rounds=3, **kw)
  np.testing.assert_array_equal(np.asarray(streamed.params), np.asarray(memory.params))
  np.testing.assert_array_equal(
    np.asarray(streamed.metrics["clients"]), np.asarray(memory.metrics["clients"])
  )


def test_dp_ftrl_seeds_in_one_sweep_are_the_separate_runs():
  """``fedco.sweep`` vmaps the runs: each keeps its own epoch key, tree key and buffers."""
  data = _quadratic(10)
  dp = fedco.privacy.dp_ftrl(0.1, momentum=0.9, noise_multiplier=0.5)
  kw = dict(
    rounds=6, clients_per_round=2, sampling="epochs", batch_size=None, evaluate=False, privacy=dp
  )
  swept = fedco.sweep(PROBLEM, ALGORITHM, data, jnp.zeros(2), seeds=[0, 1], **kw)
  for r, seed in enumerate((0, 1)):
    alone = fedco.simulate(PROBLEM, ALGORITHM, data, jnp.zeros(2), seed=seed, **kw)
    np.testing.assert_allclose(
      np.asarray(swept.simulation(r).params), np.asarray(alone.params), rtol=1e-6
    )
  assert not np.allclose(np.asarray(swept.simulation(0).params), swept.simulation(1).params)
