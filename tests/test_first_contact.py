"""First contact (issue 44): inputs that cannot waste an hour, interrupts and messages that say
what is true, and what a newcomer sees first.

A batch larger than every client is refused naming the largest (decision 98); a Ctrl-C while
a driver starts is one line and exit 130; a stopped run's line lists what its workdir holds;
the plot command draws, or says in one line that there is nothing to draw, on any workdir;
the CLI's errors (a negative seed, a ``get_config`` returning a dict, a missing package, a
full disk) are one line naming the flag or file; ``simulate`` shows a bar only where a long
run meets a terminal.
"""

import errno
import json
import logging
import os
import signal
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import fedco
from fedco import experiment
from fedco.experiment import cli, outputs, plot, runner
from fedco.runtime import host
from tests import helpers

ENV = {**os.environ, "PYTHONPATH": str(helpers.ROOT), "JAX_PLATFORMS": "cpu"}
SMALL = fedco.FederatedData.from_clients(
  [{"r": np.zeros((3, 2), np.float32)}, {"r": np.zeros((9, 2), np.float32)}]
)


# ---- a batch larger than every client ----------------------------------------------------


def test_a_batch_larger_than_every_client_is_refused_naming_the_largest():
  for name in ("batch_size", "outer_batch_size"):
    with pytest.raises(
      ValueError,
      match=rf"^{name}=100 is larger than the largest client \(9 examples\).* use "
      rf"{name}=None \(each client's whole data\) or at most 9$",
    ):
      fedco.Simulator(
        fedco.problems.portfolio(1.0), fedco.feddro(), SMALL, **{"batch_size": None, name: 100}
      )
  for size in (9, 32):  # between the smallest and the largest, or the default: a warning
    with pytest.warns(UserWarning, match=f"batch_size={size} is larger than the smallest client"):
      fedco.Simulator(fedco.problems.portfolio(1.0), fedco.feddro(), SMALL, batch_size=size)


def _least_squares(batch_size):
  module = experiment_module()
  config = ml_collections.ConfigDict(
    dict(
      experiment="least_squares",
      seeds=(0,),
      rounds=2,
      local_steps=1,
      learning_rate=0.1,
      batch_size=batch_size,
      eval_every=1,
      methods=experiment.method_entries({"fedavg": {"algorithm": "fedavg"}}),
    )
  )
  return module, config


def experiment_module():
  import types

  module = types.ModuleType("least_squares")
  module.TABLE_KEYS, module.PROGRESS = ("objective",), "objective"

  def build(config, method, seed, prepared):
    x = np.random.default_rng(seed).normal(size=(2, 10, 3)).astype(np.float32)
    data = fedco.FederatedData.from_clients([{"x": c, "y": c.sum(1)} for c in x])
    loss = lambda w, e: 0.5 * (e["x"] @ w - e["y"]) ** 2
    return experiment.Run(fedco.plain(loss), method.build(), data, jnp.zeros(3))

  module.build = build
  return module


def test_the_experiments_refuse_such_a_batch_naming_the_config_field_before_writing(tmp_path):
  module, config = _least_squares(100000)
  with pytest.raises(
    ValueError,
    match=r"^--config.batch_size=100000 is larger than the largest client \(10 examples\).*"
    r"use --config.batch_size=0 \(each client's whole data\) or at most 10$",
  ):
    experiment.train_and_evaluate(config, tmp_path / "run", module=module)
  assert not (tmp_path / "run").exists()  # refused before anything is written
  with pytest.raises(ValueError, match=r"^--config.batch_size=33 is larger"):  # grid search
    runner.search(
      runner.Method("m", "fedavg", {}, 0.1, 1),
      {"learning_rate": (0.1,)},
      problem_axes=(),
      make_problem=None,
      algorithm_kwargs=None,
      score=None,
      data=fedco.FederatedData.from_clients([{"r": np.zeros((10, 2), np.float32)}]),
      params=jnp.zeros(2),
      seed=0,
      rounds=1,
      batch_size=33,
    )


