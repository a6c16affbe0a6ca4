"""The host loop: metrics stream to disk after every chunk, survive SIGKILL, are rewound on
resume, and Ctrl-C stops a run cleanly between chunks with a one-line message."""

import csv
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
from tests import helpers, stream_run

SCRIPT = helpers.ROOT / "tests" / "stream_run.py"
ENV = {**os.environ, "PYTHONPATH": str(helpers.ROOT), "JAX_PLATFORMS": "cpu"}


def _start(*args):
  return subprocess.Popen(
    [sys.executable, str(SCRIPT), *map(str, args)],
    env=ENV,
    cwd=helpers.ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
  )


def _lines(path):
  return path.read_text().splitlines() if path.exists() else []


def _wait_for_rows(proc, path, rows, timeout=240):
  deadline = helpers.deadline(timeout)
  while proc.poll() is None and len(_lines(path)) < rows:
    if deadline.expired():
      proc.kill()
      proc.wait()
      helpers.timed_out(f"waiting for {rows} rows of tests/stream_run.py", deadline)
    time.sleep(0.02)
  assert proc.poll() is None, "the run ended before it could be stopped"


def _rounds(path):
  return [json.loads(line)["round"] for line in _lines(path)]


def test_sigkill_keeps_every_row_of_the_finished_chunks(tmp_path):
  victim = _start(tmp_path)
  _wait_for_rows(victim, tmp_path / "metrics.jsonl", 10)
  victim.send_signal(signal.SIGKILL)
  assert victim.wait() == -signal.SIGKILL
  rounds = _rounds(tmp_path / "metrics.jsonl")  # every line is whole JSON
  assert len(rounds) >= 10 and len(rounds) % stream_run.CHUNK == 0
  assert rounds == list(range(1, len(rounds) + 1))
  with open(tmp_path / "metrics.csv", newline="") as f:
    table = list(csv.DictReader(f))
  assert [int(r["round"]) for r in table] == rounds[: len(table)]
  assert len(table) >= len(rounds) - stream_run.CHUNK  # the CSV is one chunk behind at most
  assert all(r["algorithm"] == "feddro" and r["seed"] == "5" for r in table)


def test_ctrl_c_stops_between_chunks_with_one_line(tmp_path):
  proc = _start(tmp_path, tmp_path / "ckpt")
  _wait_for_rows(proc, tmp_path / "metrics.jsonl", 10)
  proc.send_signal(signal.SIGINT)
  assert helpers.wait(proc, 120) == 130
  err = proc.stderr.read().decode()
  assert "Traceback" not in err and "Segmentation" not in err, err[-2000:]
  message = err.strip().splitlines()[-1]
  assert message.startswith("interrupted feddro seed 5 after round "), message
  assert "checkpoint" in message, message
  done = int(message.split()[6])
  assert _rounds(tmp_path / "metrics.jsonl") == list(range(1, done + 1))
  assert done in {int(d) for d in os.listdir(tmp_path / "ckpt") if d.isdigit()}


def test_a_resumed_run_rewinds_the_streams_to_its_checkpoint(tmp_path):
  victim = _start(tmp_path, tmp_path / "ckpt")
  _wait_for_rows(victim, tmp_path / "metrics.jsonl", 30)
  victim.send_signal(signal.SIGKILL)
  victim.wait()
  saved = max(int(d) for d in os.listdir(tmp_path / "ckpt") if d.isdigit())
  written = _rounds(tmp_path / "metrics.jsonl")
  # rows past the checkpoint, as a kill between checkpoints leaves them (whatever the race)
  with open(tmp_path / "metrics.jsonl", "a") as f:
    f.write(
      json.dumps({"round": written[-1] + 1, "algorithm": "feddro", "seed": 5, "objective": 123.0})
      + "\n"
    )
  rounds = written[-1] + 6
  result = stream_run.main(str(tmp_path), str(tmp_path / "ckpt"), rounds=rounds)
  assert saved < written[-1] + 1
  assert _rounds(tmp_path / "metrics.jsonl") == list(range(1, rounds + 1))
  rows = [json.loads(line) for line in _lines(tmp_path / "metrics.jsonl")]
  np.testing.assert_allclose(
    [r["objective"] for r in rows[-6:]], result.metrics["objective"][-6:], rtol=1e-6
  )
  with open(tmp_path / "metrics.csv", newline="") as f:
    assert [int(r["round"]) for r in csv.DictReader(f)] == list(range(1, rounds + 1))


