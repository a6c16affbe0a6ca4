"""E8 (DRO-FL on natural partitions): Synthetic through the skeleton, paired differences
against FedAvg, FEMNIST from LEAF files, Shakespeare's roles from TFF's HDF5 files (the
per-sequence masked loss and the pooled held-out accuracy by hand), the project copies'
folders, and its refusals."""

import json
import os

import h5py
import jax
import numpy as np
import pytest

import fedco
from experiments import adult_dro, configs, natural_dro
from experiments.configs.natural_dro import get_config
from experiments.configs.natural_dro_femnist import get_config as get_femnist
from experiments.configs.natural_dro_shakespeare import get_config as get_shakespeare
from fedco import models
from fedco.algorithms import personal
from fedco.data import tff
from fedco.experiment import runner
from tests import helpers

QUIET = runner.Options(progress=False)


def _tiny(**changes):
  config = get_config()
  config.seeds = (0, 1)
  config.rounds, config.local_steps, config.eval_every = 4, 2, 2
  config.num_users = 4
  for label in ("qfedavg", "drfa", "comfedl_normalized", "fedavg_uniform"):
    del config.methods[label]
  config.update(changes)
  return config


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("e8")
  return workdir, runner.train_and_evaluate(_tiny(), str(workdir), QUIET)


def test_synthetic_runs_every_method_and_pairs_them_with_fedavg(synthetic_run):
  workdir, summary = synthetic_run
  assert summary["dataset"] == "synthetic" and summary["users"] == 4
  assert [row["method"] for row in summary["table"]] == ["afl", "fedavg", "feddro"]
  rows = [json.loads(line) for line in open(workdir / "metrics.jsonl")]
  afl = [r["round"] for r in rows if r["method"] == "afl" and r["seed"] == 0]
  assert afl[-1] == 4 * 2  # no local steps: rounds * local_steps rounds
  finals = {
    (r["method"], r["seed"]): r for r in rows if r["round"] == (8 if r["method"] == "afl" else 4)
  }
  paired = summary["against_fedavg"]["fedavg"]["feddro"]["heldout_acc_p10"]
  d = [
    finals["feddro", s]["heldout_acc_p10"] - finals["fedavg", s]["heldout_acc_p10"] for s in (0, 1)
  ]
  assert paired["seeds"] == 2 and paired["seeds_ahead"] == sum(x > 0 for x in d)
  np.testing.assert_allclose(paired["difference"], np.mean(d), atol=1e-6)
  np.testing.assert_allclose(paired["stderr"], np.std(d, ddof=1) / np.sqrt(2), atol=1e-6)
  r = finals["fedavg", 1]
  assert r["heldout_acc_worst"] <= r["heldout_acc_p10"] <= r["heldout_acc_avg"]
  lines = natural_dro.report(summary)
  assert len(lines) == 2 and lines[0].startswith("afl - fedavg, held-out accuracy paired by seed")
  assert (workdir / "natural_dro.png").exists()


def test_seeds_draw_new_synthetic_users():
  config = _tiny()
  first = natural_dro.prepare(config, 0, None).fed
  second = natural_dro.prepare(config, 1, None).fed
  assert first.num_clients == second.num_clients == 4
  assert not np.array_equal(first.train.counts, second.train.counts)


@pytest.mark.parametrize("model", ["logistic", "cnn"])
def test_femnist_writers_from_leaf_files(tmp_path, model):
  rng = np.random.default_rng(0)

  def writer(n):
    return {"x": rng.random((n, 784)).round(2).tolist(), "y": rng.integers(0, 62, n).tolist()}

  for split, sizes in (("train", (6, 4, 5)), ("test", (2, 2, 1))):
    os.makedirs(tmp_path / "leaf" / split)
    users = {f"f{k:04d}_00": writer(n) for k, n in enumerate(sizes)}
    content = {"users": list(users), "num_samples": list(sizes), "user_data": users}
    with open(tmp_path / "leaf" / split / "all_data_0.json", "w") as f:
      json.dump(content, f)
  config = _tiny(dataset="femnist", data_dir=str(tmp_path / "leaf"), seeds=(0,), model=model)
  config.filters = 2
  del config.methods["afl"], config.methods["feddro"]
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert summary["users"] == 3 and summary["dropped_users"] == 0 and summary["model"] == model
  assert summary["table"][0]["method"] == "fedavg" and "note" not in summary["table"][0]
  params = natural_dro.prepare(config, 0, natural_dro.setup(config)).params["params"]
  if model == "cnn":  # a 28x28 image of one channel, 2 filters, 62 logits
    assert params["conv_0"]["kernel"].shape == (3, 3, 1, 2)
    assert params["logits"]["kernel"].shape == (2, 62)
  else:
    assert params["kernel"].shape == (62, 784)


