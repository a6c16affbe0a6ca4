"""The docs guide "Add an experiment" (docs/guides/own_experiment.md), as written: its
config and module run through the driver (``experiments.main``) with a table, resume and a
divergence note."""

import json
import os
import re
import sys

import pytest

from tests import helpers


def _guide():
  section = (helpers.ROOT / "docs" / "guides" / "own_experiment.md").read_text()
  config, module, binary, _, _ = re.findall(r"```python\n(.*?)```", section, re.S)
  command = re.findall(r"```bash\n(.*?)```", section, re.S)[0].split()
  return config, module, binary, command


def _own_method():
  """The guide's "Your own method in a paper's experiment": the algorithm, the config
  variant and the command."""
  section = (helpers.ROOT / "docs" / "guides" / "own_experiment.md").read_text()
  algorithm, config = re.findall(r"```python\n(.*?)```", section, re.S)[3:]
  command = re.findall(r"```bash\n(.*?)```", section, re.S)[1].split()
  return algorithm, config, command


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
  """The guide's two files, written outside the repository (the module on PYTHONPATH)."""
  where = tmp_path_factory.mktemp("guide")
  config, module, _, command = _guide()
  (where / "least_squares.py").write_text(module)
  (where / "least_squares_config.py").write_text(config)
  assert command[:3] == ["python", "-m", "experiments.main"]
  args = [a for a in command[3:] if not a.startswith(("--config=", "--workdir="))]
  return where, args


def _main(path, config, workdir, *flags):
  """``python -m experiments.main`` with ``path`` (the modules' folder) on PYTHONPATH."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(path), str(helpers.ROOT)])}
  command = ["-m", "experiments.main", f"--config={config}", f"--workdir={workdir}", *flags]
  return helpers.run(
    [sys.executable, *command],
    cwd=helpers.ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


def _driver(guide, workdir, *flags):
  where, args = guide
  return _main(where, where / "least_squares_config.py", workdir, *args, *flags)


def _table(stdout):
  return [line for line in stdout.splitlines() if line.startswith(("fedavg", "fedprox"))]


def test_the_guide_experiment_runs_resumes_and_reports_divergence(guide, tmp_path):
  first = _driver(guide, tmp_path / "ls")
  assert first.returncode == 0, first.stderr[-2000:]
  rows = _table(first.stdout)
  assert len(rows) == 2 and all("+-" in row for row in rows), first.stdout  # 2 seeds
  for name in ("config.json", "metrics.jsonl", "metrics.csv", "summary.json"):
    assert (tmp_path / "ls" / name).exists(), name
  again = _driver(guide, tmp_path / "ls")
  assert again.returncode == 0 and _table(again.stdout) == rows
  assert again.stderr.count("resumed from round 30") == 4  # 2 methods x 2 seeds
  diverged = _driver(guide, tmp_path / "ls_lr5", "--config.methods.fedprox.learning_rate=5")
  assert diverged.returncode == 0, diverged.stderr[-2000:]
  row = next(r for r in _table(diverged.stdout) if r.startswith("fedprox"))
  assert re.search(
    r"2 of 2 seeds diverged at round \d+ \(\w+\); try a lower "
    r"--config\.methods\.fedprox\.learning_rate",
    row,
  ), row


def _variant(guide, tmp_path, old, new):
  """The guide's experiment with one line of its module changed, as module ``variant``."""
  where, args = guide
  module = (where / "least_squares.py").read_text()
  assert module.count(old) == 1, old
  (tmp_path / "variant.py").write_text(module.replace(old, new))
  config = (where / "least_squares_config.py").read_text()
  config = config.replace('"least_squares"', '"variant"').replace("(0, 1)", "(0,)")
  (tmp_path / "variant_config.py").write_text(config.replace("rounds = 30", "rounds = 2"))
  config_file = tmp_path / "variant_config.py"
  return _main(tmp_path, config_file, tmp_path / "run", "--noprogress", *args)


def test_a_bug_in_the_modules_own_code_says_where_it_was_raised(guide, tmp_path):
  # a ValueError of the module's code names no flag: one line, with the file, line and hook
  proc = _variant(
    guide,
    tmp_path,
    "  rng = np.random.default_rng(seed)\n",
    "  rng = np.random.default_rng(seed)\n  first, second = (1, 2, 3)\n",
  )
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
  assert re.fullmatch(
    r"error: too many values to unpack .*\(raised at .*variant\.py:\d+, in build\)", lines[0]
  ), lines[0]


