"""A Ctrl-C is never lost: ``simulate`` and ``sweep`` raise ``Interrupted`` after writing what
is complete, whether the stop came in the middle of a run, in its last chunk, in a chunk that
diverges, or between two runs under one guard; the driver says so in one line and exits 130;
a second Ctrl-C ends the process without a crash.

In-process, a metric writer sends SIGINT to its own process when it receives a chosen round:
the handler runs at once (Python checks signals between bytecodes), exactly as a Ctrl-C
that arrived while that chunk ran, so every landing point is deterministic.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.problems import portfolio
from fedco.runtime import host
from tests import helpers

ENV = {**os.environ, "PYTHONPATH": str(helpers.ROOT), "JAX_PLATFORMS": "cpu"}
DATA = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])


class CtrlCAt(host.RowWriter):
  """Keeps the rows it receives; sends SIGINT to this process on receiving ``round_``."""

  def __init__(self, round_):
    self.round, self.rows = round_, []

  def write(self, rows):
    self.rows.extend(rows)
    if any(row["round"] == self.round for row in rows):
      os.kill(os.getpid(), signal.SIGINT)


def _simulate(writer, rounds=9, learning_rate=0.01, chunk_rounds=3, **kwargs):
  return fedco.simulate(
    portfolio(1.0),
    fedco.feddro(learning_rate, 2, beta=0.5),
    DATA,
    jnp.zeros(3),
    rounds=rounds,
    seed=0,
    batch_size=4,
    chunk_rounds=chunk_rounds,
    metric_writers=[writer],
    **kwargs,
  )


def test_a_ctrl_c_mid_run_stops_after_the_chunk_with_its_rows_and_checkpoint(tmp_path):
  writer = CtrlCAt(4)
  with pytest.raises(host.Interrupted, match="after round 6 of 9") as err:
    _simulate(writer, checkpoint_dir=tmp_path)
  assert err.value.round == 6 and err.value.result is None
  assert [r["round"] for r in writer.rows] == list(range(1, 7))
  assert "6" in os.listdir(tmp_path)


def test_a_ctrl_c_in_the_last_chunk_is_not_dropped(tmp_path):
  """The run is complete; it still stops, with the finished result on the exception."""
  writer = CtrlCAt(8)
  with pytest.raises(host.Interrupted, match=r"at its end \(round 9 of 9, complete\)") as err:
    _simulate(writer, checkpoint_dir=tmp_path)
  assert err.value.round == 9
  assert [r["round"] for r in writer.rows] == list(range(1, 10))
  assert int(err.value.result.state.round) == 9
  np.testing.assert_allclose(
    err.value.result.metrics["objective"][-1], writer.rows[-1]["objective"], rtol=1e-6
  )
  assert "9" in os.listdir(tmp_path)


def test_a_ctrl_c_in_a_diverging_chunk_stops_instead_of_reporting_divergence():
  writer = CtrlCAt(1)  # the first chunk diverges at round 2
  with pytest.raises(
    host.Interrupted, match=r"in rounds 1-3 of 30, which diverged \(round 2"
  ) as err:
    _simulate(writer, rounds=30, learning_rate=1e6)
  assert isinstance(err.value.__cause__, fedco.runtime.NonFiniteError)
  assert writer.rows and all(host.finite_row(r) for r in writer.rows)


def test_a_ctrl_c_between_two_runs_stops_the_second_before_it_starts():
  before = signal.getsignal(signal.SIGINT)  # Python's default, or a test runner's own
  first, second = CtrlCAt(None), CtrlCAt(None)
  with pytest.raises(host.Interrupted, match="before round 1 of 9"):
    with fedco.runtime.interrupt_guard():
      _simulate(first)
      os.kill(os.getpid(), signal.SIGINT)  # while the host is between the runs
      _simulate(second)
  assert len(first.rows) == 9 and second.rows == []
  # the guard is gone: the handler from before it is back
  assert signal.getsignal(signal.SIGINT) is before


def test_a_ctrl_c_inside_a_guard_that_runs_nothing_more_is_raised_at_its_end():
  with pytest.raises(host.Interrupted, match="the block ended after Ctrl-C"):
    with fedco.runtime.interrupt_guard():
      os.kill(os.getpid(), signal.SIGINT)


def test_a_sweep_stops_before_it_starts_after_a_chunk_and_in_its_last_chunk(monkeypatch):
  def sweep(ctrl_c_at):
    def update(self, done, *args, **kwargs):  # runs on the host after every chunk
      del self, args, kwargs
      if done == ctrl_c_at:
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(host.ProgressBar, "update", update)
    return fedco.sweep(
      portfolio(1.0),
      fedco.feddro,
      DATA,
      jnp.zeros(3),
      rounds=4,
      grid={"learning_rate": [0.01, 0.02]},
      algorithm_kwargs={"local_steps": 2, "beta": 0.5},
      batch_size=4,
      chunk_rounds=2,
    )

  with pytest.raises(host.Interrupted, match="after round 2 of 4") as err:
    sweep(2)
  assert err.value.round == 2 and err.value.result is None
  with pytest.raises(host.Interrupted, match=r"at its end \(round 4 of 4, complete\)") as err:
    sweep(4)
  assert err.value.result.metrics["objective"].shape == (2, 4)
  with pytest.raises(host.Interrupted, match="before round 1"):
    with fedco.runtime.interrupt_guard():
      os.kill(os.getpid(), signal.SIGINT)
      sweep(None)


def _driver(workdir, *flags, methods="fedavg,comfedl"):
  return subprocess.Popen(
    [
      sys.executable,
      "-m",
      "experiments.main",
      "--config=experiments/configs/dro_fl.py",
      f"--workdir={workdir}",
      "--config.rounds=3000",
      "--config.seeds=0,",
      f"--methods={methods}",  # they run in label order: comfedl (diverging at round 1) first
      "--noprogress",
      "--checkpoint_every=10",
      *flags,
    ],
    cwd=helpers.ROOT,
    env=ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _wait_for(path, proc, timeout=240):
  deadline = helpers.deadline(timeout)
  while proc.poll() is None and not path.exists():
    if deadline.expired():
      proc.kill()
      proc.communicate()
      helpers.timed_out(f"waiting for {path.name} of `{' '.join(proc.args[1:4])}`", deadline)
    time.sleep(0.02)
  assert proc.poll() is None, proc.communicate()


def test_the_driver_stops_on_one_ctrl_c_with_one_line_and_exit_130(tmp_path):
  proc = _driver(tmp_path, methods="fedavg,qfedavg")  # fedavg runs first
  metrics = tmp_path / "in_progress" / "metrics.jsonl"
  _wait_for(metrics, proc)
  proc.send_signal(signal.SIGINT)
  out, err = helpers.communicate(proc, 240)
  assert proc.returncode == 130, err[-3000:]
  lines = [l for l in err.strip().splitlines() if not l.startswith("warning: ")]  # config's
  assert len(lines) == 1, err[-3000:]
  assert lines[0].startswith("interrupted fedavg seed 0 after round "), lines
  assert lines[0].endswith(
    "rerun the same command to resume (finished runs and checkpoints are kept)"
  )
  done = int(lines[0].split()[6])
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  assert rows and rows[-1]["round"] == done and rows[-1]["method"] == "fedavg"
  assert not any(row["method"] == "qfedavg" for row in rows)  # the next run never started
  assert "released by pid" in (tmp_path / ".lock").read_text()
  assert "summary.json" not in os.listdir(tmp_path) and out == ""


_WAITING_EXPERIMENT = """
import atexit, pathlib, time

