"""WORKSPACE.md's "Add an experiment", as written: its config and module run through the
driver (``experiments.main``) with a table, resume and a divergence note."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _guide():
  text = (ROOT / "WORKSPACE.md").read_text()
  section = text.split("## Add an experiment", 1)[1].split("\n## ", 1)[0]
  config, module = re.findall(r"```python\n(.*?)```", section, re.S)
  command = re.findall(r"```bash\n(.*?)```", section, re.S)[0].split()
  return config, module, command


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
  """The guide's two files, written outside the repository (the module on PYTHONPATH)."""
  where = tmp_path_factory.mktemp("guide")
  config, module, command = _guide()
  (where / "least_squares.py").write_text(module)
  (where / "least_squares_config.py").write_text(config)
  assert command[:3] == ["python", "-m", "experiments.main"]
  args = [a for a in command[3:] if not a.startswith(("--config=", "--workdir="))]
  return where, args


def _driver(guide, workdir, *flags):
  where, args = guide
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(where), str(ROOT)])}
  return subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.main",
      f"--config={where}/least_squares_config.py",
      f"--workdir={workdir}",
      *args,
      *flags,
    ],
    cwd=ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )


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
