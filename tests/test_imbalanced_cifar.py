"""E5 (experiments.imbalanced_cifar): the -ST split, offline digits-ST with rounds past the
last evaluation, the figure, CIFAR under tfds.testing.mock_data with a linear model and with
a tiny ResNet20, the local-steps ablation offline, bad config fields and missing data."""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import imbalanced_cifar as e5
from experiments.configs import imbalanced_cifar as e5_config
from fedco.data import imbalanced
from fedco.experiment import outputs, runner
from tests import helpers

QUIET = runner.Options(progress=False)


def _config(keep=None, **changes):
  """The paper's config on a tiny budget: the linear model, one seed, two rounds."""
  config = e5_config.get_config()
  config.model, config.rounds, config.eval_every, config.seeds = "linear", 2, 1, (0,)
  for label in list(config.methods):
    if keep is not None and label not in keep:
      del config.methods[label]
  for key, value in changes.items():
    setattr(config, key, value)
  return config


def test_step_imbalance_keeps_the_last_two_percent_of_the_first_half():
  labels = np.repeat(np.arange(10), 5000)
  np.random.default_rng(0).shuffle(labels)
  rows = imbalanced.step_imbalance(labels, 10)
  kept = labels[rows]
  for c in range(10):
    assert np.sum(kept == c) == (100 if c < 5 else 5000)
    # the LAST rows of the class, in record order
    class_rows = np.flatnonzero(labels == c)
    np.testing.assert_array_equal(rows[kept == c], class_rows[-np.sum(kept == c) :])
  assert np.all(np.diff(rows) > 0)
  labels100 = np.repeat(np.arange(100), 500)
  kept100 = labels100[imbalanced.step_imbalance(labels100, 100)]
  assert np.sum(kept100 == 0) == 10 and np.sum(kept100 == 49) == 10 and np.sum(kept100 == 50) == 500


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(num_classes=1), "num_classes"),
    (dict(keep_fraction=0.0), "keep_fraction"),
    (dict(keep_fraction=1.5), "keep_fraction"),
    (dict(num_classes=3), "labels"),
  ],
)
def test_step_imbalance_rejects_bad_input(kwargs, match):
  args = dict(labels=np.arange(6) % 4, num_classes=4, **{})
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    imbalanced.step_imbalance(**args)


def test_load_st_under_mock_data_keeps_the_test_split():
  with tfds.testing.mock_data(num_examples=300):
    train, test = imbalanced.load_st("cifar10")
  assert train["x"].shape[1:] == (32, 32, 3) and len(test["y"]) == 300
  counts = np.bincount(train["y"], minlength=10)
  assert counts[:5].max() <= max(1, round(0.02 * 60)) + 1 and counts[5:].sum() > 100
  with pytest.raises(ValueError, match="name"):
    imbalanced.load_st("mnist")


def _outputs(config, workdir):
  summary = runner.train_and_evaluate(config, str(workdir), QUIET)
  files = set(os.listdir(workdir))
  assert {"config.json", "metrics.jsonl", "metrics.csv", "summary.json", "accuracy.png"} <= files
  with open(workdir / "summary.json") as f:
    assert json.load(f)["table"] == summary["table"]
  return summary, outputs.read_jsonl(workdir / "metrics.jsonl")


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
  """Every method on digits-ST, 5 rounds evaluated every 2: at rounds 1, 2, 4 and 5."""
  workdir = tmp_path_factory.mktemp("e5_digits")
  config = _config(dataset="digits", rounds=5, eval_every=2)
  summary, records = _outputs(config, workdir)
  return config, summary, records


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rounds_past_the_last_evaluation_keep_finite_finals(digits_run):
  """Round 5, the last, is evaluated though 2 does not divide it: the finals are its,
  finite, and no method is reported as diverged."""
  config, summary, records = digits_run
  assert set(summary["methods"]) == set(config.methods)
  assert {r["round"] for r in records} == {1, 2, 4, 5}
  assert {r["method"] for r in records} == set(config.methods)
  for label, entry in summary["methods"].items():
    assert entry["diverged_seeds"] == [], label
    assert entry["per_seed"][0]["round"] == 5, label
    for key in e5.TABLE_KEYS:
      assert np.isfinite(entry[key]["mean"]), (label, key)
      assert np.isfinite(entry["per_seed"][0][key]), (label, key)
  assert all("note" not in row for row in summary["table"])
  assert {row["method"] for row in summary["table"]} == set(config.methods)
  for r in records:
    assert 0.0 <= r["test_acc"] <= 1.0 and np.isfinite(r["train_objective"])