# ---- Ctrl-C while a driver starts ----------------------------------------------------------


@pytest.mark.parametrize("module", ["experiments.main", "fedco.experiment.cli"])
def test_a_ctrl_c_while_a_driver_starts_is_one_line_and_exit_130(module, tmp_path):
  """SIGINT once the driver is inside its imports (``-X importtime`` says when JAX's modules
  load), so the moment does not depend on the machine's speed."""
  proc = subprocess.Popen(
    [sys.executable, "-X", "importtime", "-m", module, "--config=experiments/configs/dro_fl.py"]
    + [f"--workdir={tmp_path / 'run'}", "--noprogress"],
    cwd=helpers.ROOT,
    env=ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    # As from a terminal: pytest-xdist's workers ignore SIGINT, and a driver started with
    # Ctrl-C ignored (a background job) keeps it ignored, as it should.
    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
  )
  seen = []
  for line in proc.stderr:  # import lines, as each module finishes loading
    seen.append(line)
    if line.startswith("import time:") and line.rstrip().endswith("jax._src.config"):
      break
  proc.send_signal(signal.SIGINT)
  _, err = helpers.communicate(proc, 120)
  lines = [l for l in err.splitlines() if l.strip() and not l.startswith("import time:")]
  assert proc.returncode == 130, (proc.returncode, lines[-20:])
  assert lines == [
    "interrupted while starting, before anything ran; nothing was written"
  ] or (  # a machine fast enough to finish the imports first: the driver's own line
    len(lines) == 1 and lines[0].startswith("interrupted")
  ), lines[-20:]
  assert "Traceback" not in err and not (tmp_path / "run").exists()


def _mine(signum, frame):  # a user's own SIGINT handler
  del signum, frame


@pytest.mark.parametrize("before", [signal.SIG_IGN, _mine, signal.SIG_DFL])
def test_the_start_up_handler_leaves_an_ignored_or_users_ctrl_c_as_it_was(before):
  """A background job (``cmd &``) starts with Ctrl-C ignored; a user's binary may have its own
  handler: begin() leaves either in place, and end() leaves it as it was."""
  from fedco import _startup

  saved = signal.signal(signal.SIGINT, before)
  try:
    _startup.begin()
    assert signal.getsignal(signal.SIGINT) is before  # Ctrl-C stays as the user asked
    _startup.end()
    assert signal.getsignal(signal.SIGINT) is before
    _startup.hand_over(_mine if before is not _mine else None, before)  # not installed: no-op
    assert signal.getsignal(signal.SIGINT) is before
  finally:
    signal.signal(signal.SIGINT, saved)


def test_the_start_up_handler_replaces_only_pythons_default_and_end_restores_it():
  from fedco import _startup

  saved = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    _startup.begin()
    assert signal.getsignal(signal.SIGINT) is _startup._stop
    _startup.begin()  # twice (the import's and cli.run's): end() still restores Python's
    _startup.end()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, _mine)  # experiments/main.py's own, handed over
    _startup.hand_over(_mine, signal.SIG_IGN)
    assert signal.getsignal(signal.SIGINT) is _startup._stop
    _startup.end()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
  finally:
    signal.signal(signal.SIGINT, saved)


# ---- a stopped run's line, and the plot command on any workdir -----------------------------


def test_a_stopped_runs_line_lists_only_what_its_workdir_holds(tmp_path):
  stopped = fedco.runtime.Interrupted.of_run(
    "comfedl seeds 0,1,2", "after round 100 of 3000", 100, True
  )
  (tmp_path / "in_progress").mkdir()
  line = cli.interrupted_line(stopped, str(tmp_path))  # every run so far diverged: no rows
  assert line.startswith("interrupted comfedl seeds 0,1,2 after round 100 of 3000: no metrics ")
  assert "rounds 1-100" not in line and "no checkpoint" in line
  assert line.endswith("rerun the same command to resume (finished runs and checkpoints are kept)")
  rows = [{"round": r, "method": "fedavg", "seed": 0, "loss": 1.0} for r in (1, 2)]
  (tmp_path / "in_progress" / "metrics.jsonl").write_text(
    "".join(json.dumps(r) + "\n" for r in rows) + '{"round": 3, "meth'  # cut by a kill
  )
  (tmp_path / "checkpoints" / "fedavg-seed0-abc" / "10").mkdir(parents=True)
  line = cli.interrupted_line(stopped, str(tmp_path))
  assert ": in_progress/metrics.jsonl holds 2 rows up to round 2; checkpoints of 1 run " in line


