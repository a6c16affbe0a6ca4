"""E2 (experiments.personalized_cifar): mock CIFAR-10 end to end, an offline digits sweep with
a diverging run and a resume, the loop-friendly convolution, bad flags.

Compilation dominates (one simulator program per run, 5-12 s each on 2 busy cores), so runs
are tiny (4 filters, a few rounds, one seed) and use first-order MAML, which halves each
compile. Second order through the binary's convolution is checked at the operation level
(``test_loop_friendly_conv_matches_lax_to_second_order``); the exact MAML problem itself in
``tests/test_personalized.py``.
"""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import common
from experiments import personalized_cifar as e2

TINY = dict(filters=4, batch_size=4, seeds=(0,), progress=False)
RECORD_KEYS = {"round", "algorithm", "seed", "val_acc_avg", "val_acc_worst", "val_loss_avg",
               "val_loss_worst", "val_acc_global_avg", "val_loss_global_avg",
               "val_acc_clients"}


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "curves.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  return config, summary, common.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar10_under_mock_data_runs_every_algorithm(tmp_path):
  # gamma = 5 keeps DA-MAML's step exp(L / gamma) / gamma near 0.3 (gamma = 0.5 diverges)
  with tfds.testing.mock_data(num_examples=500):
    e2.run(str(tmp_path), dataset="cifar10", per_client=20, rounds=2, eval_every=2,
           gamma=5.0, first_order=True, **TINY)
  config, summary, records = _outputs(str(tmp_path))
  assert config["dataset"] == "cifar10" and config["num_clients"] == 10
  assert config["per_client"] == 20 and config["rho"] == 0.28 and config["first_order"]
  assert set(summary["algorithms"]) == set(e2.ALGORITHMS)
  assert summary["client_sizes"]["0"]["train"] == [20] * 10
  for label in e2.ALGORITHMS:
    entry = summary["algorithms"][label]
    assert entry["diverged_seeds"] == [], (label, entry["per_seed"])
    for key in e2.FINAL_KEYS:
      assert np.isfinite(entry[key]["mean"]) and entry[key]["std"] == 0.0
    rows = [r for r in records if r["algorithm"] == label]
    assert [r["round"] for r in rows] == [0, 2]
    for r in rows:
      assert RECORD_KEYS <= set(r)
      assert len(r["val_acc_clients"]) == 10
      assert 0.0 <= r["val_acc_worst"] <= r["val_acc_avg"] <= 1.0
      assert r["val_loss_avg"] <= r["val_loss_worst"]
  weights = [r["client_weights"] for r in records if r["algorithm"] == "tr_maml"]
  assert len(weights) == 2 and np.allclose(np.sum(weights, axis=1), 1.0, atol=1e-5)
  assert np.allclose(weights[0], 0.1)  # uniform at round 0
  # every run starts from the same model; at round 0 personalisation is one step from it
  # (Ditto's personal models are still the initial model)
  first = {r["algorithm"]: r for r in records if r["round"] == 0}
  assert len({r["val_loss_global_avg"] for r in first.values()}) == 1
  ditto = first["ditto"]
  assert ditto["val_loss_avg"] == pytest.approx(ditto["val_loss_global_avg"], rel=1e-5)
  table = {row["algorithm"] for row in summary["table"]}
  assert table == set(e2.ALGORITHMS)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_digits_gamma_sweep_reports_divergence_and_resumes(tmp_path, capsys):
  # with shift 0, gamma = 0.01 puts exp(L / 0.01) ~ exp(230) = inf (float32) in the step
  args = dict(dataset="digits", per_client=30, rounds=4, eval_every=2, checkpoint_every=2,
              sweep="gamma", shift=0.0, first_order=True, **TINY)
  summary = e2.run(str(tmp_path), sweep_values=("5", "0.01"), **args)
  config, _, records = _outputs(str(tmp_path))
  assert config["dataset"] == "digits" and config["sweep_values"] == [5.0, 0.01]
  assert summary["client_sizes"][0]["train"] == [30] * 10
  algos = summary["algorithms"]
  good, bad = algos["comfedl_damaml_gamma=5"], algos["comfedl_damaml_gamma=0.01"]
  assert set(algos) == {"comfedl_damaml_gamma=5", "comfedl_damaml_gamma=0.01"}
  assert good["diverged_seeds"] == [] and np.isfinite(good["val_acc_avg"]["mean"])
  assert bad["diverged_seeds"] == [0] and bad["val_acc_avg"]["mean"] is None
  assert bad["per_seed"][0]["diverged"].startswith("round ")
  assert [r["round"] for r in records if r["algorithm"] == "comfedl_damaml_gamma=5"] == [0, 2, 4]
  assert [r["round"] for r in records if r["algorithm"] == "comfedl_damaml_gamma=0.01"] == [0]
  good_dir = [d for d in os.listdir(tmp_path / "checkpoints") if "gamma=5-" in d]
  assert len(good_dir) == 1 and os.listdir(tmp_path / "checkpoints" / good_dir[0])
  # rerunning restores the finished run from its checkpoint (same settings, same hash)
  capsys.readouterr()
  again = e2.run(str(tmp_path), sweep_values=("5",), **args)
  assert "resumed from round 4" in capsys.readouterr().err
  for key in e2.FINAL_KEYS:
    assert again["algorithms"]["comfedl_damaml_gamma=5"][key] == good[key]
  _, _, rerun = _outputs(str(tmp_path))
  assert rerun == [r for r in records if r["algorithm"] == "comfedl_damaml_gamma=5"]


