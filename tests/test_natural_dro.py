"""E8 (DRO-FL on natural partitions): Synthetic through the skeleton, paired differences
against FedAvg, FEMNIST from LEAF files, and its refusals."""

import json
import os

import numpy as np
import pytest

import fedco
from experiments import natural_dro
from experiments.configs.natural_dro import get_config
from fedco.experiment import runner

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
  first = natural_dro.prepare(config, 0, None)["fed"]
  second = natural_dro.prepare(config, 1, None)["fed"]
  assert first.num_clients == second.num_clients == 4
  assert not np.array_equal(first.train.counts, second.train.counts)


def test_femnist_writers_from_leaf_files(tmp_path):
  rng = np.random.default_rng(0)

  def writer(n):
    return {"x": rng.random((n, 784)).round(2).tolist(), "y": rng.integers(0, 62, n).tolist()}

  for split, sizes in (("train", (6, 4, 5)), ("test", (2, 2, 1))):
    os.makedirs(tmp_path / "leaf" / split)
    users = {f"f{k:04d}_00": writer(n) for k, n in enumerate(sizes)}
    content = {"users": list(users), "num_samples": list(sizes), "user_data": users}
    with open(tmp_path / "leaf" / split / "all_data_0.json", "w") as f:
      json.dump(content, f)
  config = _tiny(dataset="femnist", data_dir=str(tmp_path / "leaf"), seeds=(0,))
  del config.methods["afl"], config.methods["feddro"]
  summary = runner.train_and_evaluate(config, str(tmp_path / "run"), QUIET)
  assert summary["users"] == 3 and summary["dropped_users"] == 0
  assert summary["table"][0]["method"] == "fedavg" and "note" not in summary["table"][0]


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


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("data_dir", "somewhere", r"--config.data_dir='somewhere' is read for femnist, emnist or leaf"),
    ("num_classes", 0, r"--config.num_classes"),
    ("dataset", "mnist", r"--config.dataset must be one of"),
    ("alpha", -1.0, r"--config.alpha must be a number >= 0"),
    ("gamma", 0.0, r"--config.gamma"),
  ],
)
def test_bad_fields_are_one_line_errors(tmp_path, field, value, match):
  with pytest.raises(ValueError, match=match):
    runner.train_and_evaluate(_tiny(**{field: value}), str(tmp_path), QUIET)
  with pytest.raises(FileNotFoundError, match="--config.data_dir"):
    runner.train_and_evaluate(_tiny(dataset="emnist"), str(tmp_path), QUIET)