def test_methods_keep_their_own_settings(digits_run):
  _, summary, _ = digits_run
  settings = summary["settings"]
  assert settings["feddro"]["local_steps"] == 1 and settings["feddro"]["beta"] == 0.5
  assert settings["fedavg_co"] == {
    "algorithm": "fedavg_co",
    "learning_rate": 0.01,
    "local_steps": 5,
    "case": "II",
  }
  assert settings["ds_feddro"]["server_lr_y"] == 1.4
  assert settings["primal_dual_dro"]["weights_lr"] == 1e-4
  assert summary["dataset"] == "digits-ST" and summary["data"]["num_classes"] == 10


def _panels(fig):
  return {ax.get_ylabel(): ax for ax in fig.axes}


def test_figure_lines_are_distinguishable_and_a_zero_panel_says_why(digits_run):
  config, _, records = digits_run
  labels = list(config.methods)
  zero = [{**r, "test_minority_acc": 0.0} for r in records]
  fig = e5.figure(zero, config, labels)
  panels = _panels(fig)
  for ax in fig.axes:
    assert ax.get_xlabel() == "round" and ax.get_ylabel()
  for key in ("train accuracy", "test accuracy", "train KL-DRO objective"):
    lines = panels[key].get_lines()
    assert [line.get_label() for line in lines] == labels
    styles = {(line.get_linestyle(), line.get_marker()) for line in lines}
    assert len(styles) == len(labels), key  # no two methods look the same
  minority = panels["test accuracy, minority classes"]
  assert not minority.get_lines()  # no flat lines hiding each other at 0 ...
  (text,) = minority.texts  # ... but what the panel measures and why it is 0
  assert "minority classes" in text.get_text() and "is 0" in text.get_text()
  assert "2%" in text.get_text()
  assert sum(ax.get_legend() is not None for ax in fig.axes) == 1  # one legend
  moved = [dict(r, test_minority_acc=0.5) if r["round"] == 4 else r for r in zero]
  minority = _panels(e5.figure(moved, config, labels))["test accuracy, minority classes"]
  assert len(minority.get_lines()) == len(labels) and not minority.texts


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar10_st_end_to_end_under_mock_data(tmp_path):
  config = _config(("feddro", "fastdro"), dataset="cifar10")
  with tfds.testing.mock_data(num_examples=240):
    summary, records = _outputs(config, tmp_path)
  assert summary["dataset"] == "cifar10-ST"
  assert set(summary["methods"]) == {"feddro", "fastdro"}
  assert {r["round"] for r in records} == {1, 2}
  for r in records:
    assert 0.0 <= r["test_acc"] <= 1.0 and np.isfinite(r["train_objective"])
  for entry in summary["methods"].values():
    assert entry["test_acc"]["mean"] is not None


@pytest.mark.compile_optimized  # it trains a CNN: XLA at level 0 can miscompile (conftest.py)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar100_st_with_a_tiny_resnet20_under_mock_data(tmp_path):
  # conv_impl="xla" halves ResNet20's compile time here (20 s against 41 s); the default
  # im2col path of ResNet20 is checked against it in tests/test_layers.py.
  config = _config(
    ("feddro",),
    dataset="cifar100",
    model="resnet20",
    width=4,
    conv_impl="xla",
    rounds=1,
    batch_size=2,
    eval_examples=16,
  )
  with tfds.testing.mock_data(num_examples=120):
    summary, records = _outputs(config, tmp_path)
  assert summary["model"] == "resnet20" and len(records) == 1
  assert np.isfinite(records[0]["train_objective"])


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_local_steps_ablation_offline_on_digits(tmp_path):
  config = _config(
    ("ds_feddro", "mbsgd"), dataset="digits", ablation="local_steps", ablation_values=(1, 3)
  )
  summary, records = _outputs(config, tmp_path)
  labels = {"ds_feddro_local_steps=1", "ds_feddro_local_steps=3"}  # mbsgd has no local steps
  assert set(summary["methods"]) == labels and {r["method"] for r in records} == labels
  assert summary["settings"]["ds_feddro_local_steps=3"]["local_steps"] == 3