def _rows(path, rounds=(1, 2), method="fedavg", **extra):
  path.parent.mkdir(parents=True, exist_ok=True)
  rows = [{"round": r, "method": method, "seed": 0, "loss": 1.0 / r, **extra} for r in rounds]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_plot_command_draws_or_says_in_one_line_there_is_nothing_to_draw(tmp_path):
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(plot.NothingToDraw, match=r"^nothing to draw in .*empty: it holds no "):
    plot.plot(str(empty))
  running = tmp_path / "running"  # started, no row yet (or every run so far diverged)
  (running / "in_progress").mkdir(parents=True)
  with pytest.raises(plot.NothingToDraw, match="in_progress/ has written no metrics rows yet"):
    plot.plot(str(running))
  diverged = tmp_path / "diverged"  # complete, every run diverged at round 1: no rows at all
  diverged.mkdir()
  per_seed = {"0": {"diverged": "diverged at round 1 (loss)", "diverged_round": 1}}
  (diverged / "summary.json").write_text(
    json.dumps({"methods": {"comfedl": {"per_seed": per_seed}}})
  )
  with pytest.raises(plot.NothingToDraw, match=r"every run diverged .*\(comfedl: summary.json\)"):
    plot.plot(str(diverged))
  _rows(diverged / "metrics.jsonl")  # rows of a run the summary says diverged: drawn as said
  assert plot.plot(str(diverged)) == str(diverged / "plot.png")
  stopped = tmp_path / "stopped"  # killed while writing its last row
  _rows(stopped / "in_progress" / "metrics.jsonl")
  with open(stopped / "in_progress" / "metrics.jsonl", "a") as f:
    f.write('{"round": 3, "meth')
  assert plot.plot(str(stopped)) == str(stopped / "plot.png")
  with pytest.raises(FileNotFoundError, match="is not a directory"):
    plot.plot(str(tmp_path / "elsewhere"))


def test_many_panels_are_drawn_in_rows_of_at_most_four():
  rows = [
    {"method": "a", "seed": 0, "round": r, **{f"m{i}": r + i for i in range(12)}} for r in (1, 2)
  ]
  panels = [(f"m{i}", f"m{i}") for i in range(12)]
  fig = outputs.curves(rows, ["a"], panels)
  places = {(round(ax.get_position().x0, 3), round(ax.get_position().y0, 3)) for ax in fig.axes}
  assert (
    len(fig.axes) == 12 and len({x for x, _ in places}) == 4 and len({y for _, y in places}) == 3
  )
  fig = outputs.curves(rows, ["a"], panels[:5])  # 2 rows of 3, the sixth cell left empty
  assert len(fig.axes) == 5 and len({round(ax.get_position().x0, 3) for ax in fig.axes}) == 3
  fig = outputs.curves(rows, ["a"], panels[:3])  # up to four: one row, as before
  assert len({round(ax.get_position().y0, 3) for ax in fig.axes}) == 1


# ---- the CLI's one-line errors -------------------------------------------------------------


def test_a_negative_seed_names_the_flag():
  for field in ("seeds", "select_seeds"):
    with pytest.raises(ValueError, match=rf"^--config.{field} must be integers >= 0, got"):
      runner.seeds(ml_collections.ConfigDict({field: (0, -1)}), field)


_DICT_CONFIG = """
def get_config():
  return {"experiment": "dro_fl", "seeds": (0,)}
"""
_MISSING_CONFIG = """
import ml_collections


def get_config():
  return ml_collections.ConfigDict(dict(
    experiment="needs_missing", seeds=(0,), rounds=1, local_steps=1, eval_every=1,
    batch_size=0, learning_rate=0.1, methods={}))
"""


