"""E2 (experiments.personalized_cifar) through its config: mock CIFAR-10 end to end, offline
digits runs with a diverging method and a resume, the ablations, the figure, bad fields.

Compilation dominates (one simulator program per run, 5-12 s each on 2 busy cores), so runs
are tiny (4 filters, a few rounds, one seed) and use first-order MAML, which halves each
compile. Second order through the convolution is checked at the operation level
(``tests/test_layers.py``); the exact MAML problem itself in ``tests/test_personalized.py``.
"""

import json
import os
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from experiments import personalized_cifar as e2
from experiments.configs import personalized_cifar as e2_config
from experiments.configs import personalized_cifar_digits as e2_digits
from fedco.experiment import outputs, runner
from tests import helpers

COMPILE_OPTIMIZED = True  # XLA at level 0 miscompiles im2col backward passes (conftest.py)

QUIET = runner.Options(progress=False)
LABELS = (
  "comfedl_damaml",
  "comfedl_maml",
  "fedavg",
  "fedmaml",
  "tr_maml",
  "ditto",
  "fedrep",
  "apfl",
)
RECORD_KEYS = {
  "round",
  "method",
  "seed",
  "val_acc_avg",
  "val_acc_worst",
  "val_loss_avg",
  "val_loss_worst",
  "val_acc_global_avg",
  "val_loss_global_avg",
  "val_acc_clients",
}


def _tiny(variant=e2_config, methods=LABELS, **changes):
  config = variant.get_config()
  config.filters, config.batch_size, config.seeds, config.first_order = 4, 4, (0,), True
  for label in list(config.methods):
    if label not in methods:
      del config.methods[label]
  for key, value in changes.items():
    setattr(config, key, value)
  return config


def _outputs(workdir):
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json", "curves.png"):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  return config, outputs.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


@pytest.fixture(scope="module")
def mock_cifar(tmp_path_factory):
  """Every method on mock CIFAR-10, 2 rounds (one compiled chunk per method): gamma = 5
  keeps DA-MAML's step exp(L / gamma) / gamma near 0.3."""
  workdir = tmp_path_factory.mktemp("e2")
  config = _tiny(per_client=20, rounds=2, eval_every=2, gamma=5.0)
  with tfds.testing.mock_data(num_examples=500):
    summary = runner.train_and_evaluate(config, str(workdir), QUIET)
  return summary, workdir, config


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_cifar10_under_mock_data_runs_every_method(mock_cifar):
  summary, workdir, _ = mock_cifar
  config, records = _outputs(str(workdir))
  assert config["dataset"] == "cifar10" and config["per_client"] == 20
  assert config["rho"] == 0.28 and config["first_order"]
  assert set(summary["methods"]) == set(LABELS)
  assert summary["client_sizes"][0]["train"] == [20] * 10
  assert summary["settings"]["ditto"]["learning_rate"] == 0.2
  assert summary["settings"]["comfedl_damaml"]["problem"] == {
    "name": "da_maml",
    "inner_lr": 0.05,
    "gamma": 5.0,
    "shift": 0.0,
  }
  for label in LABELS:
    entry = summary["methods"][label]
    assert entry["diverged_seeds"] == [], (label, entry["per_seed"])
    for key in e2.TABLE_KEYS:
      assert np.isfinite(entry[key]["mean"]) and entry[key]["std"] == 0.0
    rows = [r for r in records if r["method"] == label]
    assert [r["round"] for r in rows] == [0, 2]
    for r in rows:
      assert RECORD_KEYS <= set(r)
      assert len(r["val_acc_clients"]) == 10
      assert 0.0 <= r["val_acc_worst"] <= r["val_acc_avg"] <= 1.0
      assert r["val_loss_avg"] <= r["val_loss_worst"]
  weights = [r["client_weights"] for r in records if r["method"] == "tr_maml"]
  assert len(weights) == 2 and np.allclose(np.sum(weights, axis=1), 1.0, atol=1e-5)
  assert np.allclose(weights[0], 0.1)  # uniform at round 0
  # every run starts from the same model; at round 0 personalisation is one step from it
  # (Ditto's personal models are still the initial model)
  first = {r["method"]: r for r in records if r["round"] == 0}
  assert len({r["val_loss_global_avg"] for r in first.values()}) == 1
  for own in ("ditto", "fedrep", "apfl"):  # scored with their own models: the initial one
    row = first[own]
    assert row["val_loss_avg"] == pytest.approx(row["val_loss_global_avg"], rel=1e-5), own
  # after training, each client's own model differs from the shared one
  last = {r["method"]: r for r in records if r["round"] == 2}
  for own in ("ditto", "fedrep", "apfl"):
    assert last[own]["val_loss_avg"] != pytest.approx(last[own]["val_loss_global_avg"], rel=1e-6)
  assert sorted(row["method"] for row in summary["table"]) == sorted(LABELS)
  assert all("note" not in row for row in summary["table"])


