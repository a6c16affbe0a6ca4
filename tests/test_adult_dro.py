"""DRO-FL on UCI Adult (doctorate vs other) through the config driver, on the real data."""

import sys

import pytest

from experiments.configs import adult_dro as adult_config
from fedco.experiment import outputs, runner
from tests import helpers


def _tiny(**changes):
  config = adult_config.get_config()
  config.seeds = (0,)
  config.rounds, config.local_steps, config.eval_every = 7, 2, 2
  keep = ("fedavg", "comfedl", "comfedl_normalized", "feddro")
  for label in list(config.methods):
    if label not in keep:
      del config.methods[label]
  for key, value in changes.items():
    setattr(config, key, value)
  return config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("adult")
  return runner.train_and_evaluate(_tiny(), str(workdir), runner.Options(progress=False)), workdir


def test_two_clients_split_by_doctorate_and_every_method_reports(tiny_run):
  summary, workdir = tiny_run
  assert summary["clients"] == {"train": [413, 32148], "test": [181, 16100]}
  methods = summary["methods"]
  assert set(methods) == {"fedavg", "comfedl", "comfedl_normalized", "feddro"}
  for label in ("fedavg", "comfedl_normalized", "feddro"):
    final = methods[label]["per_seed"][0]
    assert methods[label]["diverged_seeds"] == [] and 0.0 <= final["test_acc_worst"] <= 1.0
    assert final["train_loss_avg"] < 0.69, (label, final)  # learnt: below log 2
  # 7 rounds, evaluation every 2: the last round is evaluated too, and the finals are its
  assert methods["fedavg"]["per_seed"][0]["round"] == 7
  rows = outputs.read_jsonl(workdir / "metrics.jsonl")  # streamed by the runtime's writers
  assert {r["method"] for r in rows} >= {"fedavg", "comfedl_normalized", "feddro"}
  assert all(
    0 <= r["test_acc_worst"] <= min(r["test_acc_doctorate"], r["test_acc_other"]) for r in rows
  )
  assert set(summary["doctorate_test_acc_above_fedavg"]) >= {"comfedl_normalized", "feddro"}
  assert (workdir / "adult_dro.png").exists()


def test_the_driver_runs_a_config_file_and_refuses_bad_fields(tmp_path):
  run = lambda *args: helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/adult_dro.py",
      f"--workdir={tmp_path}",
      *args,
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  bad = run("--config.budget=forever")
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.strip().splitlines()[-1].startswith("error: --config.budget must be one of")
  unknown = run("--config.methods.fedavg.q=1.0")  # ml_collections refuses a new field
  assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
  missing = run("--config.data_dir=/nonexistent")
  assert missing.returncode == 1 and "--config.data_dir" in missing.stderr


def test_a_method_without_a_problem_form_solves_the_one_of_its_kind():
  from experiments import adult_dro

  config = adult_config.get_config()
  forms = {}
  for algorithm in ("fedavg", "comfedl", "feddro"):
    method = runner.Method(algorithm, algorithm, {}, 0.1, 2)  # no "problem" in its entry
    problem, _, _ = adult_dro.problem_and_algorithm(config, method, lambda p, e: 0.0, 2, "bce")
    forms[algorithm] = problem.kind if problem.compositional else "plain"
  assert forms == {"fedavg": "plain", "comfedl": "local", "feddro": "global"}
  config.methods.fedavg.problem = "kl_two"
  with pytest.raises(ValueError, match=r"--config\.methods\.fedavg\.problem must be one of"):
    adult_dro.check_problems(config)