TABLE_KEYS, PROGRESS = (), "objective"


def _wait(marker):  # in Python, where a Ctrl-C's handler runs at once
  pathlib.Path(marker).touch()
  time.sleep(120)


def setup(config):
  if config.at_exit:  # stopped by a Ctrl-C now, it waits while the process exits
    atexit.register(_wait, config.marker)
    raise KeyboardInterrupt
  _wait(config.marker)


def build(config, method, seed, setup):
  raise AssertionError("not reached")
"""

_WAITING_CONFIG = """
import ml_collections


def get_config():
  return ml_collections.ConfigDict(dict(
    experiment="waiting_experiment", marker={marker!r}, at_exit={at_exit}, seeds=(0,), rounds=1,
    local_steps=1, eval_every=1, batch_size=0, learning_rate=0.1, methods={{}},
  ))
"""


def _waiting_driver(tmp_path, at_exit):
  """The driver on an own experiment that waits in Python (in its set-up, or as it exits)."""
  (tmp_path / "waiting_experiment.py").write_text(_WAITING_EXPERIMENT)
  marker = tmp_path / "waiting"
  config = tmp_path / "waiting_config.py"
  config.write_text(_WAITING_CONFIG.format(marker=str(marker), at_exit=at_exit))
  proc = subprocess.Popen(
    [sys.executable, "-m", "experiments.main", f"--config={config}", "--noprogress"]
    + [f"--workdir={tmp_path / 'run'}"],
    cwd=helpers.ROOT,
    env={**ENV, "PYTHONPATH": os.pathsep.join([str(helpers.ROOT), str(tmp_path)])},
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  _wait_for(marker, proc)
  return proc


def test_a_second_ctrl_c_ends_the_process_at_once(tmp_path):
  """Two Ctrl-Cs while an experiment sets up (its own module, waiting in Python): the first
  asks the run to stop at its next safe point, the second ends the process by SIGINT at once
  (exit status 130 in a shell), with one line saying so."""
  proc = _waiting_driver(tmp_path, at_exit=False)
  started = time.time()
  proc.send_signal(signal.SIGINT)
  time.sleep(0.5)
  assert proc.poll() is None  # the first Ctrl-C only asked for a stop
  proc.send_signal(signal.SIGINT)
  _, err = helpers.communicate(proc, 60)
  assert proc.returncode == -signal.SIGINT, err[-3000:]
  assert err.strip().splitlines()[-1] == "second Ctrl-C: stopping now", err[-3000:]
  # not the experiment's 120 s wait (30 s on a quiet machine, more under load)
  assert time.time() - started < min(helpers.limit_s(30), 100)
  assert "Traceback" not in err and "interrupted" not in err


def test_a_ctrl_c_while_the_driver_exits_after_a_stop_ends_it_without_a_traceback(tmp_path):
  """A Ctrl-C that lands after the run has stopped (its guard gone, the driver printing its
  line or exiting: here, waiting in an exit handler) ends the process by SIGINT at once; with
  Python's own handler back it raised ``KeyboardInterrupt`` there, with a traceback."""
  proc = _waiting_driver(tmp_path, at_exit=True)
  proc.send_signal(signal.SIGINT)
  _, err = helpers.communicate(proc, 60)
  assert proc.returncode == -signal.SIGINT, err[-3000:]
  assert err.strip().splitlines()[-1].startswith("interrupted; rerun the same command"), err
  assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]