def test_a_config_returning_a_dict_or_a_module_missing_a_package_is_one_line(tmp_path):
  (tmp_path / "dict_config.py").write_text(_DICT_CONFIG)
  (tmp_path / "missing_config.py").write_text(_MISSING_CONFIG)
  (tmp_path / "needs_missing.py").write_text("import fedco\nimport no_such_package_xyz\n")
  env = {**ENV, "PYTHONPATH": os.pathsep.join([str(helpers.ROOT), str(tmp_path)])}
  expected = {
    "dict_config.py": r"^error: --config='.*dict_config.py': get_config\(\) must return an "
    r"ml_collections.ConfigDict, got a dict; return ml_collections.ConfigDict\(\{...\}\)$",
    "missing_config.py": r"^error: --config.experiment='needs_missing' needs a package that is "
    r"not installed: No module named 'no_such_package_xyz' \(raised at .*needs_missing.py:2, "
    r"in <module>\); install it \(pip install no_such_package_xyz\), or run an experiment",
  }
  for name, pattern in expected.items():
    done = helpers.run(
      [sys.executable, "-m", "fedco.experiment.cli", f"--config={tmp_path / name}"]
      + [f"--workdir={tmp_path / 'run'}", "--noprogress"],
      cwd=tmp_path,
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
    assert __import__("re").match(pattern, lines[0]), lines[0]


def _raised(code, filename):
  """The error ``code`` raises, with a traceback whose innermost frame is in ``filename``."""
  try:
    exec(compile(code, filename, "exec"), {})
  except ImportError as err:
    return err
  raise AssertionError(f"{code!r} raised nothing")


def test_only_a_package_that_is_really_absent_is_said_to_be_not_installed(tmp_path, monkeypatch):
  """A module missing inside an installed package, or one that exists but fails to import,
  is not a package to pip install: fedco's own such error is a bug (its traceback), the
  experiment's is one line naming its file, line and the real message."""
  config = ml_collections.ConfigDict({"experiment": "mine"})
  inside = os.path.join(os.path.dirname(fedco.__file__), "runtime", "loop.py")
  for code in ("import numpy.no_such_module", "raise ImportError('libfoo.so: cannot open')"):
    assert cli.error_line(_raised(code, inside), config) is None  # fedco's: the traceback
  (tmp_path / "mine.py").write_text("import numpy\nfrom numpy import no_such_name\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  with pytest.raises(ImportError) as info:
    __import__("importlib").import_module("mine")
  line = cli.error_line(info.value, config)
  assert line is not None and "not installed" not in line and "pip install" not in line, line
  assert __import__("re").match(
    r"^--config.experiment='mine' failed to import: cannot import name 'no_such_name' from "
    r"'numpy' .*\(raised at .*mine.py:2, in <module>\)$",
    line,
  ), line
  absent = _raised("import no_such_package_xyz.sub", str(tmp_path / "mine.py"))
  assert "(pip install no_such_package_xyz)" in cli.error_line(absent, config)


def test_a_full_disk_is_one_line_naming_the_workdir(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  monkeypatch.setattr(cli.FLAGS["workdir"], "value", workdir)
  ours = OSError(errno.ENOSPC, "No space left on device", os.path.join(workdir, "metrics.jsonl"))
  line = cli.error_line(ours)
  assert line.startswith(f"--workdir={workdir!r}: no space left on its device (writing ")
  assert "metrics.jsonl); free space there or use a folder on another disk" in line
  orbax = ValueError(  # tensorstore's, from a checkpoint orbax writes
    'RESOURCE_EXHAUSTED: Error writing "x/.zarray": Failed writing: "'
    + os.path.join(workdir, "checkpoints", "a", "d", "f")
    + "\": Failed to write 388 bytes to file 8: No space left on device [os_error_code='28']"
  )
  assert cli.error_line(orbax).startswith(f"--workdir={workdir!r}: no space left on its device")
  wrapped = RuntimeError("saving failed")
  wrapped.__cause__ = ours
  assert cli.error_line(wrapped) == line
  assert cli.error_line(RuntimeError("a bug")) is None  # a bug keeps its traceback
  # orbax's background writers' records of the same failure are dropped, others kept
  echo = cli._NoSpaceEcho()
  record = lambda msg: logging.LogRecord("absl", logging.ERROR, "f.py", 1, msg, None, None)
  assert not echo.filter(record("_SignalingThread.run() raised: ... No space left on device"))
  assert echo.filter(record("something else went wrong"))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tiny tmpfs needs root")
def test_the_driver_on_a_full_disk_prints_one_line(tmp_path):
  disk = tmp_path / "disk"
  disk.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(disk)]).returncode:
    pytest.skip("no tmpfs mount here")
  try:
    done = helpers.run(
      [sys.executable, "-m", "experiments.main", "--config=experiments/configs/dro_fl.py"]
      + ["--config.rounds=20", "--config.seeds=0,", "--methods=fedavg", "--noprogress"]
      + [f"--workdir={disk / 'run'}", "--checkpoint_every=10"],
      cwd=helpers.ROOT,
      env=ENV,
      capture_output=True,
      text=True,
      timeout=300,
    )
  finally:
    subprocess.run(["umount", str(disk)])
  lines = [l for l in done.stderr.splitlines() if l.strip() and not l.startswith("warning: ")]
  assert done.returncode == 1 and len(lines) == 1, done.stderr[-3000:]
  assert lines[0].startswith(f"error: --workdir={str(disk / 'run')!r}: no space left on its ")


# ---- first impressions ---------------------------------------------------------------------


def test_simulate_shows_a_bar_only_for_a_long_run_on_a_terminal(monkeypatch, capsys):
  problem, algorithm = fedco.problems.portfolio(1.0), fedco.feddro(0.1, 1)
  data = fedco.FederatedData.from_clients([{"r": np.ones((4, 3), np.float32)}] * 2)
  run = lambda: fedco.simulate(
    problem, algorithm, data, jnp.zeros(3), rounds=4, chunk_rounds=2, batch_size=None
  )
  monkeypatch.setattr(host, "AUTO_AFTER_S", 0.0)  # every run counts as long from here
  run()  # a test's stderr (captured) is no terminal: no bar
  assert "rounds" not in capsys.readouterr().err
  monkeypatch.setattr(host, "on_terminal", lambda: True)
  monkeypatch.setattr(host, "AUTO_AFTER_S", 1e9)
  run()  # a terminal, a short run: no bar
  assert "rounds" not in capsys.readouterr().err
  monkeypatch.setattr(host, "AUTO_AFTER_S", 0.0)  # a terminal, a run taking long enough
  run()
  assert "4/4 rounds" in capsys.readouterr().err
  run_quiet = fedco.simulate(
    problem, algorithm, data, jnp.zeros(3), rounds=4, progress=False, batch_size=None
  )
  assert run_quiet.metrics["objective"].shape == (4,) and capsys.readouterr().err == ""


def test_e1s_report_says_why_printed_comfedl_diverges():
  from experiments import dro_fl

  settings = {
    "comfedl": {"algorithm": "comfedl", "gamma": 0.2},
    "comfedl_normalized": {"algorithm": "comfedl", "normalized": True, "gamma": 0.2},
  }
  methods = {"comfedl": {"diverged_seeds": [0, 1]}, "comfedl_normalized": {"diverged_seeds": [1]}}
  summary = {"against_fedavg": {}, "settings": settings, "methods": methods}
  assert dro_fl.report(summary) == [
    "comfedl: expected to diverge: its printed step is exp(f_k/gamma)/gamma ~ 5e+05 x grad f_k "
    "at the start; compare comfedl_normalized (docs/guides/reproduce.md)"
  ]
  methods["comfedl"]["diverged_seeds"] = []
  assert dro_fl.report(summary) == []
