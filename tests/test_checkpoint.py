"""Checkpoint and resume: a SIGKILL-ed run resumed from its checkpoints ends bit-identical."""

import os
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco import checkpoint
from fedco.problems import portfolio
from tests import helpers, resume_run

SCRIPT = str(helpers.ROOT / "tests" / "resume_run.py")
ENV = {**os.environ, "PYTHONPATH": str(helpers.ROOT), "JAX_PLATFORMS": "cpu"}


def _run(args, **kwargs):
  return subprocess.Popen(
    [sys.executable, SCRIPT, *args],
    env=ENV,
    cwd=helpers.ROOT,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    **kwargs,
  )


@pytest.mark.parametrize("name", ["comfedl", "local_scgdm", "feddro", "streamed"])
def test_sigkill_and_resume_is_bit_identical(tmp_path, name):
  ckpt_dir = tmp_path / "ckpt"
  victim = _run([name, str(ckpt_dir), str(tmp_path / "never.npz")])
  deadline = helpers.deadline(240)
  while True:  # kill it once two checkpoints are on disk
    done = [d for d in (os.listdir(ckpt_dir) if ckpt_dir.exists() else []) if d.isdigit()]
    if len(done) >= 2 or victim.poll() is not None:
      break
    if deadline.expired():
      victim.kill()
      victim.wait()
      helpers.timed_out("waiting for two checkpoints of tests/resume_run.py", deadline)
    time.sleep(0.02)
  victim.send_signal(signal.SIGKILL)
  assert victim.wait() == -signal.SIGKILL, "the run finished before it could be killed"
  assert not (tmp_path / "never.npz").exists()
  kept = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  assert kept and max(kept) < 1500
  resumed = _run([name, str(ckpt_dir), str(tmp_path / "resumed.npz")])
  resume_run.main(name, "-", str(tmp_path / "reference.npz"), checkpoint=False)  # in process
  assert helpers.wait(resumed, 300) == 0, resumed.stderr.read().decode()[-2000:]
  # it resumed (an identical rerun from scratch would also match the reference)
  assert f"resumed from round {max(kept)}" in resumed.stderr.read().decode()
  a, b = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
  for key in ("params", "objective", "clients"):
    np.testing.assert_array_equal(a[key], b[key], err_msg=key)
  assert len([d for d in os.listdir(ckpt_dir) if d.isdigit()]) <= 3  # keeps the last few


def test_nan_at_a_known_round_leaves_a_loadable_checkpoint(tmp_path):
  """x = 1, 28.2, 1.7e13 under steps on -exp(x): round 2's objective is -inf."""
  data = fedco.FederatedData.from_clients([{"v": np.array([[1.0]], np.float32)}])
  problem = fedco.local_inner(lambda x, e: x * e["v"][0], lambda y: -jnp.exp(y))
  with pytest.raises(fedco.runtime.NonFiniteError, match="round 2: objective") as err:
    fedco.simulate(
      problem,
      fedco.comfedl(10.0, 1),
      data,
      jnp.ones(()),
      rounds=5,
      batch_size=None,
      chunk_rounds=1,
      checkpoint_dir=str(tmp_path / "ck"),
    )
  assert err.value.round == 2
  sim = fedco.Simulator(problem, fedco.comfedl(10.0, 1), data, batch_size=None)
  round_, state, metrics = checkpoint.Checkpointer(tmp_path / "ck").restore(
    sim.init(jnp.ones(()), 0)
  )
  assert round_ == 1 and int(state.round) == 1
  assert np.isfinite(float(state.server["params"])) and metrics["objective"].shape == (1,)


def test_resume_refuses_a_checkpoint_past_the_requested_rounds(tmp_path):
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  run = lambda rounds: fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=rounds,
    batch_size=4,
    checkpoint_dir=str(tmp_path),
  )
  run(4)
  with pytest.raises(ValueError, match="past rounds"):
    run(2)
  # the refused run let its lock go: another process takes it at once
  take = f"from fedco.io import DirectoryLock; DirectoryLock({str(tmp_path)!r}).acquire().release()"
  taken = helpers.run(
    [sys.executable, "-c", take],
    env=ENV,
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert taken.returncode == 0, taken.stderr[-2000:]
  resumed = run(4)  # nothing left to do: the stored run comes back whole
  assert resumed.metrics["objective"].shape == (4,)


def test_restore_names_a_checkpoint_of_another_model(tmp_path):
  """A checkpoint whose parameters do not fit the template (e.g. written before a model
  changed its parameter layout) gives a ValueError naming the directory and round."""
  ckpt = checkpoint.Checkpointer(tmp_path)
  ckpt.save(1, {"params": {"Dense_0": {"kernel": jnp.zeros((4, 3))}}}, {"objective": np.zeros(1)})
  for template in (
    {"params": {"kernel": jnp.zeros((3, 4)), "bias": jnp.zeros(3)}},
    {"params": {"Dense_0": {"kernel": jnp.zeros((3, 4))}}},
  ):
    with pytest.raises(ValueError, match=r"round 1 in .* does not fit"):
      ckpt.restore(template)
  ckpt.close()


def test_a_failed_save_raises_only_once_its_other_writers_stopped(tmp_path, monkeypatch):
  """orbax writes each item of a checkpoint in threads of its own and raises on the first
  that fails; one still writing when the interpreter exits logs a traceback after the run's
  one-line error ("cannot schedule new futures after interpreter shutdown", seen on a full
  disk). Here the history's metadata write fails at once (it is waited on first) and the
  state's is slow: ``save`` must raise only after the state's writer stopped."""
  import asyncio
  import errno
  import threading

  from orbax.checkpoint._src.handlers import base_pytree_checkpoint_handler as pytree

  write = pytree.BasePyTreeCheckpointHandler._write_metadata_file

  async def history_fails_state_is_slow(self, directory, *args, **kwargs):
    if "history" in os.fspath(directory):
      raise OSError(errno.ENOSPC, "No space left on device", os.fspath(directory))
    await asyncio.sleep(1.0)
    return await write(self, directory, *args, **kwargs)

  handler = pytree.BasePyTreeCheckpointHandler
  monkeypatch.setattr(handler, "_write_metadata_file", history_fails_state_is_slow)
  before = set(threading.enumerate())
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  with pytest.raises(OSError, match="No space left"):
    ckpt.save(1, {"w": np.ones(3, np.float32)}, {"loss": np.zeros(3, np.float32)})
  started = set(threading.enumerate()) - before
  running = [t.name for t in started if type(t).__module__.startswith("orbax") and t.is_alive()]
  assert not running, f"orbax threads still writing after save raised: {running}"
