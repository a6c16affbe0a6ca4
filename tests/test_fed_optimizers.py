"""The federated-optimizers experiment (issue 45 item 3): Shakespeare from files in TFF's
HDF5 layout and FEMNIST from LEAF's JSON, every method end to end, the pooled held-out
metrics against a hand count, each method's published hyperparameters in its algorithm,
the paper's numbers in the report, and the refusals."""

import json
import os

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import fed_optimizers as fo
from experiments.configs import fed_optimizers as shakespeare_config
from experiments.configs import fed_optimizers_emnist as emnist_config
from fedco.data import tff
from fedco.experiment import runner

QUIET = runner.Options(progress=False)
A = tff.SHAKESPEARE_VOCAB.index("a") + 1  # the id of "a"
# Five roles whose held-out text differs in size and in its share of "a", so that pooling
# over tokens, averaging over sequences and averaging over clients give different numbers.
TEST_TEXT = {
  "ROLE0": [b"aaaa", b"ab"],
  "ROLE1": [b"b" * 100],
  "ROLE2": [b"aab"],
  "ROLE3": [b"ba", b"a"],
  "ROLE4": [b"Nay, a word."],
}


def _shakespeare(root):
  rng = np.random.default_rng(0)
  letters = np.frombuffer(b"ab cdefg,.", np.uint8)
  train = {
    role: [bytes(rng.choice(letters, n)) for n in rng.integers(5, 200, k)]
    for k, role in zip((4, 5, 6, 4, 7), TEST_TEXT)
  }
  for split, clients in (("train", train), ("test", TEST_TEXT)):
    with h5py.File(os.path.join(root, f"shakespeare_{split}.h5"), "w") as f:
      for role, snippets in clients.items():
        f.create_dataset(f"examples/{role}/snippets", data=np.array(snippets, dtype=bytes))
  return str(root)


def _femnist(root):
  rng = np.random.default_rng(1)
  for split, sizes in (("train", (6, 4, 5)), ("test", (3, 1, 2))):
    os.makedirs(os.path.join(root, split))
    users = {
      f"f{k:04d}_00": {"x": rng.random((n, 784)).round(2).tolist(), "y": [k, 7, 3, 7, 1, 2][:n]}
      for k, n in enumerate(sizes)
    }
    content = {"users": list(users), "num_samples": list(sizes), "user_data": users}
    with open(os.path.join(root, split, "all_data_0.json"), "w") as f:
      json.dump(content, f)
  return str(root)


def _tiny(config, data_dir, **changes):
  config.data_dir = data_dir
  config.seeds = (0, 1)
  config.rounds, config.eval_every = 2, 1
  config.clients_per_round, config.local_steps = 2, 2
  config.local_epochs, config.client_chunk = 0, 0
  config.eval_batch = 3
  config.update(changes)
  return config


@pytest.fixture(scope="module")
def shakespeare_dir(tmp_path_factory):
  return _shakespeare(tmp_path_factory.mktemp("shakespeare_tff"))


@pytest.fixture(scope="module")
def shakespeare_run(shakespeare_dir, tmp_path_factory):
  config = _tiny(
    shakespeare_config.get_config(), shakespeare_dir, hidden_size=4, eval_batch=0, seeds=(0,)
  )
  # one method of each kind of server (the others differ from these only in numbers, which
  # test_each_methods_published_hyperparameters_reach_its_algorithm checks): server SGD
  # with momentum, an adaptive server, SCAFFOLD's aggregator
  for label in ("fedavg", "fedadagrad", "fedyogi"):
    del config.methods[label]
  config.methods.fedadam.problem.paper = 12.5  # a published number, to see it in the report
  workdir = tmp_path_factory.mktemp("fedopt")
  return workdir, config, runner.train_and_evaluate(config, str(workdir), QUIET)


