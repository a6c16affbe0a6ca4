"""E1 (experiments.dro_fl): offline digits, MNIST under tfds.testing.mock_data, bad flags."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import common, dro_fl

FAST = dict(rounds=6, eval_every=3, seeds=(0,), progress=False)


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "summary.json", "accuracy.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  return summary, common.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_digits_runs_every_algorithm_and_writes_the_contract(tmp_path):
  summary, records = _outputs_of(tmp_path, dataset="digits", comfedl_lr=1e-6)
  assert set(summary["algorithms"]) == set(dro_fl.ALGORITHMS)
  assert {r["round"] for r in records} == {1, 3, 6}
  first = records[0]
  for key in ("train_acc_avg", "train_acc_worst", "val_acc_avg", "val_acc_worst",
              "train_loss_avg", "train_loss_worst", "val_loss_avg", "val_loss_worst"):
    assert key in first
  for r in records:
    assert 0.0 <= r["val_acc_worst"] <= r["val_acc_avg"] <= 1.0
  weights = [r["client_weights"] for r in records if r["algorithm"] == "comfedl"]
  assert weights and np.allclose(np.sum(weights[-1]), 1.0, atol=1e-5)
  fedavg = summary["algorithms"]["fedavg"]
  assert fedavg["val_acc_avg"]["mean"] > 0.3  # six rounds already learn the digits
  assert "comfedl_worst_val_at_least_fedavg" in summary


def _outputs_of(tmp_path, **kwargs):
  dro_fl.run(str(tmp_path), **{**FAST, **kwargs})
  return _outputs(str(tmp_path))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_paper_defaults_report_comfedl_divergence_instead_of_crashing(tmp_path):
  summary, records = _outputs_of(tmp_path, dataset="digits", algorithms=("comfedl",))
  assert summary["algorithms"]["comfedl"]["diverged_seeds"] == [0]
  per_seed = summary["algorithms"]["comfedl"]["per_seed"]["0"]
  assert per_seed["diverged"] == (f"diverged at round {per_seed['diverged_round']} "
                                  f"({per_seed['diverged_quantity']}); try a lower --comfedl_lr")
  assert all(r["round"] < per_seed["diverged_round"] for r in records)  # finite rounds only
  row = next(r for r in summary["table"] if r["algorithm"] == "comfedl")
  assert row["note"] == per_seed["diverged"]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rounds_past_the_last_evaluation_keep_finite_finals(tmp_path):
  """7 rounds with evaluation every 3: round 7 is not evaluated; the finals are round 6's,
  finite, and nothing is reported as diverged. Normalised ComFedL stays finite at the
  paper's gamma and rate, where the printed step diverges."""
  summary, _ = _outputs_of(tmp_path, dataset="digits", rounds=7, eval_every=3,
                           algorithms=("comfedl_normalized", "fedavg"))
  for name in ("comfedl_normalized", "fedavg"):
    entry = summary["algorithms"][name]
    assert entry["diverged_seeds"] == [] and np.isfinite(entry["val_acc_worst"]["mean"])
    assert entry["per_seed"]["0"]["round"] == 6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_mnist_end_to_end_under_mock_data(tmp_path):
  with tfds.testing.mock_data(num_examples=400):
    summary, records = _outputs_of(tmp_path, dataset="mnist", big=100, small=5,
                                   comfedl_lr=1e-6)
  assert summary["dataset"] == "mnist"
  assert set(summary["algorithms"]) == set(dro_fl.ALGORITHMS)
  assert all(np.isfinite(r["val_acc_avg"]) for r in records)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gamma_sweep_runs_comfedl_variants(tmp_path):
  summary, _ = _outputs_of(tmp_path, dataset="digits", sweep="gamma", sweep_values=("2", "5"),
                           rounds=3, eval_every=3, comfedl_lr=1e-3)
  assert set(summary["algorithms"]) == {"comfedl_gamma=2", "comfedl_gamma=5"}


@pytest.mark.parametrize("kwargs,flag", [
    (dict(dataset="cifar7"), "--dataset"),
    (dict(algorithms=("comfedl", "sgd")), "--algorithms"),
    (dict(rounds=0), "--rounds"),
    (dict(learning_rate=-0.1), "--learning_rate"),
    (dict(q=-1.0), "--q"),
    (dict(tau=1), "--tau"),
    (dict(seeds=("a",)), "--seeds"),
    (dict(sweep="lr"), "--sweep"),
    (dict(sweep="tau", sweep_values=("0",)), "--sweep_values"),
])
def test_bad_flags_name_the_flag(tmp_path, kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    dro_fl.validate(str(tmp_path), **kwargs)


def test_missing_tfds_dataset_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="mnist"):
    dro_fl.run(str(tmp_path / "out"), dataset="mnist", data_dir=str(tmp_path / "empty"), **FAST)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rerun_resumes_from_checkpoints_and_plot_regenerates(tmp_path, capsys):
  from experiments import plot
  args = dict(dataset="digits", algorithms=("fedavg", "drfl"), checkpoint_every=3, **FAST)
  first = dro_fl.run(str(tmp_path), **args)
  runs = os.listdir(tmp_path / "checkpoints")
  assert len(runs) == 2 and all(os.listdir(tmp_path / "checkpoints" / r) for r in runs)
  capsys.readouterr()
  second = dro_fl.run(str(tmp_path), **args)  # restores the finished runs
  assert first["algorithms"] == second["algorithms"]
  assert capsys.readouterr().err.count("resumed from round 6") == 2  # both runs resumed
  changed = dro_fl.run(str(tmp_path), **{**args, "learning_rate": 0.02})  # new hash
  assert len(os.listdir(tmp_path / "checkpoints")) == 4
  assert changed["algorithms"]["fedavg"] != first["algorithms"]["fedavg"]
  with open(tmp_path / "metrics.csv") as f:
    header = f.readline().strip().split(",")
  assert {"round", "algorithm", "seed", "val_acc_worst"} <= set(header)
  out = plot.plot(str(tmp_path), ["val_acc_worst"], out="again.png")
  assert os.path.getsize(out) > 0
  with pytest.raises(ValueError, match="--metrics"):
    plot.plot(str(tmp_path), ["nope"])
