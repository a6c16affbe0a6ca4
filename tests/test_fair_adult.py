"""E6 (fair classification on Adult): loader, proxy noise, the fairness problem, GCIVR against
a float64 NumPy transcription, and experiments.fair_adult end to end on the real data."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from experiments import fair_adult
from experiments.configs import fair_adult as fair_config
from fedco import estimators
from fedco.algorithms.gcivr import gcivr
from fedco.data import adult
from fedco.experiment import outputs, runner
from fedco.problems import fairness as fair
from tests import helpers

G = 3

# ---- loader ------------------------------------------------------------------------------

# (age, workclass, fnlwgt, education, education-num, marital-status, occupation, relationship,
#  race, sex, capital-gain, capital-loss, hours-per-week, native-country, label)
TRAIN_ROWS = [
  (
    "39",
    "State-gov",
    "77516",
    "Bachelors",
    "13",
    "Never-married",
    "Adm-clerical",
    "Not-in-family",
    "White",
    "Male",
    "2174",
    "0",
    "40",
    "United-States",
    ">50K",
  ),
  (
    "50",
    "?",
    "83311",
    "Bachelors",
    "13",
    "Married-civ-spouse",
    "Exec-managerial",
    "Husband",
    "Black",
    "Male",
    "0",
    "0",
    "13",
    "United-States",
    "<=50K",
  ),
  (
    "38",
    "Private",
    "215646",
    "HS-grad",
    "9",
    "Divorced",
    "?",
    "Not-in-family",
    "Asian-Pac-Islander",
    "Female",
    "0",
    "1900",
    "45",
    "?",
    ">50K",
  ),
  (
    "23",
    "Private",
    "234721",
    "11th",
    "7",
    "Never-married",
    "Handlers-cleaners",
    "Own-child",
    "Amer-Indian-Eskimo",
    "Female",
    "14084",
    "0",
    "60",
    "Cuba",
    "<=50K",
  ),
  (
    "61",
    "Self-emp-inc",
    "338409",
    "Masters",
    "14",
    "Married-civ-spouse",
    "Prof-specialty",
    "Wife",
    "Other",
    "Female",
    "0",
    "0",
    "40",
    "India",
    ">50K",
  ),
]
TEST_ROWS = [
  (
    "25",
    "Private",
    "226802",
    "11th",
    "7",
    "Never-married",
    "Machine-op-inspct",
    "Own-child",
    "Black",
    "Male",
    "0",
    "0",
    "40",
    "United-States",
    "<=50K",
  ),
  (
    "90",
    "Never-worked",
    "89814",
    "HS-grad",
    "9",
    "Married-civ-spouse",
    "Farming-fishing",
    "Husband",
    "White",
    "Male",
    "0",
    "0",
    "50",
    "Peru",
    ">50K",
  ),
]


def _write(folder, *, uci: bool):
  os.makedirs(folder, exist_ok=True)
  header = ", ".join(adult.COLUMNS)
  with open(os.path.join(folder, "adult.data"), "w") as f:
    if not uci:
      f.write(header + "\n")
    f.writelines(", ".join(r) + "\n" for r in TRAIN_ROWS)
    f.write("\n")
  with open(os.path.join(folder, "adult.test"), "w") as f:
    f.write("|1x3 Cross validator\n" if uci else header + "\n")
    f.writelines(", ".join(r[:-1] + ((r[-1] + ".") if uci else r[-1],)) + "\n" for r in TEST_ROWS)
  return str(folder)


def test_uci_original_and_shared_formats_parse_to_the_same_arrays(tmp_path):
  uci = adult.load_adult(_write(tmp_path / "uci", uci=True), proxy_noise=0.0)
  shared = adult.load_adult(_write(tmp_path / "shared", uci=False), proxy_noise=0.0)
  for split in ("train", "test"):
    for key in ("x", "y", "group", "proxy"):
      np.testing.assert_array_equal(getattr(uci, split)[key], getattr(shared, split)[key])
  np.testing.assert_array_equal(uci.train["y"], [1, 0, 1, 0, 1])
  np.testing.assert_array_equal(uci.test["y"], [0, 1])  # trailing periods accepted
  np.testing.assert_array_equal(uci.train["group"], [0, 1, 2, 2, 2])
  np.testing.assert_array_equal(uci.test["group"], [1, 0])
  np.testing.assert_array_equal(uci.train["proxy"], uci.train["group"])  # no noise
  names = uci.feature_names
  assert not any(n.startswith("race") for n in names)  # the true group is not a feature
  assert not any(n.startswith("fnlwgt") for n in names)
  assert "workclass=?" in names and "native-country=?" in names  # '?' is its own value
  x = uci.train["x"]
  assert x.shape == (5, len(names)) and set(np.unique(x)) <= {0.0, 1.0}
  np.testing.assert_array_equal(x.sum(1), 12)  # 7 categoricals + 5 buckets, one-hot each
  col = {n: i for i, n in enumerate(names)}
  assert x[0, col["capital-gain#1"]] == 1  # 2174 in (1, 4000]
  assert x[2, col["capital-loss#2"]] == 1  # 1900 in (1800, 1950]
  assert x[1, col["hours-per-week#0"]] == 1  # 13 in (0, 39]
  # test values unseen in training ("Never-worked", "Farming-fishing", "Peru") encode as 0
  assert uci.test["x"][1].sum() == 9
  assert uci.test["x"][1, col["age#3"]] == 1  # 90 beyond the last age edge -> last bucket


def test_shared_copy_has_the_uci_row_counts(real):
  assert real.train["x"].shape == (32561, 117)
  assert real.test["x"].shape == (16281, 117)
  np.testing.assert_array_equal(real.train["x"].sum(1), 12)
  assert abs(real.train["y"].mean() - 0.2408) < 1e-3
  assert abs(real.test["y"].mean() - 0.2362) < 1e-3
  np.testing.assert_array_equal(np.bincount(real.train["group"]), [27816, 3124, 1621])
  fed = adult.federated_adult(real, 8, 0)
  assert fed.num_clients == 8 and int(fed.counts.sum()) == 32561
  assert int(fed.counts.max() - fed.counts.min()) <= 1


@pytest.fixture(scope="module")
def real():
  return adult.load_adult()


def test_proxy_noise_moves_thirty_percent_to_a_different_group(real):
  groups = real.train["group"]
  proxy = adult.proxy_groups(groups, 0.3, seed=4)
  moved = proxy != groups
  assert moved.sum() == round(0.3 * groups.size)  # exactly 30%, always a different group
  assert abs(moved.mean() - 0.3) < 1e-4
  white = moved & (groups == 0)
  share = np.bincount(proxy[white], minlength=G)[1:] / white.sum()
  np.testing.assert_allclose(share, [0.5, 0.5], atol=0.03)  # uniform over the other two
  np.testing.assert_array_equal(proxy, adult.proxy_groups(groups, 0.3, seed=4))
  assert np.any(proxy != adult.proxy_groups(groups, 0.3, seed=5))
  assert np.mean(real.train["proxy"] != groups) == pytest.approx(0.3, abs=1e-4)


def test_loader_errors_name_the_path_or_argument(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    adult.load_adult(str(tmp_path / "nowhere"))
  folder = _write(tmp_path / "half", uci=True)
  os.remove(os.path.join(folder, "adult.test"))
  with pytest.raises(FileNotFoundError, match="adult.test"):
    adult.load_adult(folder)
  folder = _write(tmp_path / "ok", uci=True)
  with pytest.raises(ValueError, match="proxy_noise"):
    adult.load_adult(folder, proxy_noise=1.5)
  with pytest.raises(ValueError, match="seed"):
    adult.load_adult(folder, seed=-1)
  with pytest.raises(ValueError, match="num_clients"):
    adult.federated_adult(adult.load_adult(folder), 0, 0)
  with open(os.path.join(folder, "adult.data"), "a") as f:
    f.write("1, 2, 3\n")
  with pytest.raises(ValueError, match="line"):
    adult.load_adult(folder)


# ---- the fairness problem ----------------------------------------------------------------


def _small_batch(real, n=400, seed=0):
  rng = np.random.default_rng(seed)
  rows = rng.choice(real.train["y"].size, n, replace=False)
  batch = {k: v[rows] for k, v in real.train.items()}
  params = {
    "w": (0.3 * rng.normal(size=real.num_features)).astype(np.float32),
    "b": np.float32(-0.5),
  }
  return batch, params


def _np_objective(params, batch, eps=0.01, alpha=0.1, gamma=0.1):
  x = batch["x"].astype(np.float64)
  y = batch["y"].astype(np.float64)
  z = x @ np.asarray(params["w"], np.float64) + float(params["b"])
  l = np.logaddexp(0.0, z) - y * z
  overall = l.mean()
  penalty = 0.0
  for k in range(G):
    rows = (y == 1) & (batch["proxy"] == k)
    c = l[rows].mean() - overall - eps
    penalty += 1 / (G + 1) * (1 / G + np.exp(alpha * c / gamma))
  return overall + np.log(penalty)


def test_objective_matches_numpy_on_a_batch(real):
  batch, params = _small_batch(real)
  problem = fair.fairness_problem()
  n = batch["y"].size
  w = jnp.full((n,), 1.0 / n)
  value = problem.client_objective(params, batch, w)
  expected = _np_objective(params, batch)
  np.testing.assert_allclose(float(value), expected, rtol=1e-5)
  np.testing.assert_allclose(
    float(fair.objective(params, batch["x"], batch["y"], batch["proxy"])), expected, rtol=1e-5
  )


def test_composition_gradient_matches_grad_of_the_direct_formula(real):
  batch, params = _small_batch(real, seed=1)
  problem = fair.fairness_problem()
  grad_h, kwargs = fedco.oracle_args(problem, batch, batch, batch)
  _, z = estimators.value_and_compositional_grad(kwargs["inner_fn"], kwargs["outer_fn"], params)
  z = jax.tree.map(jnp.add, z, grad_h(params))
  direct = jax.grad(fair.objective)(params, batch["x"], batch["y"], batch["proxy"])
  for k in ("w", "b"):
    np.testing.assert_allclose(np.asarray(z[k]), np.asarray(direct[k]), rtol=1e-4, atol=1e-6)
  assert float(jnp.abs(direct["w"]).max()) > 1e-3


def test_a_group_without_positive_rows_is_neutral_and_finite():
  outer = fair.outer_map(G)
  v = jnp.array([0.2, 0.0, 0.1, 0.3, 0.0, 0.2, 0.5])  # group 1 has no positive row
  value, grad = jax.value_and_grad(outer)(v)
  s = 0.1 * np.array([0.2 / 0.3 - 0.5 - 0.01, -0.01, 0.1 / 0.2 - 0.5 - 0.01]) / 0.1
  np.testing.assert_allclose(float(value), np.log((1 + np.exp(s).sum()) / (G + 1)), rtol=1e-5)
  assert np.all(np.isfinite(np.asarray(grad))) and float(grad[1]) == 0.0


def test_group_metrics_match_numpy(real):
  batch, params = _small_batch(real, n=2000, seed=2)
  m = fair.group_metrics(params, batch["x"], batch["y"], batch["group"])
  pred = batch["x"] @ params["w"] + params["b"] > 0
  pos = batch["y"] == 1
  tpr = pred[pos].mean()
  viol = [tpr - pred[pos & (batch["group"] == k)].mean() - 0.01 for k in range(G)]
  np.testing.assert_allclose(float(m["acc"]), np.mean(pred == pos), rtol=1e-6)
  np.testing.assert_allclose(np.asarray(m["violations"]), viol, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(float(m["max_violation"]), max(viol), rtol=1e-5, atol=1e-6)


# ---- GCIVR against a float64 NumPy transcription ------------------------------------------


class NpFair:
  """Float64 oracles of the fairness problem on a set of rows."""

  def __init__(self, ex):
    self.x = np.asarray(ex["x"], np.float64)
    self.y = np.asarray(ex["y"], np.float64)
    self.o = np.eye(G)[np.asarray(ex["proxy"])] * self.y[:, None]  # y * onehot(proxy)

  def parts(self, w, b):
    z = self.x @ w + b
    return np.logaddexp(0.0, z) - self.y * z, 1 / (1 + np.exp(-z)) - self.y

  def g(self, w, b):
    l, _ = self.parts(w, b)
    return np.concatenate([(self.o * l[:, None]).mean(0), self.o.mean(0), [l.mean()]])

  def jac(self, w, b):  # rows (a_1..a_G, n_1..n_G, m); columns (w, b)
    _, r = self.parts(w, b)
    dl = np.concatenate([r[:, None] * self.x, r[:, None]], axis=1)  # [n, d + 1]
    Ja = np.einsum("ik,ij->kj", self.o, dl) / len(r)
    return np.concatenate([Ja, np.zeros_like(Ja), dl.mean(0)[None]])

  def grad_h(self, w, b):
    return self.jac(w, b)[-1]


def np_grad_f(v, eps=0.01, ag=1.0):
  a, n, m = v[:G], v[G : 2 * G], v[2 * G]
  s = ag * (a / n - m - eps)
  pi = np.exp(s) / (1 + np.exp(s).sum())
  return np.concatenate([pi * ag / n, -pi * ag * a / n**2, [-ag * pi.sum()]])


def np_gcivr(oracles_at_step, x0, y0, lr, q, steps):
  """Parallel GCIVR: ``oracles_at_step(t)`` gives the list of (next-inner, outer) oracle pairs
  of step t, one per client; estimates are their mean."""
  d1 = x0.size
  x, y, J, v, acc = x0.copy(), y0.copy(), np.zeros((2 * G + 1, d1)), np.zeros(d1), np.zeros(d1)
  for t in range(steps):
    x_new = x
    if t > 0:
      d = J.T @ np_grad_f(y) + v
      acc = acc + d**2
      x_new = x - lr * d / np.sqrt(acc + 1e-10)
    pairs = oracles_at_step(t)
    w, b, wn, bn = x[:-1], x[-1], x_new[:-1], x_new[-1]
    gn = np.mean([gi.g(wn, bn) for gi, _ in pairs], 0)
    Jn = np.mean([gi.jac(wn, bn) for gi, _ in pairs], 0)
    vn = np.mean([hi.grad_h(wn, bn) for _, hi in pairs], 0)
    if t % q == 0:
      y, J, v = gn, Jn, vn
    else:
      y = y + gn - np.mean([gi.g(w, b) for gi, _ in pairs], 0)
      J = J + Jn - np.mean([gi.jac(w, b) for gi, _ in pairs], 0)
      v = v + vn - np.mean([hi.grad_h(w, b) for _, hi in pairs], 0)
    x = x_new
  return x


def _tiny_clients(sizes=(14, 10), d=4, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for n in sizes:
    y = np.tile([1.0, 0.0], n // 2).astype(np.float32)
    proxy = np.tile(np.repeat(np.arange(G), 2), n)[:n].astype(np.int32)  # every group positive
    out.append({"x": rng.normal(size=(n, d)).astype(np.float32), "y": y, "proxy": proxy})
  return out


def _flat(params):
  return np.concatenate([np.asarray(params["w"], np.float64), [float(params["b"])]])


def test_gcivr_update_matches_numpy_with_changing_batches():
  (ex,) = _tiny_clients(sizes=(30,), seed=3)
  problem = fair.fairness_problem()
  lr, q, steps = 0.05, 3, 7
  rng = np.random.default_rng(5)
  pos = [np.flatnonzero((ex["y"] == 1) & (ex["proxy"] == k)) for k in range(G)]

  def draw():  # 12 rows, with a positive row of every group (so no ratio is 0/0)
    return np.concatenate([[rng.choice(p) for p in pos], rng.choice(30, 9)])

  batches = [(draw(), draw()) for _ in range(steps)]  # (next-inner, outer)
  sub = lambda rows: {k: v[rows] for k, v in ex.items()}
  params = {"w": jnp.asarray(0.1 * rng.normal(size=4), jnp.float32), "b": jnp.float32(0.2)}
  x0 = _flat(params)
  init_rows = draw()
  alg = gcivr(lr, refresh_every=q)
  state = alg.init(
    params, inner_value=problem.inner_value(params, sub(init_rows), jnp.full((12,), 1 / 12))
  )
  for t in range(steps):
    bn, bf = (sub(r) for r in batches[t])
    grad_h, kwargs = fedco.oracle_args(problem, bn, bf, bn)
    step, state = alg.update(grad_h(params), state, params, **kwargs)
    params = jax.tree.map(jnp.add, params, step)
  y0 = NpFair(sub(init_rows)).g(x0[:-1], x0[-1])
  x_ref = np_gcivr(
    lambda t: [(NpFair(sub(batches[t][0])), NpFair(sub(batches[t][1])))], x0, y0, lr, q, steps
  )
  assert np.abs(x_ref - x0).max() > 0.05  # it moved
  np.testing.assert_allclose(_flat(params), x_ref, rtol=1e-4, atol=1e-5)


def test_gcivr_in_the_runtime_matches_the_parallel_transcription():
  clients = _tiny_clients()
  data = fedco.FederatedData.from_clients(clients)
  problem = fair.fairness_problem()
  lr, q, rounds = 0.05, 2, 6
  params = {"w": jnp.asarray([0.1, -0.2, 0.05, 0.3], jnp.float32), "b": jnp.float32(-0.1)}
  res = fedco.simulate(
    problem, gcivr(lr, refresh_every=q), data, params, rounds=rounds, batch_size=None
  )
  C = [NpFair(ex) for ex in clients]
  x0 = _flat(params)
  y0 = np.mean([c.g(x0[:-1], x0[-1]) for c in C], 0)
  x_ref = np_gcivr(lambda t: [(c, c) for c in C], x0, y0, lr, q, rounds)
  assert np.abs(x_ref - x0).max() > 0.05
  np.testing.assert_allclose(_flat(res.params), x_ref, rtol=1e-4, atol=1e-5)
  d1, p = x0.size, 2 * G + 1
  assert res.ledger["up_per_client_per_round"] == {"params": d1, "y": p, "J": p * d1, "v": d1}


# ---- the experiment ----------------------------------------------------------------------


QUIET = runner.Options(progress=False)


def _config(**changes):
  config = fair_config.get_config()
  config.seeds = (0,)
  for key, value in changes.items():
    setattr(config, key, value)
  return config


def test_experiment_end_to_end_on_the_real_data(tmp_path):
  # 5 rounds, evaluated every 2: at 1, 2, 4 and the last, 5, whose metrics are the finals
  summary = runner.train_and_evaluate(_config(rounds=5, eval_every=2), str(tmp_path), QUIET)
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "fairness.png"):
    assert os.path.exists(tmp_path / name), name
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["rounds"] == 5
  records = outputs.read_jsonl(tmp_path / "metrics.jsonl")
  labels = set(fair_config.get_config().methods)
  assert labels == {"feddro", "ds_feddro", "gcivr", "fedavg"}
  assert {r["method"] for r in records} == labels
  assert {r["round"] for r in records} == {1, 2, 4, 5}
  for r in records:
    assert 0.0 <= r["test_acc"] <= 1.0 and np.isfinite(r["train_max_violation"])
    assert len(r["test_violations"]) == G
    assert r["test_max_violation"] == pytest.approx(max(r["test_violations"]))
  for label, entry in summary["methods"].items():
    assert entry["diverged_seeds"] == [] and entry["per_seed"][0]["round"] == 5, label
    for key in fair_adult.TABLE_KEYS:
      assert np.isfinite(entry[key]["mean"]), (label, key)
  assert all("note" not in row for row in summary["table"])
  assert "unconstrained_has_largest_test_violation" in summary
  settings = summary["settings"]
  assert settings["gcivr"] == {
    "algorithm": "gcivr",
    "learning_rate": 0.01,
    "local_steps": 1,
    "refresh_every": 10,
  }
  assert settings["ds_feddro"]["server_lr_x"] == 1.3 and settings["feddro"]["beta"] == 0.5
  assert settings["fedavg"]["local_steps"] == 1 and settings["feddro"]["learning_rate"] == 0.1


def test_the_local_steps_ablation_labels_the_runs():
  config = _config(ablation="local_steps")
  fair_adult.check(config)
  assert [m.label for m in fair_adult.methods(config, None)] == [
    f"{a}_local_steps={i}" for a in ("ds_feddro", "feddro") for i in (1, 2, 4, 8)
  ]
  config.ablation_values = (1, 4)
  fair_adult.check(config)
  methods = fair_adult.methods(config, None)
  assert [(m.label, m.local_steps) for m in methods] == [
    ("ds_feddro_local_steps=1", 1),
    ("ds_feddro_local_steps=4", 4),
    ("feddro_local_steps=1", 1),
    ("feddro_local_steps=4", 4),
  ]
  assert methods[1].build().plan.local_steps == 4


def _set(config, field, value):
  node = config
  *path, last = field.split(".")
  for name in path:
    node = node[name]
  node[last] = value


@pytest.mark.parametrize(
  "field,value,match",
  [
    ("methods.feddro.algorithm", "adam", "--config.methods.feddro.algorithm"),
    ("methods.fedavg.algorithm", "no_such", "--config.methods.fedavg.algorithm must be one of"),
    ("rounds", 0, "--config.rounds"),
    ("num_clients", 0, "--config.num_clients"),
    ("local_steps", 0, "--config.local_steps"),
    ("learning_rate", 0.0, "--config.learning_rate"),
    ("methods.gcivr.learning_rate", -1.0, "--config.methods.gcivr.learning_rate"),
    ("methods.feddro.beta", 1.5, "--config.methods.feddro.beta"),
    ("methods.ds_feddro.server_lr_y", 0.0, "--config.methods.ds_feddro.server_lr_y"),
    ("methods.gcivr.beta", 0.5, "--config.methods.gcivr.beta is not an argument"),
    ("eps", -0.1, "--config.eps"),
    ("gamma", 0.0, "--config.gamma"),
    ("proxy_noise", 1.2, "--config.proxy_noise"),
    ("methods.gcivr.refresh_every", 0, "--config.methods.gcivr.refresh_every"),
    ("ablation", "tau", "--config.ablation"),
    ("ablation_values", (2,), "--config.ablation_values needs"),
    ("seeds", ("x",), "--config.seeds"),
  ],
)
def test_bad_fields_name_the_field(field, value, match, tmp_path):
  config = fair_config.get_config()
  with config.unlocked():
    _set(config, field, value)
  with pytest.raises(ValueError, match=match):  # before anything runs or is written
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert not os.path.exists(tmp_path / "out")


def test_bad_ablation_values_name_the_field():
  config = _config(ablation="local_steps", ablation_values=(0,))
  with pytest.raises(ValueError, match="--config.ablation_values"):
    fair_adult.check(config)
  config = _config(ablation="local_steps")
  del config.methods["feddro"], config.methods["ds_feddro"]
  with pytest.raises(ValueError, match="--config.ablation=local_steps needs"):
    fair_adult.check(config)


def test_missing_data_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="--config.data_dir=.*empty"):
    runner.train_and_evaluate(
      _config(data_dir=str(tmp_path / "empty"), rounds=2), str(tmp_path / "out"), QUIET
    )
  assert not os.path.exists(tmp_path / "out")


def test_the_driver_exits_cleanly_on_a_bad_field(tmp_path):
  proc = helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/fair_adult.py",
      f"--workdir={tmp_path}",
      "--config.rounds=0",
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith("error: --config.rounds")
