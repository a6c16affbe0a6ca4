"""E5 (experiments.imbalanced_cifar): the -ST split, CIFAR under tfds.testing.mock_data with a
linear model and with a tiny ResNet20, the I sweep offline, and bad flags."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import imbalanced_cifar as e5
from fedco.data import imbalanced

FAST = dict(rounds=2, eval_every=1, seeds=(0,), progress=False, model="linear")


def test_step_imbalance_keeps_the_last_two_percent_of_the_first_half():
  labels = np.repeat(np.arange(10), 5000)
  np.random.default_rng(0).shuffle(labels)
  rows = imbalanced.step_imbalance(labels, 10)
  kept = labels[rows]
  for c in range(10):
    assert np.sum(kept == c) == (100 if c < 5 else 5000)
    # the LAST rows of the class, in record order
    class_rows = np.flatnonzero(labels == c)
    np.testing.assert_array_equal(rows[kept == c], class_rows[-np.sum(kept == c):])
  assert np.all(np.diff(rows) > 0)
  labels100 = np.repeat(np.arange(100), 500)
  kept100 = labels100[imbalanced.step_imbalance(labels100, 100)]
  assert np.sum(kept100 == 0) == 10 and np.sum(kept100 == 49) == 10 and np.sum(kept100 == 50) == 500


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=1), "num_classes"), (dict(keep_fraction=0.0), "keep_fraction"),
    (dict(keep_fraction=1.5), "keep_fraction"), (dict(num_classes=3), "labels")])
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


def _outputs(tmp_path, **kwargs):
  summary = e5.run(str(tmp_path), **kwargs)
  files = set(os.listdir(tmp_path))
  assert {"config.json", "metrics.jsonl", "summary.json", "accuracy.png"} <= files
  with open(tmp_path / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  with open(tmp_path / "summary.json") as f:
    assert json.load(f)["table"] == summary["table"]
  return summary, records


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar10_st_end_to_end_under_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=240):
    summary, records = _outputs(tmp_path, dataset="cifar10", **FAST)
  assert summary["dataset"] == "cifar10-ST"
  assert set(summary["algorithms"]) == set(e5.ALGORITHMS)
  assert {r["round"] for r in records} == {1, 2}
  for r in records:
    assert 0.0 <= r["test_acc"] <= 1.0 and np.isfinite(r["train_objective"])
  for name in e5.ALGORITHMS:
    entry = summary["algorithms"][name]
    assert entry["test_acc"]["mean"] is not None


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar100_st_with_a_tiny_resnet20_under_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=120):
    # conv_impl="xla" halves ResNet20's compile time here (20 s against 41 s); the default
    # im2col path of ResNet20 is checked against it in tests/test_layers.py.
    summary, records = _outputs(tmp_path, dataset="cifar100", model="resnet20", width=4,
                                conv_impl="xla", algorithms=("feddro",), rounds=1, eval_every=1, seeds=(0,),
                                batch_size=2, eval_examples=16, progress=False)
  assert summary["model"] == "resnet20" and len(records) == 1
  assert np.isfinite(records[0]["train_objective"])


def test_I_sweep_offline_on_digits(tmp_path):
  summary, records = _outputs(tmp_path, dataset="digits", sweep="I", sweep_values=("1", "3"),
                              **FAST)
  assert set(summary["algorithms"]) == {"feddro_I=1", "feddro_I=3", "ds_feddro_I=1",
                                        "ds_feddro_I=3"}
  assert {r["local_steps"] for r in records} == {1, 3}


@pytest.mark.parametrize("kwargs, flag", [
    (dict(dataset="mnist"), "--dataset"), (dict(model="vgg"), "--model"),
    (dict(conv_impl="cudnn"), "--conv_impl"),
    (dict(algorithms=("feddro", "sgd")), "algorithms"), (dict(learning_rate=-0.1),
                                                          "learning_rate"),
    (dict(fastdro_geometry="cvar", fastdro_size=2.0), "fastdro_size"),
    (dict(sweep="I", algorithms=("mbsgd",)), "--sweep=I"), (dict(sweep_values=("2",)),
                                                             "--sweep_values"),
    (dict(batch_size=0), "batch_size"), (dict(lam=0.0), "lam"),
    (dict(keep_fraction=0.0), "keep_fraction")])
def test_bad_flags(tmp_path, kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    e5.validate(str(tmp_path), **kwargs)


def test_missing_tfds_data_is_a_file_not_found_error(tmp_path):
  with pytest.raises(FileNotFoundError):
    e5.run(str(tmp_path / "out"), dataset="cifar10", data_dir=str(tmp_path / "none"), **FAST)