def test_shakespeare_runs_from_tff_files(shakespeare_run):
  workdir, config, summary = shakespeare_run
  labels = ["fedadam", "fedavgm", "scaffold"]
  assert [row["method"] for row in summary["table"]] == labels
  assert summary["dataset"] == "shakespeare" and summary["clients"] == 5
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  for label in labels:
    mine = [r for r in rows if r["method"] == label]
    assert [r["round"] for r in mine] == [1, 2]
    assert all(0 <= r["test_accuracy"] <= 1 and r["test_loss"] > 0 for r in mine)
    final = summary["methods"][label]["per_seed"][0]
    assert summary["against_paper"][label]["test_accuracy"] == final["test_accuracy"]
    assert summary["against_paper"][label]["local_steps"] == config.local_steps
  assert (workdir / "fed_optimizers.png").exists()
  lines = {line.split(":")[0]: line for line in fo.report(summary)}
  assert sorted(lines) == labels
  ours = 100 * summary["against_paper"]["fedadam"]["test_accuracy"]
  assert lines["fedadam"].startswith(
    f"fedadam: held-out accuracy {ours:.2f} (1 seed); paper 12.5, "
  )
  assert "; paper not found, " in lines["scaffold"]  # this session found no published number


def test_the_report_gives_the_standard_error_over_seeds_beside_the_paper(shakespeare_dir):
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir, seeds=(0, 1, 2))
  config.methods.fedyogi.problem.paper = 57.3
  methods = fo.methods(config, None)
  accuracy = {0: 0.5, 1: 0.56, 2: 0.53}
  finals = {
    m.label: {
      s: {"test_accuracy": a, "test_loss": 1.0, "seconds": 4.0} for s, a in accuracy.items()
    }
    for m in methods
  }
  finals["fedavg"][2] = {"diverged": "diverged at round 2 (params)"}
  outcome = runner.Outcome(methods, (0, 1, 2), finals=finals, setup=fo.setup(config))
  summary = fo.summarize(config, outcome)
  yogi = summary["against_paper"]["fedyogi"]
  np.testing.assert_allclose(yogi["test_accuracy"], 0.53)
  np.testing.assert_allclose(yogi["stderr"], np.std([0.5, 0.56, 0.53], ddof=1) / np.sqrt(3))
  assert yogi["seconds_per_round"] == 4.0 / config.rounds and yogi["paper"] == 57.3
  lines = {line.split(":")[0]: line for line in fo.report(summary)}
  assert (
    lines["fedyogi"]
    == "fedyogi: held-out accuracy 53.00 +- 1.73 (3 seeds); paper 57.3, 2.00 s a round"
  )
  assert lines["fedavg"].startswith(
    "fedavg: held-out accuracy 53.00 +- 3.00 (2 seeds); paper not found"
  )


def test_the_papers_number_is_not_part_of_a_runs_identity(shakespeare_dir):
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir)
  before = {m.label: m.settings() for m in fo.methods(config, None)}
  config.methods.fedavg.problem.paper = 56.0
  after = {m.label: m.settings() for m in fo.methods(config, None)}
  assert before == after and "server_sgd" in after["fedavgm"]


def _biased(params, favourite, classes):
  """``params`` whose logits are ``10 * one_hot(favourite)`` for every input."""
  out = jax.tree.map(jnp.asarray, params)
  out["params"]["logits"]["kernel"] = jnp.zeros_like(out["params"]["logits"]["kernel"])
  out["params"]["logits"]["bias"] = 10.0 * jax.nn.one_hot(favourite, classes)
  return out


def test_pooled_shakespeare_accuracy_and_loss_are_hand_counts(shakespeare_dir):
  """A model that predicts "a" everywhere: accuracy is the share of "a" among every held-out
  target that is a character (pad, OOV, BOS, EOS left out), pooled over tokens."""
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir, hidden_size=4)
  fed = fo.setup(config)
  prepared = fo.prepare(config, 0, fed)
  params = _biased(prepared.params, A, tff.NUM_CLASSES)
  _, pooled = fo.losses(config, prepared.model)
  got = jax.jit(fo.make_metrics_fn(config, pooled))(params, prepared.test)
  texts = [s for role in TEST_TEXT.values() for s in role]
  targets = []  # by hand: [BOS, characters, EOS] in rows of 81, each row's first token no target
  for text in texts:
    tokens = ["<bos>", *text.decode(), "<eos>"]
    tokens += ["<pad>"] * (-len(tokens) % 81)
    targets += [t for row in range(0, len(tokens), 81) for t in tokens[row + 1 : row + 81]]
  chars = [t for t in targets if t in tff.SHAKESPEARE_VOCAB]
  hits, scored = chars.count("a"), len(chars)
  assert scored == sum(map(len, texts)) - 1  # the 100-character snippet's 81st token starts a row
  np.testing.assert_allclose(float(got["test_accuracy"]), hits / scored, rtol=1e-6)
  # loss over every non-pad target (characters and EOS), logits 10 * one_hot("a")
  nll_other = np.log(np.exp(10.0) + 89)
  nll_a = nll_other - 10.0
  kept = sum(t != "<pad>" for t in targets)
  expected = (hits * nll_a + (kept - hits) * nll_other) / kept
  np.testing.assert_allclose(float(got["test_loss"]), expected, rtol=1e-5)
  # not a mean over clients, nor over sequences: those differ here
  by_client = np.mean([b"".join(v).count(b"a") / len(b"".join(v)) for v in TEST_TEXT.values()])
  by_snippet = np.mean([t.count(b"a") / len(t) for t in texts])
  assert min(abs(by_client - hits / scored), abs(by_snippet - hits / scored)) > 0.03