def test_runs_of_a_sweep():
  config = e2.validate("/tmp/unused", sweep="rho", sweep_values=("0.1", "0.8"))
  runs = e2.runs(config)
  assert [r["label"] for r in runs] == ["comfedl_damaml_rho=0.1", "comfedl_damaml_rho=0.8"]
  assert [r["rho"] for r in runs] == [0.1, 0.8]
  tau = e2.runs(e2.validate("/tmp/unused", sweep="tau"))
  assert [r["tau"] for r in tau] == [1, 2, 5, 10]
  assert e2.validate("/tmp/unused", dataset="digits")["rounds"] == e2.ROUNDS["digits"]


@pytest.mark.parametrize("kwargs,flag", [
    (dict(dataset="mnist"), "--dataset"),
    (dict(algorithms=("fedavg", "sgd")), "--algorithms"),
    (dict(algorithms=()), "--algorithms"),
    (dict(rounds=0), "--rounds"),
    (dict(local_steps=0), "--local_steps"),
    (dict(per_client=0), "--per_client"),
    (dict(rho=1.5), "--rho"),
    (dict(conv_impl="cudnn"), "--conv_impl"),
    (dict(gamma=0.0), "--gamma"),
    (dict(comfedl_lr=-0.1), "--comfedl_lr"),
    (dict(trmaml_weight_lr=0.0), "--trmaml_weight_lr"),
    (dict(ditto_lam=-1.0), "--ditto_lam"),
    (dict(shift=float("nan")), "--shift"),
    (dict(filters=0), "--filters"),
    (dict(eval_chunk=0), "--eval_chunk"),
    (dict(seeds=("a",)), "--seeds"),
    (dict(sweep="lr"), "--sweep"),
    (dict(sweep="tau", sweep_values=("1.5",)), "--sweep_values"),
    (dict(sweep="rho", sweep_values=("2",)), "--sweep_values"),
    (dict(sweep="gamma", sweep_values=("x",)), "--sweep_values"),
])
def test_bad_flags_name_the_flag(tmp_path, kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    e2.validate(str(tmp_path), **kwargs)


def test_per_client_beyond_the_data_names_the_flag(tmp_path):
  with pytest.raises(ValueError, match="--per_client"):
    e2.run(str(tmp_path), dataset="digits", per_client=500, **TINY)


def test_missing_cifar10_is_a_clear_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="cifar10"):
    e2.run(str(tmp_path / "out"), dataset="cifar10", data_dir=str(tmp_path / "empty"), **TINY)