def _leaf_writers(folder, sizes=((6, 4, 5), (2, 2, 1))):
  rng = np.random.default_rng(0)
  for split, counts in zip(("train", "test"), sizes):
    os.makedirs(folder / split)
    users = {
      f"f{k:04d}_00": {
        "x": rng.random((n, 784)).round(2).tolist(),
        "y": rng.integers(0, 62, n).tolist(),
      }
      for k, n in enumerate(counts)
    }
    content = {"users": list(users), "num_samples": list(counts), "user_data": users}
    with open(folder / split / "all_data_0.json", "w") as f:
      json.dump(content, f)


def test_personalised_methods_are_scored_with_each_writers_own_model(tmp_path):
  """The MLP on FEMNIST-format writers; FedRep and APFL scored by their clients' own models:
  at round 0 those are the shared model; the evaluation equals a per-client loop by hand."""
  _leaf_writers(tmp_path / "leaf")
  config = _tiny(dataset="femnist", data_dir=str(tmp_path / "leaf"), seeds=(0,), model="mlp")
  config.hidden_size = 8
  config.methods = runner.method_entries(
    {
      "fedavg": {"algorithm": "fedavg"},
      "fedrep": {"algorithm": "fedrep", "head": ("out",), "head_steps": 1},
      "apfl": {"algorithm": "apfl", "alpha": 0.5},
    }
  )
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert {row["method"] for row in summary["table"]} == {"fedavg", "fedrep", "apfl"}
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  for label in ("fedrep", "apfl"):
    first = next(r for r in rows if r["method"] == label and r["round"] == 0)
    assert first["heldout_acc_avg"] == pytest.approx(first["heldout_acc_global_avg"])
  prepared = natural_dro.prepare(config, 0, natural_dro.setup(config))
  assert prepared.params["params"]["hidden_0"]["kernel"].shape == (784, 8)
  config.compute_dtype = "bfloat16"  # the local steps in bfloat16, the model float32
  method = runner.methods(config)[0]
  assert natural_dro.build(config, method, 0, prepared).problem.name.endswith("@bfloat16")
  fed, alg = prepared.fed, fedco.fedrep(0.5, 2, head=("out",), head_steps=1)
  result = fedco.simulate(
    fedco.plain(prepared.loss), alg, fed.train, prepared.params, rounds=3, batch_size=2,
    evaluate=False,
  )  # fmt: skip
  row = natural_dro.personal_evaluation(alg, prepared.stats, fed)(result.state)
  accs, losses = [], []
  for k in range(fed.num_clients):
    state_k = jax.tree.map(lambda a, k=k: a[k], result.state.clients)
    model = personal.personal_model(alg, result.params, state_k)
    val = fed.val.client(k)
    accs.append(
      np.mean(
        [
          float(prepared.stats(model, jax.tree.map(lambda a, i=i: a[i], val))[1])
          for i in range(len(val["y"]))
        ]
      )
    )
    train = fed.train.client(k)
    losses.append(
      np.mean(
        [
          float(prepared.stats(model, jax.tree.map(lambda a, i=i: a[i], train))[0])
          for i in range(len(train["y"]))
        ]
      )
    )
  assert row["heldout_acc_avg"] == pytest.approx(np.mean(accs), abs=1e-6)
  assert row["heldout_acc_worst"] == pytest.approx(np.min(accs), abs=1e-6)
  assert row["train_loss_worst"] == pytest.approx(np.max(losses), rel=1e-5)
  assert row["train_loss_avg"] == pytest.approx(np.mean(losses), rel=1e-5)
  # the clients' heads differ from the server's, so their losses do too
  shared = natural_dro.make_metrics_fn(prepared.stats)(
    result.params, {"train": fed.train, "val": fed.val}
  )
  assert abs(float(shared["train_loss_avg"]) - row["train_loss_avg"]) > 1e-4


