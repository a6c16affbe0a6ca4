"""Every experiment config file (variants included): the shared vocabulary, methods from
fedco.ALGORITHMS, checks that refuse bad fields before running, placeholders for every
method's own rate and steps, and a row in docs/guides/reproduce.md for every field."""

import importlib
import sys

import pytest

import fedco
from fedco.experiment import cli as driver
from fedco.experiment import runner
from tests import helpers

NAMES = runner.experiments()
# every file, variants included
CONFIGS = tuple(sorted(p.stem for p in (helpers.ROOT / "experiments" / "configs").glob("[!_]*.py")))


def _config(name, mode=""):
  """``experiments/configs/<name>.py``'s config, or its variant ``<name>_<mode>.py``'s."""
  variant = f"{name}_{mode}" if mode else name
  return importlib.import_module(f"experiments.configs.{variant}").get_config()


def _check(config) -> None:
  """The config checks of ``runner.train_and_evaluate`` (shared fields, the experiment's
  ``check``, the methods), without loading data."""
  runner.check(config)
  runner.methods(config)


def _fields(node, prefix=""):
  for key, value in node.items():
    if key == "methods":  # documented as one field: labels and their factory arguments
      yield prefix + key
    elif hasattr(value, "items"):
      yield from _fields(value, f"{prefix}{key}.")
    else:
      yield prefix + key


def test_every_experiment_has_a_config_and_every_config_an_experiment():
  assert len(NAMES) >= 8 and set(NAMES) <= set(CONFIGS), (NAMES, CONFIGS)
  for name in CONFIGS:  # a variant is <experiment>_<variant>.py
    experiment = _config(name).experiment
    assert name == experiment or name.startswith(experiment + "_"), name


@pytest.mark.parametrize("name", CONFIGS)
def test_a_config_speaks_the_shared_vocabulary(name):
  config = _config(name)
  missing = [f for f in runner.SHARED if f not in config]
  assert not missing, f"{name} lacks {missing}"
  for old in ("tau", "p", "I", "iterations", "algorithms", "progress", "sweep"):
    assert old not in config, f"{name} still has {old!r}"
  methods = runner.methods(config)
  assert methods and all(m.algorithm in fedco.ALGORITHMS for m in methods)
  for entry in config.methods.values():  # the shared values apply unless a file sets its own
    assert "learning_rate" in entry and "local_steps" in entry
  _check(config)  # the defaults are valid


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
  "field,value", [("rounds", 0), ("learning_rate", -1.0), ("eval_every", 0), ("seeds", ("a",))]
)
def test_every_experiment_refuses_bad_shared_fields(name, field, value):
  config = _config(name)
  setattr(config, field, value)
  with pytest.raises(ValueError, match=rf"--config\.{field}"):
    _check(config)


@pytest.mark.parametrize("name", NAMES)
def test_every_experiment_refuses_an_unknown_algorithm_or_argument(name):
  config = _config(name)
  label = next(iter(config.methods))
  config.methods[label].algorithm = "fedsgd"
  with pytest.raises(ValueError, match=rf"--config\.methods\.{label}\.algorithm"):
    _check(config)
  config = _config(name)
  with config.unlocked():
    config.methods[label].no_such_argument = 1.0
  with pytest.raises(ValueError, match="no_such_argument is not an argument"):
    _check(config)


def test_an_unknown_experiment_is_named():
  config = _config("dro_fl")
  config.experiment = "runner"  # a module of experiments/, but no experiment
  with pytest.raises(ValueError, match="--config.experiment must name a module with a build"):
    runner.check(config)


def _field_tables() -> str:
  """The reproduce guide's shared-fields and experiment-fields tables, their rows only."""
  guide = (helpers.ROOT / "docs" / "guides" / "reproduce.md").read_text()
  start = guide.index("**Shared fields**")
  rows = guide.index("\n|", guide.index("Experiment fields", start))  # its table's first row
  tables = guide[start : guide.index("\n\n", rows)]
  return "\n".join(line for line in tables.splitlines() if line.startswith("|"))


def test_every_config_field_is_documented_in_the_reproduce_guide():
  """In the fields tables, not anywhere in the guide (a name in prose is no entry)."""
  readme = _field_tables()
  assert readme.count("\n") > 20, "the fields tables were not found"
  missing = []
  for name in CONFIGS:
    missing += [
      f"{name}: {f}"
      for f in _fields(_config(name))
      if f"`{f}`" not in readme and f"`{f}=" not in readme
    ]
  assert not missing, missing


def test_the_driver_help_lists_how_to_run_flags():
  out = helpers.run(
    [sys.executable, "-m", "experiments.main", "--help"],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  for flag in (
    "--config",
    "--workdir",
    "--methods",
    "--[no]resume",
    "--checkpoint_every",
    "--[no]progress",
  ):
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


def test_a_method_takes_its_own_rate_and_steps_where_the_file_sets_neither():
  """Placeholders: ``--config.methods.<label>.learning_rate`` / ``.local_steps`` override
  any method (typed: an int rate becomes a float, 2.5 steps are refused), the others keep
  the shared values."""
  config = _config("dro_fl")
  assert config.methods.comfedl.learning_rate is None  # unset: the shared value applies
  config.methods.comfedl.learning_rate = 1
  config.methods.drfa.local_steps = 3
  methods = {m.label: m for m in runner.methods(config)}
  assert methods["comfedl"].learning_rate == 1.0 and methods["drfa"].local_steps == 3
  assert methods["fedavg"].learning_rate == config.learning_rate
  assert methods["fedavg"].local_steps == config.local_steps
  with pytest.raises(TypeError, match="cannot be casted"):
    config.methods.fedavg.local_steps = 2.5


def test_a_badly_typed_method_override_is_one_line(tmp_path):
  proc = helpers.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/dro_fl.py",
      f"--workdir={tmp_path}",
      "--config.methods.fedavg.local_steps=2.5",
    ],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert proc.returncode == 1 and "Traceback" not in proc.stderr
  line = proc.stderr.strip().splitlines()[-1]
  assert line.startswith("error:") and "--config.methods.fedavg.local_steps" in line, line
  assert not list(tmp_path.iterdir())


def test_dro_fl_extended_adds_scaffold_fedprox_and_fedadam():
  """``dro_fl_extended.py``: the default methods plus three FedAvg variants, checked."""
  default, extended = _config("dro_fl"), _config("dro_fl", "extended")
  assert extended.mode == "run"
  assert sorted(extended.methods) == sorted([*default.methods, "scaffold", "fedprox", "fedadam"])
  _check(extended)
  methods = {m.label: m for m in runner.methods(extended)}
  assert {label: methods[label].algorithm for label in ("scaffold", "fedprox", "fedadam")} == {
    "scaffold": "scaffold",
    "fedprox": "fedprox",
    "fedadam": "fedadam",
  }


@pytest.mark.parametrize("name", NAMES)
def test_an_old_mode_is_refused_naming_the_variant_file(name):
  path = f"{helpers.ROOT}/experiments/configs/{name}.py"
  with pytest.raises(driver._Unusable, match=f"variants are files: .*{name}_no_such_mode.py"):
    driver._config_file(["main", f"--config={path}:no_such_mode"])
