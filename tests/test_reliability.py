"""Runs that cannot mix or silently corrupt: run fingerprints on checkpoints, checksummed
checkpoints with fallback to the newest intact one, and a lock per checkpoint directory."""

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fedco
from fedco import checkpoint
from fedco.io import DirectoryLock
from fedco.problems import portfolio
from tests import helpers


def _data(seed=0):
  return fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients(seed=seed)])


def _run(directory, rounds=4, *, seed=0, lr=0.1, local_steps=2, data=None, lam=1.0, x0=0.0, **kw):
  return fedco.simulate(
    portfolio(lam),
    fedco.feddro(lr, local_steps, beta=0.5),
    _data() if data is None else data,
    jnp.full(3, x0),
    rounds=rounds,
    seed=seed,
    batch_size=4,
    chunk_rounds=1,
    checkpoint_dir=directory,
    **kw,
  )


@pytest.fixture(scope="module")
def straight():
  return _run(None, 4)


@pytest.mark.parametrize(
  "change,named",
  [
    (dict(seed=1), "seed"),
    (dict(lr=0.2), "learning_rate"),
    (dict(local_steps=3), "local_steps"),
    (dict(data=_data(seed=5)), "data.digest"),
    (dict(clients_per_round=2), "clients_per_round"),
  ],
)
def test_a_checkpoint_of_another_run_is_refused_naming_the_difference(tmp_path, change, named):
  _run(tmp_path, 2)
  with pytest.raises(checkpoint.RunMismatchError, match=named) as err:
    _run(tmp_path, 4, **change)
  assert "\n" not in str(err.value) and str(tmp_path) in str(err.value)


@pytest.mark.parametrize("x0", [0.0, 0.1])
def test_a_checkpoint_of_another_objective_is_refused(tmp_path, x0):
  """The problem's probe tells two risk aversions apart, also from the all-zero model,
  where the portfolio objective is 0 for every one (the probe also evaluates a nearby
  model)."""
  _run(tmp_path, 2, x0=x0)
  with pytest.raises(checkpoint.RunMismatchError, match="problem.probe"):
    _run(tmp_path, 4, x0=x0, lam=2.0)


def _chained(directory, clip, lr, rounds):
  algorithm = fedco.chain(optax.clip(clip), fedco.fedavg(lr, 2))
  data = _data()
  return fedco.simulate(
    fedco.plain(lambda x, e: jnp.sum((x - e["r"]) ** 2)), algorithm, data, jnp.zeros(3),
    rounds=rounds, batch_size=4, chunk_rounds=1, checkpoint_dir=directory,
  )  # fmt: skip


def test_chained_transforms_of_other_constants_are_other_runs(tmp_path):
  # fedco.chain drops the factory's recorded arguments: the closures' constants tell them apart
  _chained(tmp_path, 1.0, 0.1, 2)
  for clip, lr in ((5.0, 0.1), (1.0, 0.3)):
    with pytest.raises(checkpoint.RunMismatchError, match="algorithm.functions"):
      _chained(tmp_path, clip, lr, 4)
  _chained(tmp_path, 1.0, 0.1, 4)  # the same run resumes


def test_restart_starts_afresh_and_a_resume_says_so(tmp_path, straight, capsys):
  _run(tmp_path, 2, seed=1)
  fresh = _run(tmp_path, 4, checkpoint_mismatch="restart")
  np.testing.assert_array_equal(fresh.metrics["objective"], straight.metrics["objective"])
  assert "resumed" not in capsys.readouterr().err
  _run(tmp_path / "b", 2)
  resumed = _run(tmp_path / "b", 4)
  assert "resumed from round 2" in capsys.readouterr().err
  np.testing.assert_array_equal(resumed.params, straight.params)
  with pytest.raises(ValueError, match="checkpoint_mismatch"):
    _run(tmp_path / "c", 1, checkpoint_mismatch="ignore")