def _refused(config, tmp_path, match):
  """``runner.train_and_evaluate`` refuses ``config`` with a ``ValueError`` matching ``match``
  (its own checks, or a method's factory) before it writes anything."""
  with pytest.raises(ValueError, match=match):
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert not os.path.exists(tmp_path / "out")


def _set(config, field, value):
  node = config
  *path, last = field.split(".")
  for name in path:
    node = node[name]
  node[last] = value
  return config


@pytest.mark.parametrize(
  "field, value, match",
  [
    ("dataset", "mnist", "--config.dataset"),
    ("model", "vgg", "--config.model"),
    ("conv_impl", "cudnn", "--config.conv_impl"),
    ("methods.feddro.algorithm", "sgd", "--config.methods.feddro.algorithm"),
    ("methods.mbsgd.algorithm", "no_such", "--config.methods.mbsgd.algorithm must be one of"),
    ("methods.feddro.beta", 1.5, "--config.methods.feddro.beta"),
    ("learning_rate", -0.1, "--config.learning_rate"),
    ("methods.fastdro.geometry", "ball", "--config.methods.fastdro.geometry"),
    ("methods.mbsgd.learning_rate", 0.0, "--config.methods.mbsgd.learning_rate"),
    ("methods.primal_dual_dro.num_examples", 5, "--config.methods.primal_dual_dro.num_examples"),
    ("ablation", "I", "--config.ablation"),
    ("ablation_values", (2,), "--config.ablation_values needs"),
    ("batch_size", -1, "--config.batch_size"),
    ("lam", 0.0, "--config.lam"),
    ("keep_fraction", 0.0, "--config.keep_fraction"),
    ("rounds", 0, "--config.rounds"),
    ("seeds", ("a",), "--config.seeds"),
  ],
)
def test_bad_fields_name_the_field(field, value, match, tmp_path):
  config = _config(dataset="digits")  # offline: the factories check theirs after the data
  with config.unlocked():
    _set(config, field, value)
  _refused(config, tmp_path, match)


def test_bad_ablation_settings(tmp_path):
  config = _config(dataset="digits", ablation="local_steps", ablation_values=(0,))
  _refused(config, tmp_path, "--config.ablation_values")
  config = _config(("mbsgd", "fastdro"), dataset="digits", ablation="local_steps")
  _refused(config, tmp_path, "--config.ablation=local_steps needs a feddro")
  config = _config(("mbsgd", "fastdro"), dataset="digits")
  config.methods.fastdro.geometry, config.methods.fastdro.size = "cvar", 2.0
  _refused(config, tmp_path, "--config.methods.fastdro.size")


def test_missing_tfds_data_names_the_offline_dataset(tmp_path):
  config = _config(dataset="cifar10", data_dir=str(tmp_path / "none"))
  with pytest.raises(FileNotFoundError, match="--config.dataset=digits") as err:
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert "\n" not in str(err.value) and "--config.dataset=cifar10" in str(err.value)
  assert not os.path.exists(tmp_path / "out")  # nothing written before the data loads


def test_the_driver_reports_missing_data_in_one_line(tmp_path):
  proc = helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/imbalanced_cifar.py",
      f"--workdir={tmp_path / 'out'}",
      f"--config.data_dir={tmp_path / 'none'}",
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("error: --config.dataset=cifar10") and "--config.dataset=digits" in last