def test_a_misspelled_table_key_is_a_warning(guide, tmp_path):
  proc = _variant(
    guide,
    tmp_path,
    'TABLE_KEYS = ("objective", "distance")',
    'TABLE_KEYS = ("objective", "distanse")',
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert re.search(
    r"warning: variant's TABLE_KEYS / PROGRESS name \['distanse'\], which no "
    r"run reports; the runs' final values are \[.*'distance'",
    proc.stderr,
  ), proc.stderr


def test_the_guides_own_binary_runs_it_outside_the_repository(tmp_path):
  # your package, your binary, your configs; fedco as installed, no checkout on the path
  config, module, binary, _ = _guide()
  (tmp_path / "mylab" / "configs").mkdir(parents=True)
  (tmp_path / "mylab" / "__init__.py").write_text("")
  (tmp_path / "mylab" / "main.py").write_text(binary)
  (tmp_path / "least_squares.py").write_text(module)
  config = config.replace("(0, 1)", "(0,)").replace("rounds = 30", "rounds = 2")
  (tmp_path / "mylab" / "configs" / "least_squares.py").write_text(config)
  env = {**os.environ, "PYTHONPATH": str(tmp_path)}
  run = lambda *flags: helpers.run(
    [sys.executable, "-m", "mylab.main", "--workdir=run", "--noprogress", *flags],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  proc = run("--config=mylab/configs/least_squares.py")
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert (tmp_path / "run" / "summary.json").exists()
  library = helpers.run(  # no binary of one's own: the library's command line
    [sys.executable, "-m", "fedco.experiment.cli", "--workdir=run2", "--noprogress"]
    + ["--config=mylab/configs/least_squares.py"],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert library.returncode == 0 and (tmp_path / "run2" / "summary.json").exists(), library.stderr
  proc = run("--config=mylab/configs/nosuch.py")
  assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
    "error: --config='mylab/configs/nosuch.py' is not a config file; available in "
    "mylab/configs/: least_squares.py"
  ], proc.stderr
  # without the table, a divergence is still said
  proc = run(
    "--config=mylab/configs/least_squares.py", "--config.methods.fedprox.learning_rate=1e4"
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert re.search(r"^note: fedprox: diverged at round \d+", proc.stderr, re.M), proc.stderr
  changed = r"^note: run holds the results of another config \(methods\.fedprox\.learning_rate"
  assert re.search(changed, proc.stderr, re.M), proc.stderr  # replaced: said without the table


def test_your_own_method_runs_in_a_paper_experiment_as_the_guide_says(tmp_path):
  algorithm, config, command = _own_method()
  (tmp_path / "mylab").mkdir()
  (tmp_path / "mylab" / "__init__.py").write_text("")
  (tmp_path / "mylab" / "clipped_sgd.py").write_text(algorithm)
  (tmp_path / "mylab" / "e1_clipped.py").write_text(config)
  assert command[:4] == ["python", "-m", "experiments.main", "--config=mylab/e1_clipped.py"]
  flags = [a for a in command[4:] if not a.startswith("--workdir=")]
  assert flags == ["--methods=fedavg,clipped"]
  # the method passes fedco's contract checks (one device here: the mesh check is skipped)
  check = (
    "import fedco.testing, json; from mylab.clipped_sgd import clipped_sgd; "
    "print(json.dumps(fedco.testing.check_algorithm(clipped_sgd)))"
  )
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(helpers.ROOT)])}
  proc = helpers.run(
    [sys.executable, "-c", check],
    cwd=tmp_path,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-2000:]
  report = json.loads(proc.stdout.strip().splitlines()[-1])
  assert all(v == "passed" for k, v in report.items() if k != "mesh"), report
  # and runs in E1 beside FedAvg (a short budget), its row in the table
  short = ["--config.rounds=6", "--config.eval_every=3", "--config.seeds=0,1"]
  proc = _main(tmp_path, tmp_path / "mylab" / "e1_clipped.py", tmp_path / "run", *flags, *short)
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith(("clip", "fed"))]
  assert rows == ["clipped", "fedavg"], proc.stdout
  # editing your algorithm starts its runs afresh; FedAvg's resume
  with open(tmp_path / "mylab" / "clipped_sgd.py", "a") as f:
    f.write("\n# an edit\n")
  proc = _main(tmp_path, tmp_path / "mylab" / "e1_clipped.py", tmp_path / "run", *flags, *short)
  assert proc.returncode == 0, proc.stderr[-2000:]
  resumed = [line for line in proc.stderr.splitlines() if line.startswith("resumed")]
  assert resumed and all("/fedavg-" in line for line in resumed), proc.stderr


def test_editing_your_module_starts_its_runs_afresh(guide, tmp_path):
  where, args = guide
  (tmp_path / "variant.py").write_text((where / "least_squares.py").read_text())
  config = (where / "least_squares_config.py").read_text().replace('"least_squares"', '"variant"')
  (tmp_path / "variant_config.py").write_text(config.replace("rounds = 30", "rounds = 2"))
  again = lambda: _main(tmp_path, tmp_path / "variant_config.py", tmp_path / "run", *args)
  assert again().returncode == 0
  resumed = again()
  assert resumed.returncode == 0 and "resumed from round 2" in resumed.stderr, resumed.stderr
  with open(tmp_path / "variant.py", "a") as f:
    f.write("\n# an edit: its runs' results may differ now\n")
  edited = again()
  assert edited.returncode == 0, edited.stderr[-2000:]
  assert "resumed" not in edited.stderr, edited.stderr  # the old code's checkpoints stay unused