def _array_files(round_dir):
  """The state's array data files (orbax OCDBT ``d/`` chunks), largest first."""
  files = [
    p for p in pathlib.Path(round_dir, "state").rglob("*") if p.is_file() and p.parent.name == "d"
  ]
  assert files, list(pathlib.Path(round_dir).rglob("*"))
  return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def test_flipped_bytes_fall_back_to_the_newest_intact_checkpoint(tmp_path, straight):
  _run(tmp_path, 3)
  for target in _array_files(tmp_path / "3"):  # 64 bytes in the middle of each data file
    raw = bytearray(target.read_bytes())
    middle = max(len(raw) // 2 - 32, 0)
    raw[middle : middle + 64] = bytes(b ^ 0xFF for b in raw[middle : middle + 64])
    target.write_bytes(bytes(raw))
  with pytest.warns(UserWarning, match="round 3 .* damaged"):
    resumed = _run(tmp_path, 4)
  np.testing.assert_array_equal(resumed.params, straight.params)
  np.testing.assert_array_equal(resumed.metrics["objective"], straight.metrics["objective"])


def test_truncated_and_all_damaged_checkpoints(tmp_path, straight):
  _run(tmp_path, 2)
  for round_dir in ("1", "2"):
    for f in _array_files(tmp_path / round_dir):
      f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
  with pytest.raises(ValueError, match=r"no intact checkpoint in .*round 2: .*round 1: ") as err:
    _run(tmp_path, 4)
  assert "\n" not in str(err.value)


def test_checksums_catch_what_the_format_does_not(tmp_path):
  """A checkpoint whose arrays still decode but differ from what was saved (damage the
  format cannot see) fails its checksum: the restore names it."""
  ckpt = checkpoint.Checkpointer(tmp_path)
  template = {"w": np.arange(6.0, dtype=np.float32)}
  ckpt.save(1, template, {"objective": np.zeros(1)})
  ckpt._manager.delete(1)  # pylint: disable=protected-access
  ckpt.save(1, {"w": np.arange(6.0, dtype=np.float32) + 1}, {"objective": np.zeros(1)})
  # swap in the first save's checksums: the arrays no longer match them
  meta = tmp_path / "1" / "host" / "metadata"
  text = meta.read_text()
  ckpt2 = checkpoint.Checkpointer(tmp_path / "other")
  ckpt2.save(1, template, {"objective": np.zeros(1)})
  meta.write_text((tmp_path / "other" / "1" / "host" / "metadata").read_text())
  assert meta.read_text() != text
  with pytest.raises(ValueError, match="checksum mismatch in its state"):
    ckpt.restore(template)


@contextlib.contextmanager
def _held_by_another_process(directory):
  """A subprocess holding ``DirectoryLock(directory)``; yields it, SIGKILLs it after."""
  code = (
    "import sys, time; from fedco.io import DirectoryLock; "
    "lock = DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); "
    "time.sleep(120)"
  )
  holder = subprocess.Popen(
    [sys.executable, "-c", code, str(directory)],
    cwd=helpers.ROOT,
    env={**os.environ, "PYTHONPATH": str(helpers.ROOT)},
    stdout=subprocess.PIPE,
  )
  try:
    assert holder.stdout.readline().strip() == b"held"
    yield holder
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_a_locked_directory_refuses_another_process_until_the_holder_dies(tmp_path):
  """A second process fails at once with one line naming the holder (pid, host, start);
  once the holder is killed (SIGKILL: no cleanup) the lock is free again. Within one
  process the lock is shared, so a workdir and a run inside it do not collide."""
  with _held_by_another_process(tmp_path) as holder:
    start = time.perf_counter()
    with pytest.raises(
      ValueError,
      match=rf"checkpoint_dir {tmp_path} is in use by a running "
      rf"process \(pid {holder.pid} on .* since .*\); wait "
      "for it to finish, stop it, or use another",
    ) as err:
      _run(tmp_path, 1)
    assert time.perf_counter() - start < helpers.limit_s(30) and "\n" not in str(err.value)
  with DirectoryLock(tmp_path):  # shared within this process; the killed holder's is free
    assert (tmp_path / ".lock").read_text().startswith(f"held by pid {os.getpid()} on ")
    _run(tmp_path, 1)
    assert (tmp_path / ".lock").read_text().startswith(f"held by pid {os.getpid()} on ")
  # released visibly: the file no longer reads like a holder's
  assert (tmp_path / ".lock").read_text().startswith(f"released by pid {os.getpid()} at ")


def test_an_unwritable_checkpoint_dir_is_a_one_line_error(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(ValueError, match="checkpoint_dir .* cannot be used") as err:
    _run(blocker / "ck", 1)
  assert "\n" not in str(err.value)


def test_two_processes_on_one_workdir_give_one_refusal(tmp_path):
  """An experiment binary started on a workdir another process is using stops at once with
  one line naming the holder, and leaves the directory as it was."""
  with _held_by_another_process(tmp_path) as holder:
    before = sorted(os.listdir(tmp_path))
    second = helpers.run(
      [
        sys.executable,
        "-m",
        "experiments.main",
        "--config=experiments/configs/fedavg_counterexample.py",
        f"--workdir={tmp_path}",
        "--config.rounds=5",
        "--noprogress",
      ],
      cwd=helpers.ROOT,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert (
      second.stderr.strip()
      .splitlines()[-1]
      .startswith(f"error: --workdir {tmp_path} is in use by a running process (pid {holder.pid}")
    )
    assert sorted(os.listdir(tmp_path)) == before