def test_figure_labels_every_axis_with_integer_round_ticks():
  # two seeds of every method over rounds 0 and 2, two methods identical (they coincide)
  records = [
    {
      "round": r,
      "method": m,
      "seed": s,
      "val_loss_avg": 2.0 - 0.1 * r + 0.01 * s,
      "val_acc_avg": 0.1 * r + (0.05 if m == "fedavg" else 0.0),
      "val_acc_worst": 0.05 * r,
    }
    for m in LABELS
    for s in (0, 1)
    for r in (0, 2)
  ]
  fig = e2.figure(records, e2_config.get_config(), list(LABELS))
  assert len(fig.axes) == 3
  for ax in fig.axes:
    assert ax.get_xlabel() == "round" and ax.get_ylabel()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert len(ax.get_lines()) == len(LABELS)
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax.get_lines()}
    assert len(styles) == len(LABELS)  # coinciding methods stay distinguishable
  assert len({ax.get_ylabel() for ax in fig.axes}) == 3


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_digits_diverging_method_stays_in_the_table_and_reruns_resume(tmp_path, capsys):
  """ComFedL-DAMAML at the paper's gamma = 0.5, shift 0 diverges within a few rounds; 5
  rounds with evaluation every 2: the evaluation action also runs at round 5, so FedAvg's
  finals are round 5's, finite, not a false divergence."""
  config = _tiny(
    e2_digits, methods=("comfedl_damaml", "fedavg"), per_client=30, rounds=5, eval_every=2
  )
  summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  saved, records = _outputs(str(tmp_path))
  assert saved["dataset"] == "digits" and summary["client_sizes"][0]["train"] == [30] * 10
  bad, good = summary["methods"]["comfedl_damaml"], summary["methods"]["fedavg"]
  assert bad["diverged_seeds"] == [0] and bad["val_acc_avg"]["mean"] is None
  note = bad["per_seed"][0]["diverged"]
  assert note.startswith("diverged at round ") and note.endswith(
    "try a lower --config.methods.comfedl_damaml.learning_rate"
  )
  rows = {row["method"]: row for row in summary["table"]}
  assert set(rows) == {"comfedl_damaml", "fedavg"} and rows["comfedl_damaml"]["note"] == note
  assert rows["comfedl_damaml"]["val_acc_avg"] is None and "note" not in rows["fedavg"]
  assert good["diverged_seeds"] == [] and np.isfinite(good["val_acc_avg"]["mean"])
  fedavg_rows = [r for r in records if r["method"] == "fedavg"]
  assert [r["round"] for r in fedavg_rows] == [0, 2, 4, 5]
  final = good["per_seed"][0]
  assert final["round"] == 5 and final["val_acc_avg"] == fedavg_rows[-1]["val_acc_avg"]
  runs = os.listdir(tmp_path / "checkpoints")
  assert len(runs) == 2 and any(d.startswith("fedavg-seed0-") for d in runs)
  # rerunning restores the finished run from its checkpoint (same settings, same hash) and
  # writes its restored evaluations to the new metrics files
  capsys.readouterr()
  del config.methods["comfedl_damaml"]
  again = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  assert "resumed from round 5" in capsys.readouterr().err
  for key in e2.TABLE_KEYS:
    assert again["methods"]["fedavg"][key] == good[key]
  _, rerun = _outputs(str(tmp_path))
  assert rerun == fedavg_rows
  with open(tmp_path / "metrics.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 4  # header + the four evaluations


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_digits_gamma_ablation_labels_and_notes(tmp_path):
  # with shift 0, gamma = 0.01 puts exp(L / 0.01) ~ exp(230) = inf (float32) in the step
  config = _tiny(
    e2_digits,
    methods=("comfedl_damaml",),
    per_client=30,
    rounds=2,
    eval_every=2,
    ablation="gamma",
    ablation_values=(5.0, 0.01),
  )
  summary = runner.train_and_evaluate(config, str(tmp_path), QUIET)
  _, records = _outputs(str(tmp_path))
  methods = summary["methods"]
  assert list(methods) == ["comfedl_damaml_gamma=5", "comfedl_damaml_gamma=0.01"]
  good, bad = methods["comfedl_damaml_gamma=5"], methods["comfedl_damaml_gamma=0.01"]
  assert good["diverged_seeds"] == [] and np.isfinite(good["val_acc_avg"]["mean"])
  assert bad["diverged_seeds"] == [0]
  # the note names the config field to change, not the ablation's label
  assert bad["per_seed"][0]["diverged"].endswith("--config.methods.comfedl_damaml.learning_rate")
  assert summary["settings"]["comfedl_damaml_gamma=0.01"]["problem"]["gamma"] == 0.01
  assert [r["round"] for r in records if r["method"] == "comfedl_damaml_gamma=5"] == [0, 2]


def _checked_methods(config):
  """The runs of ``config`` after its checks (``check`` returns nothing)."""
  runner.check_shared(config)
  assert e2.check(config) is None
  return e2.methods(config)


def test_ablation_runs_and_defaults():
  runs = _checked_methods(_tiny(ablation="rho", ablation_values=(0.1, 0.8)))
  assert [m.label for m in runs] == ["comfedl_damaml_rho=0.1", "comfedl_damaml_rho=0.8"]
  assert [m.problem["rho"] for m in runs] == [0.1, 0.8]
  runs = _checked_methods(_tiny(ablation="local_steps"))
  assert [m.local_steps for m in runs] == [1, 2, 5, 10]
  assert runs[0].label == "comfedl_damaml_local_steps=1"
  digits = e2_digits.get_config()
  assert digits.rounds == 30 and digits.dataset == "digits"
  assert _checked_methods(digits) and e2.per_client(digits) == 120
  assert e2.per_client(e2_config.get_config()) == 500
  default = e2_config.get_config()
  assert [default[k] for k in runner.SHARED[1:-1]] == [(0, 1, 2), 300, 5, 0.1, 32, 5]
  methods = {m.label: m for m in _checked_methods(default)}
  assert set(methods) == set(LABELS) | {"comfedl_damaml_normalized", "fedper"}
  assert methods["comfedl_damaml_normalized"].kwargs == {"normalized": True, "gamma": 0.5}
  assert methods["tr_maml"].kwargs == {"weights_lr": 0.08}
  assert methods["ditto"].kwargs == {"lam": 0.1, "personal_lr": None}


def _refused(config, tmp_path, match):
  """``runner.train_and_evaluate`` refuses ``config`` with a ``ValueError`` matching ``match``
  (its own checks, or a method's factory) before it writes anything."""
  with pytest.raises(ValueError, match=match):
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize(
  "changes,field",
  [
    (dict(dataset="mnist"), "--config.dataset"),
    (dict(rounds=0), "--config.rounds"),
    (dict(local_steps=0), "--config.local_steps"),
    (dict(per_client=-1), "--config.per_client"),
    (dict(rho=1.5), "--config.rho"),
    (dict(conv_impl="cudnn"), "--config.conv_impl"),
    (dict(gamma=0.0), "--config.gamma"),
    (dict(shift=float("nan")), "--config.shift"),
    (dict(filters=0), "--config.filters"),
    (dict(eval_chunk=0), "--config.eval_chunk"),
    (dict(seeds=("a",)), "--config.seeds"),
    (dict(ablation="lr"), "--config.ablation"),
    (dict(ablation="local_steps", ablation_values=(1.5,)), "--config.ablation_values"),
    (dict(ablation="rho", ablation_values=(2.0,)), "--config.ablation_values"),
    (dict(ablation="gamma", ablation_values=("x",)), "--config.ablation_values"),
  ],
)
def test_bad_fields_name_the_field(changes, field, tmp_path):
  config = e2_config.get_config()
  for key, value in changes.items():
    with config.unlocked():
      config[key] = value
  _refused(config, tmp_path, field)


@pytest.mark.parametrize(
  "label,key,value,field",
  [
    ("comfedl_maml", "learning_rate", -0.1, "--config.methods.comfedl_maml.learning_rate"),
    ("tr_maml", "weights_lr", 0.0, "--config.methods.tr_maml.weights_lr is invalid"),
    ("ditto", "lam", -1.0, "--config.methods.ditto.lam is invalid"),
    ("ditto", "algorithm", "sgd", "--config.methods.ditto.algorithm"),
    ("comfedl_damaml", "q", 1.0, "--config.methods.comfedl_damaml.q"),
  ],
)
def test_bad_method_fields_name_the_field(label, key, value, field, tmp_path):
  config = _tiny(e2_digits)  # offline: the factories check theirs after the data
  config.methods[label][key] = value
  _refused(config, tmp_path, field)


@pytest.mark.parametrize(
  "label,key,value,field",
  [
    ("fedmaml", "inner_lr", 0.0, "--config.methods.fedmaml.problem.inner_lr"),
    ("fedavg", "finetune_lr", None, "--config.methods.fedavg.problem.finetune_lr"),
    ("fedavg", "name", "dro", "--config.methods.fedavg.problem must hold a name"),
    ("ditto", "inner_lr2", 0.1, "--config.methods.ditto.problem.inner_lr2 is not"),
  ],
)
def test_bad_problem_fields_name_the_field(label, key, value, field, tmp_path):
  config = e2_config.get_config()
  config.methods[label].problem[key] = value
  _refused(config, tmp_path, field)


def test_ablation_without_a_da_maml_method_and_misplaced_normalisation_are_refused():
  config = _tiny(methods=("fedavg",), ablation="gamma")
  with pytest.raises(ValueError, match="--config.ablation needs a method with problem"):
    e2.check(config)
  config = _tiny(methods=("comfedl_maml",))
  config.methods.comfedl_maml["normalized"] = True
  with pytest.raises(ValueError, match="comfedl_maml.normalized: .* the maml problem does not"):
    e2.check(config)
  config = _tiny(methods=("comfedl_damaml",))
  config.methods.comfedl_damaml.normalized = True
  with config.unlocked():
    config.methods.comfedl_damaml.gamma = 2.0
  with pytest.raises(ValueError, match="comfedl_damaml.gamma: .*leave it unset"):
    e2.check(config)


def test_per_client_beyond_the_data_names_the_field(tmp_path):
  _refused(_tiny(e2_digits, per_client=500), tmp_path, "--config.per_client")


def test_missing_cifar10_is_one_line_naming_the_offline_dataset(tmp_path):
  config = _tiny(data_dir=str(tmp_path / "empty"))
  with pytest.raises(FileNotFoundError) as err:
    runner.train_and_evaluate(config, str(tmp_path / "out"), QUIET)
  message = str(err.value)
  assert "\n" not in message and "cifar10" in message
  assert "--config.data_dir" in message and "--config.dataset=digits" in message


def test_the_driver_reports_missing_data_and_bad_fields_in_one_line(tmp_path):
  run = lambda *args: helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/personalized_cifar.py",
      f"--workdir={tmp_path}",
      *args,
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  missing = run(f"--config.data_dir={tmp_path / 'empty'}")
  assert missing.returncode == 1 and "Traceback" not in missing.stderr
  last = missing.stderr.strip().splitlines()[-1]
  assert last.startswith("error: TFDS cifar10") and "--config.dataset=digits" in last
  bad = run("--config.ablation=tau")
  assert bad.returncode == 1
  assert bad.stderr.strip().splitlines()[-1].startswith("error: --config.ablation must be")