def test_your_own_feature_vectors_from_leaf_files(tmp_path):
  rng = np.random.default_rng(1)
  for split, sizes in (("train", (8, 5, 6)), ("test", (2, 2, 3))):
    os.makedirs(tmp_path / "mine" / split)
    users = {
      f"u{k}": {"x": rng.normal(k, 1.0, (n, 7)), "y": rng.integers(0, 4, n)}
      for k, n in enumerate(sizes)
    }
    fedco.data.write_leaf(tmp_path / "mine" / split / "data.json", users)
  config = _tiny(dataset="leaf", data_dir=str(tmp_path / "mine"), num_classes=4, seeds=(0,))
  del config.methods["afl"], config.methods["feddro"]
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert summary["users"] == 3 and summary["dropped_users"] == 0
  assert summary["settings"]["fedavg"]["algorithm"] == "fedavg"
  fed = natural_dro.setup(config)
  assert fed.num_classes == 4 and fed.train.examples["x"].shape[1:] == (7,)


def test_fedbuff_against_fedavg_by_simulated_time(tmp_path):
  config = _tiny(async_rounds=16, eval_every=2, async_eval_every=2, num_users=6)
  config.seeds = (0, 1)
  config.delays.update(step_time=1.0, spread=0.3, jitter=0.3)  # no straggler left out
  three = {"clients_per_round": 3}
  config.methods = configs.methods(
    {
      "fedavg": {"algorithm": "fedavg", "participation": three},
      "fedbuff": {
        "algorithm": "fedavg",
        "participation": three,
        "asynchronous": {"concurrency": 4},
      },
    }
  )
  summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  runs = {
    (m, s): [r for r in rows if r["method"] == m and r["seed"] == s]
    for m in ("fedavg", "fedbuff")
    for s in (0, 1)
  }
  assert [r["round"] for r in runs["fedbuff", 0]][-1] == 16  # async_rounds server steps
  timed = summary["simulated_time"]
  ends = {k: v[-1]["time"] for k, v in runs.items()}
  assert timed["budget"] == pytest.approx(min(ends.values()))
  assert all(np.all(np.diff([r["time"] for r in v]) > 0) for v in runs.values())
  # by hand: the first time FedBuff reached the seed's final FedAvg accuracy
  reach = [
    next(
      r["time"]
      for r in runs["fedbuff", s]
      if r["heldout_acc_avg"] >= runs["fedavg", s][-1]["heldout_acc_avg"]
    )
    if any(
      r["heldout_acc_avg"] >= runs["fedavg", s][-1]["heldout_acc_avg"] for r in runs["fedbuff", s]
    )
    else None
    for s in (0, 1)
  ]
  entry = timed["methods"]["fedbuff"]
  assert None not in reach  # 16 server steps of 3 reach 4 rounds of 3
  assert entry["time_to_baseline"]["mean"] == pytest.approx(np.mean(reach))
  same = [
    r["heldout_acc_avg"]
    for v in (runs["fedbuff", 0], runs["fedbuff", 1])
    for r in v
    if r["round"] == 4
  ]
  assert entry["at_baseline_rounds"]["heldout_acc_avg"]["mean"] == pytest.approx(np.mean(same))
  assert any(
    line.startswith("fedbuff: runs end at simulated time") for line in natural_dro.report(summary)
  )
  assert (tmp_path / "natural_dro_time.png").exists()
  with pytest.raises(ValueError, match=r"--config.delays.straggler_slowdown"):
    config.delays.straggler_slowdown = 0.5
    runner.train_and_evaluate(config, str(tmp_path / "bad"), QUIET)


@pytest.mark.parametrize(
  "field, value, match",
  [
    (
      "data_dir",
      "somewhere",
      r"--config.data_dir='somewhere' is read for femnist, emnist, leaf or shakespeare",
    ),
    ("num_classes", 0, r"--config.num_classes"),
    ("dataset", "mnist", r"--config.dataset must be one of"),
    ("alpha", -1.0, r"--config.alpha must be a number >= 0"),
    ("gamma", 0.0, r"--config.gamma"),
    ("compute_dtype", "float16", r"--config.compute_dtype must be one of"),
  ],
)
def test_bad_fields_are_one_line_errors(tmp_path, field, value, match):
  with pytest.raises(ValueError, match=match):
    runner.train_and_evaluate(_tiny(**{field: value}), str(tmp_path), QUIET)
  with pytest.raises(FileNotFoundError, match="--config.data_dir"):
    runner.train_and_evaluate(_tiny(dataset="emnist"), str(tmp_path), QUIET)


