"""Ctrl-C for runs: deferred to a safe point, never dropped (decision 74).

:func:`interrupt_guard` installs a SIGINT handler that only records the request; the runs
inside (``fedco.simulate``, ``fedco.sweep``) honour it after their running chunk with
:class:`Interrupted`, once what they wrote is complete. Guards nest, so one around a loop
of runs stops the loop at the first run boundary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Any, List, Optional


class Interrupted(KeyboardInterrupt):
  """Ctrl-C stopped a run between chunks; everything up to ``round`` is written.

  Attributes:
    round: the last round whose rows (and, when checkpointing, checkpoint) are written;
      ``None`` when no run was under way.
    result: what the run returned when the stop came during its last chunk (it finished),
      else ``None``.
  """

  def __init__(self, message: str, round_: Optional[int], result: Any = None):
    super().__init__(message)
    self.round = round_
    self.result = result

  def __str__(self):
    return self.args[0]

  @classmethod
  def of_run(cls, name: str, when: str, done: int, checkpointed: bool) -> "Interrupted":
    """The stop of the run (or sweep) ``name`` ``when`` (``"after round 3 of 9"``), with its
    first ``done`` rounds written (and checkpointed)."""
    written = " and a checkpoint are" if checkpointed else " are"
    rows = f"the metrics of rounds 1-{done}{written} written" if done else "nothing is lost"
    return cls(f"interrupted {name} {when}: {rows}", done)


class _StopRequest:
  def __init__(self):
    self.requested = False


# the stop request of the active guard in this process (its main thread)
_guards: List[_StopRequest] = []


def _in_notebook() -> bool:
  """In a Jupyter kernel, Ctrl-C is the kernel's interrupt: never end the process there."""
  return "ipykernel" in sys.modules


def _end_process(signum, frame):
  """The second Ctrl-C: end the process as an unhandled Ctrl-C does (exit by SIGINT).

  Raising ``KeyboardInterrupt`` here instead can land inside XLA's compiler, which is not
  safe to unwind through (a segmentation fault was observed). Checkpoints, streamed rows and
  results are written atomically, so nothing is half-written and a rerun resumes.
  """
  del frame
  os.write(2, b"\nsecond Ctrl-C: stopping now\n")
  signal.signal(signal.SIGINT, signal.SIG_DFL)
  os.kill(os.getpid(), signum)


@contextlib.contextmanager
def interrupt_guard():
  """Defer Ctrl-C: a block of runs that one Ctrl-C stops at the next safe point.

  Installs a SIGINT handler that only records the request. ``fedco.simulate`` and
  ``fedco.sweep`` run under this guard: they stop after the running chunk with
  :class:`Interrupted`, after writing every finished row and checkpoint, also when the stop
  came during their last chunk or a diverging one. Guards nest: a guard around a loop of
  runs (the experiment driver's) shares its request with the runs inside, so a Ctrl-C
  between two runs stops the next one before it starts, and one that came while the block
  ran no run raises :class:`Interrupted` when the block ends. A second Ctrl-C ends the
  process at once (exit by SIGINT; in a Jupyter kernel, ``KeyboardInterrupt``). A no-op
  outside the main thread. The previous SIGINT handler is restored on exit.

  Typical use, one Ctrl-C stopping a loop of runs after a finished chunk::

    with fedco.runtime.interrupt_guard():
      for seed in range(3):
        fedco.simulate(problem, algorithm, data, params, rounds=100, seed=seed)

  Yields:
    A stop request whose boolean ``requested`` the first SIGINT sets (shared with the
    enclosing guard when nested).

  Raises:
    Interrupted: when the block ends after a Ctrl-C that no run inside it honoured.

  Examples:
    A Ctrl-C (here sent by the process itself) is recorded, and the block runs to its end:

    >>> import signal
    >>> import fedco
    >>> try:
    ...   with fedco.runtime.interrupt_guard() as stop:
    ...     signal.raise_signal(signal.SIGINT)
    ...     print("still running, stop requested:", stop.requested)
    ... except fedco.runtime.Interrupted as err:
    ...   print(err)
    still running, stop requested: True
    interrupted: the block ended after Ctrl-C; everything it ran is written
  """
  if threading.current_thread() is not threading.main_thread():
    yield _StopRequest()
    return
  if _guards:  # nested: the outer guard's request, raised by the runs or the outer guard
    yield _guards[-1]
    return
  stop = _StopRequest()

  def handler(signum, frame):
    if stop.requested:
      if _in_notebook():
        raise KeyboardInterrupt
      _end_process(signum, frame)
    stop.requested = True

  previous = signal.signal(signal.SIGINT, handler)
  _guards.append(stop)
  try:
    yield stop
  finally:
    _guards.pop()
    signal.signal(signal.SIGINT, previous)
  if stop.requested:  # a stop that no run inside the block honoured
    raise Interrupted(
      "interrupted: the block ended after Ctrl-C; everything it ran is written", None
    )