@pytest.fixture(scope="module")
def femnist_dir(tmp_path_factory):
  return _femnist(tmp_path_factory.mktemp("femnist"))


@pytest.mark.compile_optimized  # the CNN's im2col backward pass needs XLA's optimizations
def test_femnist_writers_from_leaf_files_and_their_pooled_accuracy(femnist_dir, tmp_path):
  config = _tiny(emnist_config.get_config(), femnist_dir, seeds=(0,), batch_size=2, rounds=1)
  for label in ("fedadagrad", "fedavgm", "fedyogi", "scaffold", "fedadam"):
    del config.methods[label]
  summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  assert summary["dataset"] == "emnist" and summary["clients"] == 3
  assert summary["test_examples"] == 6
  assert 0 <= summary["methods"]["fedavg"]["per_seed"][0]["test_accuracy"] <= 1
  # a model that always says 7: the share of 7s among all held-out images, pooled
  fed = fo.setup(config)
  prepared = fo.prepare(config, 0, fed)
  _, pooled = fo.losses(config, prepared.model)
  got = fo.make_metrics_fn(config, pooled)(_biased(prepared.params, 7, 62), prepared.test)
  labels = [0, 7, 3] + [1] + [2, 7]  # the three writers' held-out labels, by hand
  np.testing.assert_allclose(float(got["test_accuracy"]), labels.count(7) / 6, rtol=1e-6)


def _step(server, delta, state):
  updates, state = server.update({"params": -delta}, state)
  return np.asarray(updates["params"]), state


@pytest.mark.parametrize("module", [shakespeare_config, emnist_config])
def test_each_methods_published_hyperparameters_reach_its_algorithm(module):
  config = _tiny(module.get_config(), "")
  methods = {m.label: m for m in fo.methods(config, None)}
  entry = lambda label: config.methods[label]
  g, d = jnp.array([1.0, -2.0]), jnp.array([1.0, -0.01])  # a client gradient, a server change
  for label, method in methods.items():
    algorithm = fo.algorithm_of(config, method, None)
    assert algorithm.plan.local_steps == config.local_steps
    state = algorithm.init(jnp.zeros(2))
    step, _ = algorithm.update(g, state, jnp.zeros(2))  # the clients' SGD at their rate
    np.testing.assert_allclose(step, -entry(label).learning_rate * g, rtol=1e-6, err_msg=label)
  for label in ("fedavg", "fedavgm"):  # optax.sgd(rate, momentum) on -delta
    sgd = entry(label).problem.server_sgd
    server = fo.algorithm_of(config, methods[label], None).server
    first, state = _step(server, d, server.init({"params": jnp.zeros(2)}))
    second, _ = _step(server, d, state)
    np.testing.assert_allclose(first, sgd.learning_rate * d, rtol=1e-6)
    np.testing.assert_allclose(second, sgd.learning_rate * (1 + sgd.momentum) * d, rtol=1e-6)
  assert entry("fedavgm").problem.server_sgd.momentum == 0.9
  assert entry("fedavg").problem.server_sgd.momentum == 0
  for label, rule in (("fedadam", "adam"), ("fedyogi", "yogi"), ("fedadagrad", "adagrad")):
    e = entry(label)
    algorithm = fo.algorithm_of(config, methods[label], None)
    assert algorithm.plan.weighting == "samples", label  # weighted by examples, as TFF
    first, _ = _step(algorithm.server, d, algorithm.server.init({"params": jnp.zeros(2)}))
    tau, b1 = e.adaptivity, e.get("b1", 0.0)
    v = {"adam": e.get("b2", 0) * tau**2 + (1 - e.get("b2", 0)) * d**2, "adagrad": tau**2 + d**2}
    v["yogi"] = tau**2 - (1 - e.get("b2", 0)) * d**2 * np.sign(tau**2 - d**2)
    expected = e.server_lr * (1 - b1) * d / (np.sqrt(v[rule]) + tau)
    np.testing.assert_allclose(first, expected, rtol=1e-5, err_msg=label)
  scaffold = fo.algorithm_of(config, methods["scaffold"], None)
  assert scaffold.name == "scaffold" and methods["scaffold"].kwargs == {"server_lr": 1.0}