def test_ctrl_cs_while_the_driver_loads_and_compiles_never_crash(tmp_path):
  """Two Ctrl-Cs while the real driver loads and compiles, without the compilation cache (so
  the programs compile then): the second can land inside XLA's compiler, where raising
  ``KeyboardInterrupt`` once crashed the process with a segmentation fault. Whichever moment
  each lands at, the process ends by the second (exit by SIGINT, its line), or by the first
  (its one line, exit 130; by SIGINT where the second came while it exited), never with a
  crash or a traceback."""
  for attempt, gap in enumerate((0.25, 0.1, 0.04)):
    proc = _driver(tmp_path / str(attempt), "--compilation_cache=")
    _wait_for(tmp_path / str(attempt) / "in_progress", proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(gap)
    proc.send_signal(signal.SIGINT)
    _, err = helpers.communicate(proc, 120)
    for crash in ("Segmentation", "Fatal Python error", "Traceback", "Aborted"):
      assert crash not in err, err[-3000:]
    if "interrupted " in err:  # the first Ctrl-C stopped it at a safe point
      assert proc.returncode in (130, -signal.SIGINT), err[-3000:]
      assert "rerun the same command to resume" in err
    else:
      assert proc.returncode == -signal.SIGINT, err[-3000:]
      assert "second Ctrl-C: stopping now" in err, err[-3000:]


# ---- the last round is always evaluated ----------------------------------------------------


def _evaluated(rounds, eval_every, chunk_rounds=2):
  return _simulate(CtrlCAt(None), rounds=rounds, eval_every=eval_every, chunk_rounds=chunk_rounds)


@pytest.mark.parametrize("rounds,eval_every,expected", [(5, 3, [1, 3, 5]), (2, 3, [1, 2])])
def test_simulate_evaluates_round_one_every_eval_every_and_the_last(rounds, eval_every, expected):
  every_round = _evaluated(rounds, 1)
  result = _evaluated(rounds, eval_every)
  evaluated = np.flatnonzero(result.metrics["evaluated"]) + 1
  assert evaluated.tolist() == expected
  np.testing.assert_allclose(
    result.metrics["objective"][evaluated - 1],
    every_round.metrics["objective"][evaluated - 1],
    rtol=1e-6,
  )


def test_sweep_and_simulator_run_evaluate_the_last_round():
  result = fedco.sweep(
    portfolio(1.0),
    fedco.feddro,
    DATA,
    jnp.zeros(3),
    rounds=5,
    grid={"learning_rate": [0.01, 0.02]},
    algorithm_kwargs={"local_steps": 2, "beta": 0.5},
    batch_size=4,
    chunk_rounds=2,
    eval_every=3,
  )
  assert np.all(np.isfinite(result.metrics["objective"][:, [0, 2, 4]]))
  assert (np.flatnonzero(result.metrics["evaluated"][0]) + 1).tolist() == [1, 3, 5]
  sim = fedco.Simulator(
    portfolio(1.0), fedco.feddro(0.01, 2, beta=0.5), DATA, batch_size=4, eval_every=10
  )
  state, metrics = sim.run(sim.init(jnp.zeros(3)), 4)  # by default, the call's last round
  assert (np.flatnonzero(metrics["evaluated"]) + 1).tolist() == [1, 4]
  _, metrics = sim.run(state, 3, final_round=20)  # a chunk of a longer run
  assert not np.any(metrics["evaluated"])
