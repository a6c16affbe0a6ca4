"""The host driver (fedco.runtime.driver) on a toy job: no simulator, only the loop's rules."""

import os
import signal

import pytest

from fedco.runtime import driver, host
from fedco.runtime.checks import NonFiniteError


class Toy:
  """A job of ``rounds`` rounds in chunks of 2 that records what the driver asked of it;
  ``ctrl_c_in``: SIGINT to this process during that chunk's step (by its first round);
  ``diverge_in``: a NonFiniteError from that chunk's step."""

  name, checkpointed = "toy", False

  def __init__(self, ctrl_c_in=None, diverge_in=None):
    self.calls, self.ctrl_c_in, self.diverge_in = [], ctrl_c_in, diverge_in

  def start(self, done):
    self.calls.append(("start", done))

  def size(self, done):
    return 2

  def step(self, done, size):
    self.calls.append(("step", done, size))
    if done + 1 == self.ctrl_c_in:
      os.kill(os.getpid(), signal.SIGINT)
    if done + 1 == self.diverge_in:
      raise NonFiniteError(f"diverged at round {done + 1}", done + 1, {})

  def after(self, done, stopping):
    self.calls.append(("after", done, stopping))
    return float(done)

  def result(self, seconds):
    return ("result", seconds >= 0)

  def close(self):
    self.calls.append(("close",))


def test_drive_runs_the_chunks_then_closes_the_job_once():
  job = Toy()
  assert driver.drive(job, 4, progress=False) == ("result", True)
  assert job.calls == [
    ("start", 0),
    ("step", 0, 2),
    ("after", 2, False),
    ("step", 2, 2),
    ("after", 4, False),
    ("close",),
  ]


def test_drive_starts_from_a_restored_round():
  job = Toy()
  driver.drive(job, 4, 2, progress=False)
  assert job.calls[:2] == [("start", 2), ("step", 2, 2)]


def test_a_ctrl_c_stops_after_its_chunk_with_the_rows_written_and_the_job_closed():
  job = Toy(ctrl_c_in=3)
  with pytest.raises(host.Interrupted) as stopped:
    driver.drive(job, 6, progress=False)
  assert stopped.value.round == 4 and "after round 4 of 6" in str(stopped.value)
  assert ("after", 4, True) in job.calls and job.calls[-1] == ("close",)
  assert not any(c[0] == "step" and c[1] == 4 for c in job.calls)  # no chunk after it


def test_a_ctrl_c_in_the_last_chunk_still_stops_carrying_the_finished_result():
  job = Toy(ctrl_c_in=3)
  with pytest.raises(host.Interrupted) as stopped:
    driver.drive(job, 4, progress=False)
  assert stopped.value.result == ("result", True) and "complete" in str(stopped.value)


def test_a_divergence_is_raised_as_it_is_and_the_job_closed():
  job = Toy(diverge_in=3)
  with pytest.raises(NonFiniteError, match="round 3"):
    driver.drive(job, 6, progress=False)
  assert job.calls[-1] == ("close",) and ("after", 4, False) not in job.calls


def test_a_ctrl_c_during_a_diverging_chunk_is_the_stop_chained_to_the_divergence():
  job = Toy(ctrl_c_in=3, diverge_in=3)
  with pytest.raises(host.Interrupted) as stopped:
    driver.drive(job, 6, progress=False)
  assert "which diverged" in str(stopped.value)
  assert isinstance(stopped.value.__cause__, NonFiniteError)
  assert job.calls[-1] == ("close",)