# ---- the project's copies: FEMNIST writers, Shakespeare roles ---------------------------

LONG = b"Now is the winter of our discontent made glorious summer by this sun of York; and all"


def _roles(root):
  """Three roles in TFF's HDF5 layout; EVE's held-out snippet has no vocabulary character
  (nothing scored); ADAM's two held-out snippets score 3 and 84 targets (1 and 2 sequences)."""
  text = {
    "train": {"ADAM": [b"Yes, my good lord.", b"Ay."], "CAIN": [LONG], "EVE": [b"Fie!"]},
    "test": {"ADAM": [b"Ay!", LONG], "CAIN": [b"No, my lord."], "EVE": [b"~~\xc3"]},
  }
  for split, roles in text.items():
    with h5py.File(root / f"shakespeare_{split}.h5", "w") as f:
      for role, snippets in roles.items():
        f.create_dataset(f"examples/{role}/snippets", data=np.array(snippets, dtype=bytes))
  return str(root)


def _shakespeare(root, **changes):
  config = get_shakespeare()
  config.data_dir = _roles(root)
  config.seeds, config.rounds, config.eval_every = (0,), 2, 1
  config.local_steps, config.batch_size, config.hidden_size = 2, 2, 4
  for label in list(config.methods):
    if label not in ("fedavg", "feddro"):
      del config.methods[label]
  config.update(changes)
  return config


def test_shakespeare_roles_end_to_end_with_a_role_left_out_of_held_out_metrics(tmp_path):
  config = _shakespeare(tmp_path)
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert summary["dataset"] == "shakespeare" and summary["model"] == "lstm"
  assert summary["users"] == 3 and summary["heldout_clients"] == 2  # EVE: nothing scored
  assert [row["method"] for row in summary["table"]] == ["fedavg", "feddro"]
  assert summary["against_fedavg"]["fedavg"]["feddro"]["heldout_acc_worst"]["seeds"] == 1
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  assert sorted({(r["method"], r["round"]) for r in rows}) == [
    ("fedavg", 1), ("fedavg", 2), ("feddro", 1), ("feddro", 2)
  ]  # fmt: skip
  for r in rows:
    values = [r[k] for k in natural_dro.KEYS + ("train_loss_worst",)]
    assert np.isfinite(values).all() and 0 <= r["heldout_acc_worst"] <= r["heldout_acc_avg"] <= 1


def test_a_role_s_held_out_accuracy_is_pooled_over_its_tokens(tmp_path):
  config = _shakespeare(tmp_path)
  fed = natural_dro.setup(config)
  prepared = natural_dro.prepare(config, 3, fed)
  model = models.ShakespeareLSTM(hidden_size=4, num_layers=1)
  params = prepared.params
  hits, scored = np.zeros(3), np.zeros(3)
  means = [[] for _ in range(3)]
  for row, owner in zip(np.asarray(fed.val.flat_rows), np.asarray(fed.val.flat_owner)):
    x, y = fed.val.examples["x"][row], fed.val.examples["y"][row]
    keep = (y != tff.PAD) & (y < tff.OOV)  # characters only
    right = (np.asarray(model.apply(params, x)).argmax(-1) == y) & keep
    hits[owner] += right.sum()
    scored[owner] += keep.sum()
    if keep.any():
      means[owner].append(right.sum() / keep.sum())
  # ADAM (3 sequences: LONG's 85 characters fill two rows, the second row's first is no
  # target), CAIN, EVE
  assert scored.tolist() == [3 + 84, 12, 0]
  pooled = hits[:2] / scored[:2]
  metrics = natural_dro.make_metrics_fn(prepared.stats, pooled=True)
  out = jax.jit(metrics)(params, {"train": fed.train, "val": fed.val})
  np.testing.assert_allclose(out["heldout_acc_worst"], pooled.min(), atol=1e-6)
  np.testing.assert_allclose(out["heldout_acc_avg"], pooled.mean(), atol=1e-6)
  np.testing.assert_allclose(out["heldout_acc_p10"], np.quantile(pooled, 0.1), atol=1e-6)
  assert abs(np.mean(means[0]) - pooled[0]) > 1e-3, "pick a seed where the two means differ"