def test_published_settings_as_cited():
  """The code page's table (base-10 logs) and setting, as the configs cite them."""
  s, e = shakespeare_config.get_config(), emnist_config.get_config()
  assert (s.batch_size, s.rounds, s.clients_per_round, s.local_epochs) == (4, 1200, 10, 1)
  assert (e.batch_size, e.rounds, e.clients_per_round, e.local_epochs) == (20, 1500, 10, 1)
  log = lambda x: round(float(np.log10(x)), 6)
  assert {k: log(s.methods[k].server_lr) for k in ("fedadagrad", "fedadam", "fedyogi")} == {
    "fedadagrad": -0.5,
    "fedadam": -2.0,
    "fedyogi": -2.0,
  }
  assert {k: log(e.methods[k].adaptivity) for k in ("fedadagrad", "fedadam", "fedyogi")} == {
    "fedadagrad": -2.0,
    "fedadam": -4.0,
    "fedyogi": -4.0,
  }
  assert (
    log(e.methods.fedavg.learning_rate) == -1.0 and log(e.methods.fedyogi.learning_rate) == -1.5
  )
  assert log(s.methods.fedavgm.problem.server_sgd.learning_rate) == -0.5


def test_refusals_are_one_line(shakespeare_dir, tmp_path):
  config = _tiny(shakespeare_config.get_config(), str(tmp_path / "missing"))
  with pytest.raises(FileNotFoundError, match=r"--config.data_dir=.*missing.*shakespeare_train"):
    runner.train_and_evaluate(config, str(tmp_path / "w"), QUIET)
  assert not (tmp_path / "w").exists()
  bad = [
    ({"dataset": "cifar"}, "--config.dataset"),
    ({"local_epochs": 1, "batch_size": 0}, "--config.local_epochs=1 needs a --config.batch_size"),
    ({"client_chunk": 1}, "--config.client_chunk=1 applies under --config.local_epochs"),
    ({"clients_per_round": 6}, "--config.clients_per_round=6 exceeds the 5 clients"),
  ]
  for changes, message in bad:
    config = _tiny(shakespeare_config.get_config(), shakespeare_dir, **changes)
    with pytest.raises(ValueError, match=message):
      runner.train_and_evaluate(config, str(tmp_path / "w"), QUIET)
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir)
  config.methods.fedadam.problem.server_sgd = {"learning_rate": 1.0, "momentum": 0.0}
  with pytest.raises(
    ValueError, match="--config.methods.fedadam.problem.server_sgd is FedAvg's server"
  ):
    fo.methods(config, None)
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir)
  config.methods.fedavgm.problem.server_sgd.momentum = 1.5
  with pytest.raises(ValueError, match="--config.methods.fedavgm.problem.server_sgd.momentum"):
    fo.methods(config, None)
  config = _tiny(shakespeare_config.get_config(), shakespeare_dir)
  config.methods.fedavg.problem.momentum = 0.9  # belongs in server_sgd
  with pytest.raises(ValueError, match=r"problem.momentum is not a setting of fed_optimizers"):
    fo.methods(config, None)
  assert not (tmp_path / "w").exists()


def test_one_local_epoch_caps_steps_at_the_largest_client(shakespeare_dir, tmp_path):
  config = _tiny(
    shakespeare_config.get_config(), shakespeare_dir, seeds=(0,), hidden_size=4, batch_size=4
  )
  config.local_epochs, config.client_chunk = 1, 1
  for label in ("fedadagrad", "fedavgm", "fedyogi", "scaffold", "fedadam"):
    del config.methods[label]
  summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  fed = fo.setup(config)
  cap = int(np.ceil(np.max(np.asarray(fed.train.counts)) / 4))
  assert summary["against_paper"]["fedavg"]["local_steps"] == cap
  assert 0 <= summary["methods"]["fedavg"]["per_seed"][0]["test_accuracy"] <= 1