def test_rows_hold_evaluated_rounds_with_their_labels():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])

  class Keep(host.RowWriter):
    def __init__(self):
      self.chunks = []

    def write(self, rows):
      self.chunks.append(rows)

  keep = Keep()
  fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=7,
    chunk_rounds=3,
    eval_every=2,
    batch_size=4,
    metric_writers=[keep],
  )
  assert [[r["round"] for r in c] for c in keep.chunks] == [[1, 2], [4, 6], [7]]  # the last
  assert all(
    r["algorithm"] == "feddro" and len(r["client_losses"]) == 3 for c in keep.chunks for r in c
  )


def test_tensorboard_writer_and_a_missing_package(tmp_path, monkeypatch):
  pytest.importorskip("tensorboardX")
  writer = host.TensorBoardWriter(tmp_path / "tb")
  writer.write([{"round": 1, "algorithm": "feddro", "objective": 0.5}])
  writer.close()
  assert any(p.name.startswith("events") for p in (tmp_path / "tb").iterdir())
  monkeypatch.setitem(sys.modules, "tensorboardX", None)
  with pytest.raises(ValueError, match="tensorboardX"):
    host.TensorBoardWriter(tmp_path / "tb2")


def test_periodic_action_sees_the_whole_state_at_its_rounds():
  """An action reads Ditto's personal models (client state that ``metrics_fn`` never sees)
  at rounds 3, 6 and the last; chunks end there, so each row equals a run stopped at that
  round."""
  clients = [{"r": c} for c in helpers.portfolio_clients(sizes=(6, 9, 7), seed=2)]
  data = fedco.FederatedData.from_clients(clients)
  problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2))
  spread = lambda state, round_: {
    "personal_spread": float(np.std(np.asarray(state.clients.personal), axis=0).sum()),
    "round_in_state": int(state.round),
  }
  action = host.RoundAction(spread, every_rounds=3)
  run = lambda rounds, actions=(): fedco.simulate(
    problem,
    fedco.ditto(0.1, 2, lam=0.1),
    data,
    jnp.zeros(3),
    rounds=rounds,
    seed=1,
    batch_size=2,
    chunk_rounds=5,
    actions=actions,
    metric_labels={"run": "a"},
  )
  result = run(7, [action])
  assert [r["round"] for r in result.host_metrics] == [3, 6, 7]
  assert all(r["round_in_state"] == r["round"] and r["run"] == "a" for r in result.host_metrics)
  for row in result.host_metrics:
    alone = run(row["round"])
    assert row["personal_spread"] == spread(alone.state, row["round"])["personal_spread"]
  with pytest.raises(ValueError, match="every_rounds"):
    host.RoundAction(spread, every_rounds=0)
  with pytest.raises(ValueError, match="RoundAction"):
    run(2, [spread])


def test_action_rows_start_at_round_zero_are_checkpointed_and_checked(tmp_path):
  """``at_start`` evaluates the initial state; a resumed run returns every row since round
  0 (restored with its checkpoint) and equals an uninterrupted run; a non-finite row stops
  the run with NonFiniteError carrying the rows so far."""
  data = fedco.FederatedData.from_clients(
    [{"r": c} for c in helpers.portfolio_clients(sizes=(6, 9, 7), seed=2)]
  )
  problem = fedco.plain(lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2))
  norm = lambda state, round_: {"norm": float(np.linalg.norm(state.server["params"]))}
  run = lambda rounds, fn=norm, **kw: fedco.simulate(
    problem,
    fedco.fedavg(0.1, 2),
    data,
    jnp.ones(3),
    rounds=rounds,
    seed=1,
    batch_size=2,
    actions=[host.RoundAction(fn, 2, at_start=True)],
    **kw,
  )
  whole = run(6).host_metrics
  assert [r["round"] for r in whole] == [0, 2, 4, 6]
  assert whole[0]["norm"] == pytest.approx(np.sqrt(3.0))
  run(4, checkpoint_dir=tmp_path / "ck")
  resumed = run(6, checkpoint_dir=tmp_path / "ck").host_metrics
  assert resumed == whole
  blows_up = lambda state, round_: {"norm": float("nan") if round_ == 4 else 1.0}
  with pytest.raises(fedco.runtime.NonFiniteError, match="round 4: the host metric norm") as err:
    run(6, blows_up)
  assert [r["round"] for r in err.value.host_metrics] == [0, 2, 4] and err.value.round == 4
  assert err.value.metrics["clients"].shape[0] == 4  # every round run up to the bad row
