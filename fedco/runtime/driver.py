"""The host driver: the chunk loop that :func:`fedco.simulate` and :func:`fedco.sweep` share.

A run advances in chunks of rounds, each one jitted call; between chunks the host writes
the chunk's rows, runs actions, checkpoints and moves the progress bar. What differs
between a simulation and a sweep (what a chunk runs, what it writes, when it checkpoints)
is the :class:`Chunked` job's; what is the same is here, once:

- the Ctrl-C guard (:func:`~fedco.runtime.host.interrupt_guard`): a Ctrl-C is deferred to
  the end of the running chunk and never lost: one that came before the run stops it
  before its first round, one during a chunk that diverges raises
  :class:`~fedco.runtime.host.Interrupted` chained to the divergence, one during the last
  chunk raises ``Interrupted`` carrying the finished result;
- the progress bar (:class:`~fedco.runtime.host.ProgressBar`);
- the order of the end: the bar closes, then the job (its files, writers, checkpoint and
  lock), whatever ended the run.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Protocol

from fedco.runtime import host
from fedco.runtime.checks import NonFiniteError


class Chunked(Protocol):
  """A run the driver advances chunk by chunk (:func:`drive`).

  Attributes:
    name: the run's name on the progress bar and in ``Interrupted``'s message.
    checkpointed: whether the run saves checkpoints (``Interrupted`` says it resumes).
  """

  # read-only properties: the runs define them as properties, and the driver only reads them
  @property
  def name(self) -> str:
    """The run's name on the progress bar and in ``Interrupted``'s message."""

  @property
  def checkpointed(self) -> bool:
    """Whether the run saves checkpoints (``Interrupted`` says it resumes)."""

  def start(self, done: int) -> None:
    """Called once, inside the Ctrl-C guard, before the first chunk (``done``: rounds
    already run, from a checkpoint)."""

  def size(self, done: int) -> int:
    """The rounds of the chunk that starts after round ``done`` (``>= 1``)."""

  def step(self, done: int, size: int) -> None:
    """Runs rounds ``done + 1 .. done + size`` and writes their rows; may raise
    :class:`~fedco.runtime.checks.NonFiniteError`."""

  def after(self, done: int, stopping: bool) -> Optional[float]:
    """After the chunk that ended at round ``done``: actions, checkpoint (``stopping``: a
    Ctrl-C is pending, so checkpoint now); returns the progress bar's value."""

  def result(self, seconds: float) -> Any:
    """The run's result, ``seconds`` after it started."""

  def close(self) -> None:
    """Releases what the run holds; called once, however the run ended."""


def drive(
  job: Chunked,
  rounds: int,
  done: int = 0,
  *,
  progress: Optional[bool] = None,
  progress_metric: str = "objective",
  start: Optional[float] = None,
) -> Any:
  """Runs ``job`` from round ``done`` to ``rounds`` and returns ``job.result(seconds)``.

  ``start`` (a ``time.perf_counter()`` value; default now) is when the run's clock began.
  ``job.close()`` runs whatever ends the run (after the progress bar closes).

  Raises:
    Interrupted: after a Ctrl-C, at the end of the running chunk.
    NonFiniteError: from ``job.step`` when no Ctrl-C is pending.
  """
  start = time.perf_counter() if start is None else start
  bar = host.ProgressBar(rounds, label=job.name, enabled=progress, initial=done)

  def interrupted(when: str) -> host.Interrupted:
    return host.Interrupted.of_run(job.name, when, done, job.checkpointed)

  try:
    with host.interrupt_guard() as stop:
      if stop.requested:  # Ctrl-C came before this run (a guard around a loop of runs)
        raise interrupted(f"before round {done + 1} of {rounds}")
      job.start(done)
      while done < rounds:
        size = job.size(done)
        try:
          job.step(done, size)
        except NonFiniteError as err:
          if stop.requested:  # the user asked to stop: that, not the divergence, ends it
            raise interrupted(
              f"in rounds {done + 1}-{done + size} of {rounds}, which diverged ({err.args[0]})"
            ) from err
          raise
        done += size
        bar.update(done, job.after(done, stop.requested), progress_metric)
        if stop.requested and done < rounds:
          raise interrupted(f"after round {done} of {rounds}")
      if stop.requested:  # during the last chunk: the run is complete, and still stops
        stopped = interrupted(f"at its end (round {rounds} of {rounds}, complete)")
        stopped.result = job.result(time.perf_counter() - start)
        raise stopped
  finally:
    try:
      bar.close()
    finally:
      job.close()
  return job.result(time.perf_counter() - start)


__all__ = ["Chunked", "drive"]