def test_a_sequence_s_loss_in_every_problem_form_is_its_masked_token_cross_entropy(tmp_path):
  config = _shakespeare(tmp_path)
  fed = natural_dro.setup(config)
  prepared = natural_dro.prepare(config, 0, fed)
  model = models.ShakespeareLSTM(hidden_size=4, num_layers=1)
  train = fed.train.with_owner()
  row = int(np.flatnonzero((train.examples["y"] == tff.PAD).any(axis=1))[0])  # padded
  example = jax.tree.map(lambda a: a[row], train.examples)
  logits = np.asarray(model.apply(prepared.params, example["x"]), np.float64)
  y = np.asarray(example["y"])
  keep = y != tff.PAD
  tokens = np.log(np.exp(logits).sum(-1)) - logits[np.arange(y.size), y]
  by_hand = tokens[keep].mean()
  assert 0 < keep.sum() < y.size
  np.testing.assert_allclose(prepared.loss(prepared.params, example), by_hand, rtol=1e-5)
  stats = prepared.stats(prepared.params, example)
  np.testing.assert_allclose(stats[0], by_hand, rtol=1e-5)
  methods = {m.label: m for m in runner.methods(config)}
  k = int(example["client"])
  for label, scale in (("fedavg", 1.0), ("feddro", 3.0)):  # erm; the log form: K loss e_k
    problem, _, _ = adult_dro.problem_and_algorithm(
      config, methods[label], prepared.loss, fed.num_clients, "masked_cross_entropy"
    )
    if problem.inner is None:
      value = problem.extra(prepared.params, example)
    else:
      value = problem.inner(prepared.params, example)[k]
    np.testing.assert_allclose(value, scale * by_hand, rtol=1e-5)


def test_the_project_copies_are_the_variants_default_folders(tmp_path):
  shared = str(helpers.SHARED_DATA)
  assert get_femnist().data_dir == os.path.join(shared, "femnist_leaf_sf005")
  assert os.path.normpath(get_shakespeare().data_dir) == os.path.join(shared, "shakespeare_tff")
  for config in (get_femnist(), get_shakespeare()):
    config.data_dir = str(tmp_path / "absent")
    with pytest.raises(FileNotFoundError) as err:
      runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
    assert "\n" not in str(err.value) and str(err.value).startswith("--config.data_dir=")
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize(
  "dataset, field, value, match",
  [
    ("synthetic", "model", "lstm", r"--config.model='lstm' does not fit --config.dataset="),
    ("shakespeare", "model", "cnn", r"one of \('lstm',\)"),
    ("shakespeare", "hidden_size", 0, r"--config.hidden_size"),
  ],
)
def test_bad_model_fields_are_one_line_errors(tmp_path, dataset, field, value, match):
  config = _tiny(dataset=dataset, **{field: value})
  if dataset == "shakespeare":
    config.data_dir = _roles(tmp_path)
  with pytest.raises(ValueError, match=match):
    runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)


def test_warm_start_trains_every_method_s_start_with_sampled_fedavg(tmp_path):
  config = _shakespeare(tmp_path)
  fed = natural_dro.setup(config)
  cold = natural_dro.prepare(config, 1, fed)
  config.warm_start.update(rounds=3, clients_per_round=2, local_steps=3, batch_size=2)
  warm = natural_dro.prepare(config, 1, fed)
  by_hand = fedco.simulate(
    fedco.plain(cold.loss), fedco.fedavg(1.0, 3), fed.train, cold.params, rounds=3, seed=1,
    clients_per_round=2, batch_size=2, evaluate=False, progress=False,
  ).params  # fmt: skip
  jax.tree.map(np.testing.assert_array_equal, warm.params, by_hand)
  assert not np.allclose(
    jax.tree.leaves(warm.params)[0], jax.tree.leaves(cold.params)[0]
  )  # it trained
  for method in runner.methods(config):
    assert natural_dro.build(config, method, 1, warm).params is warm.params
  config.seeds = (1,)
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert summary["warm_start"]["rounds"] == 3


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("rounds", -1, r"--config.warm_start.rounds"),
    ("local_steps", 0, r"--config.warm_start.local_steps"),
    ("learning_rate", 0.0, r"--config.warm_start.learning_rate"),
    ("clients_per_round", 4, r"--config.warm_start.clients_per_round=4 exceeds the 3 clients"),
  ],
)
def test_bad_warm_start_fields_are_one_line_errors(tmp_path, field, value, match):
  config = _shakespeare(tmp_path)
  config.warm_start.update({"rounds": 1, field: value})
  with pytest.raises(ValueError, match=match) as err:
    runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert "\n" not in str(err.value)
