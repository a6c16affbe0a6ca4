"""Every experiment config: the shared vocabulary, methods from fedco.ALGORITHMS, a check
that refuses bad shared fields before running, and a README row for every field."""

import importlib
import pathlib

import pytest

import fedco
from experiments import main as driver
from experiments import runner

ROOT = pathlib.Path(__file__).resolve().parents[1]
NAMES = driver.EXPERIMENTS


def _config(name, mode=""):
  return importlib.import_module(f"experiments.configs.{name}").get_config(mode)


def _fields(node, prefix=""):
  for key, value in node.items():
    if key == "methods":  # documented as one field: labels and their factory arguments
      yield prefix + key
    elif hasattr(value, "items"):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def test_every_experiment_has_a_config():
  modules = sorted(p.stem for p in (ROOT / "experiments" / "configs").glob("*.py")
                   if not p.stem.startswith("_"))
  assert list(NAMES) == modules and len(NAMES) >= 8, NAMES


@pytest.mark.parametrize("name", NAMES)
def test_a_config_speaks_the_shared_vocabulary(name):
  config = _config(name)
  assert config.experiment == name
  missing = [f for f in runner.SHARED if f not in config]
  assert not missing, f"{name} lacks {missing}"
  for old in ("tau", "p", "I", "iterations", "algorithms", "progress", "sweep"):
    assert old not in config, f"{name} still has {old!r}"
  module = importlib.import_module(f"experiments.{name}")
  methods = runner.methods(config, extra_keys=("problem",))
  assert methods and all(m.algorithm in fedco.ALGORITHMS for m in methods)
  settings = module.check(config)  # the defaults are valid
  assert settings is not None


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field,value", [("rounds", 0), ("learning_rate", -1.0),
                                         ("eval_every", 0), ("seeds", ("a",))])
def test_every_experiment_refuses_bad_shared_fields(name, field, value):
  config = _config(name)
  setattr(config, field, value)
  module = importlib.import_module(f"experiments.{name}")
  with pytest.raises(ValueError, match=rf"--config\.{field}"):
    module.check(config)


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_refuses_an_unknown_algorithm_or_argument(name):
  module = importlib.import_module(f"experiments.{name}")
  config = _config(name)
  label = next(iter(config.methods))
  config.methods[label].algorithm = "fedsgd"
  with pytest.raises(ValueError, match=rf"--config\.methods\.{label}\.algorithm"):
    module.check(config)
  config = _config(name)
  with config.unlocked():
    config.methods[label].no_such_argument = 1.0
  with pytest.raises(ValueError, match="no_such_argument is not an argument"):
    module.check(config)


def test_every_config_field_is_documented_in_the_readme():
  readme = (ROOT / "README.md").read_text()
  missing = []
  for name in NAMES:
    modes = {"dro_fl": ("", "grid", "extended"), "fair_adult": ("", "privacy", "compression"),
             "fedavg_counterexample": ("", "compression"),
             "adult_dro": ("", "privacy")}.get(name, ("",))
    for mode in modes:
      missing += [f"{name}: {f}" for f in _fields(_config(name, mode))
                  if f"`{f}`" not in readme and f"`{f}=" not in readme]
  assert not missing, missing


def test_the_driver_help_lists_how_to_run_flags():
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  out = subprocess.run([sys.executable, "-m", "experiments.main", "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  for flag in ("--config", "--workdir", "--methods", "--[no]resume", "--checkpoint_every",
               "--[no]progress"):
    assert flag in out.stdout + out.stderr, flag


def test_the_driver_methods_flag_keeps_only_the_named_labels():
  config = _config("dro_fl")
  driver.select(config, ["fedavg", "drfa"])
  assert sorted(config.methods) == ["drfa", "fedavg"]
  with pytest.raises(ValueError, match="--methods: \\['sgd'\\] are not in config.methods"):
    driver.select(_config("dro_fl"), ["sgd"])
  config = _config("dro_fl")
  driver.select(config, [])  # no --methods: every method
  assert len(config.methods) == 5


def test_a_method_takes_its_own_rate_and_steps_from_the_command_line():
  """--config.methods.<label>.learning_rate / .local_steps where the file sets neither."""
  config = _config("dro_fl")
  assert "learning_rate" not in config.methods.comfedl
  match = driver.METHOD_OVERRIDE.fullmatch("--config.methods.comfedl.learning_rate=1e-7")
  driver.set_method_fields(config, [match.groups(), ("drfa", "local_steps", "3")])
  methods = {m.label: m for m in runner.methods(config)}
  assert methods["comfedl"].learning_rate == 1e-7 and methods["drfa"].local_steps == 3
  assert methods["fedavg"].learning_rate == config.learning_rate  # the others keep theirs
  with config.unlocked():
    config.methods.fedavg.learning_rate = 1  # a file's int: the override is a float anyway
  driver.set_method_fields(config, [("fedavg", "learning_rate", "0.5")])
  assert config.methods.fedavg.learning_rate == 0.5
  for override, message in ((("sgd", "learning_rate", "0.1"), "'sgd' is not in config"),
                            (("fedavg", "learning_rate", "x"), "must be a number, got 'x'"),
                            (("fedavg", "local_steps", "2.5"), "must be an integer")):
    with pytest.raises(ValueError, match=f"--config.methods.{override[0]}.{override[1]}"
                                         f".*{message}"):
      driver.set_method_fields(_config("dro_fl"), [override])


def test_dro_fl_extended_adds_scaffold_fedprox_and_fedadam():
  """E1's ``:extended`` mode: the default methods plus three FedAvg variants, checked."""
  module = importlib.import_module("experiments.dro_fl")
  default, extended = _config("dro_fl"), _config("dro_fl", "extended")
  assert extended.mode == "run"
  assert sorted(extended.methods) == sorted([*default.methods, "scaffold", "fedprox",
                                             "fedadam"])
  methods = {m.label: m for m in module.check(extended)["methods"]}
  assert {label: methods[label].algorithm for label in ("scaffold", "fedprox", "fedadam")} == {
      "scaffold": "scaffold", "fedprox": "fedprox", "fedadam": "fedadam"}


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_mode_is_refused(name):
  with pytest.raises(ValueError, match="mode"):
    _config(name, "no_such_mode")
