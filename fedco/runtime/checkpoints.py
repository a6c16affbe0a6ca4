"""A run's checkpoint directory: locked while the run holds it, restored from, saved into.

:class:`RunCheckpoint` is :func:`fedco.simulate`'s (the state, the metrics so far, the
actions' rows, and the client state on disk journaled with each checkpoint);
:class:`SweepCheckpoint` is :func:`fedco.sweep`'s (every run's state and freeze round).
Both lock the directory (:class:`fedco.io.DirectoryLock`: a second run gets one line naming
the holder), name the run by its fingerprint (:mod:`fedco.runtime.fingerprint`: another
run's checkpoints are refused, or deleted on request), refuse a checkpoint past the
requested rounds and say "resumed from round N" on stderr. orbax loads only here, when a
checkpoint is asked for.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import jax

from fedco import _validate
from fedco.runtime import fingerprint, paging
from fedco.runtime.distributed import fetch


class _Locked:
  """A locked checkpoint directory and its :class:`fedco.checkpoint.Checkpointer`.

  ``describe()`` (called once the directory is locked) gives the run's description; its
  fingerprint names the run's checkpoints. ``holder``: whether this process takes the lock
  (in a multi-process run only process 0 does: they share the directory).
  """

  def __init__(self, directory, keep: int, every: int, describe, *, holder: bool = True):
    from fedco import checkpoint as checkpoint_lib  # orbax loads only when asked for
    from fedco.io import DirectoryLock  # pylint: disable=g-import-not-at-top

    self.directory, self.every = directory, every
    self.lock = DirectoryLock(directory, what="checkpoint_dir")
    if holder:
      self.lock.acquire()
    try:
      description = describe()
      self.run = {"fingerprint": fingerprint.fingerprint(description), "description": description}
      self.ckpt = checkpoint_lib.Checkpointer(directory, keep=keep)
    except BaseException:
      self.lock.release()
      raise

  @contextlib.contextmanager
  def _closed_on_error(self):
    """Closes the checkpointer and releases the lock when what it wraps fails (a restore:
    the run never starts, so nothing else would)."""
    try:
      yield
    except BaseException:
      self.close()
      raise

  def _check_rounds(self, done: int, rounds: int) -> None:
    if done > rounds:
      raise ValueError(
        f"{self.directory} holds round {done}, past rounds={rounds}; use "
        "another checkpoint_dir or more rounds"
      )

  def _say_resumed(self, done: int) -> None:
    print(f"resumed from round {done} ({self.directory})", file=sys.stderr, flush=True)

  def size(self, done: int, chunk: int, rounds: int) -> int:
    """The next chunk's rounds: at most ``chunk``, ending at the next checkpoint."""
    return min(chunk, rounds - done, self.every - done % self.every)

  def due(self, done: int, rounds: int) -> bool:
    """Whether a checkpoint is due after round ``done``."""
    return done % self.every == 0 or done == rounds

  def close(self) -> None:
    try:
      self.ckpt.close()
    finally:
      self.lock.release()


def every_round(checkpoint_every: Optional[int], chunk: int) -> int:
  """``checkpoint_every`` checked (an int ``>= 1``), or ``chunk`` when it is ``None``."""
  if checkpoint_every is None:
    return chunk
  return _validate.positive_int("checkpoint_every", checkpoint_every)


class RunCheckpoint(_Locked):
  """:func:`fedco.simulate`'s checkpoints: the state, the metrics and actions' rows so far,
  and (with :attr:`states`) the client state on disk, journaled with each checkpoint."""

  def __init__(self, directory, *, keep: int, every: int, sim, state, seed):
    # pages: one row (their count follows the chunks); the template restores take
    self.template = state = paging.compact(state)
    super().__init__(
      directory,
      keep,
      every,
      lambda: fingerprint.describe_run(sim, fetch(state.server["params"]), seed, state),
      holder=jax.process_index() == 0,  # a multi-process run shares the directory
    )
    self.states: Optional[paging.StateStore] = None

  def restore(
    self, rounds: int, mismatch: str
  ) -> Tuple[int, Any, List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(done, state, collected, host_rows)`` from the newest intact checkpoint, or
    ``(0, template, [], [])`` where there is none (or another run's, with ``mismatch``
    ``"restart"``: those are deleted), the template being the compacted initial state.
    A restore that fails closes this checkpoint (the lock is released)."""
    from fedco import checkpoint as checkpoint_lib  # pylint: disable=g-import-not-at-top

    with self._closed_on_error():
      if self.ckpt.latest_round() is None:
        return 0, self.template, [], []
      try:
        done, state, history, rows = self.ckpt.restore(
          self.template, with_host_rows=True, run=self.run
        )
      except checkpoint_lib.RunMismatchError:
        if mismatch == "error":
          raise
        self.ckpt.delete_all()
        return 0, self.template, [], []
      self._check_rounds(done, rounds)
      if done:
        self._say_resumed(done)
      return done, state, [history] if history else [], rows

  def save(self, round_: int, state, metrics, host_rows) -> None:
    """A checkpoint of ``round_``; the client state on disk is journaled before it."""
    if self.states is not None:
      self.states.journal(round_)
    self.ckpt.save(round_, paging.compact(state), metrics, host_rows, run=self.run)
    if self.states is not None:
      self.states.apply(round_)
      self.states.keep_journals(self.ckpt.all_rounds())  # one journal per checkpoint kept

  def states_folder(self) -> str:
    """Where a streamed run keeps its client state: ``<checkpoint_dir>/client_state``."""
    return os.path.join(self.directory, "client_state")


class SweepCheckpoint(_Locked):
  """:func:`fedco.sweep`'s checkpoints: every run's state and freeze round, and the
  metrics so far."""

  def __init__(self, directory, keep, every, sim, runs, inputs, template):
    self.template = template  # (states, frozen): what a restore fills

    def describe():
      first = jax.tree.map(lambda a: a[0], template[0])  # run 0's: the problem's probe
      description = fingerprint.describe_run(
        sim, jax.device_get(first.server["params"]), [r["seed"] for r in runs], template[0]
      )
      description["sweep"] = {
        "runs": fingerprint.describe(runs),
        "inputs": fingerprint.array_digest(inputs),
      }
      return description

    super().__init__(directory, keep, every, describe)

  def restore(self, rounds):
    """``(done, state, collected)`` from the newest intact checkpoint, or
    ``(0, template, {})`` where there is none. A restore that fails closes this checkpoint
    (the lock is released)."""
    with self._closed_on_error():
      if self.ckpt.latest_round() is None:
        return 0, self.template, {}
      done, state, history = self.ckpt.restore(self.template, run=self.run)
      self._check_rounds(done, rounds)
      self._say_resumed(done)
      return done, state, history

  def save(self, done, state, collected):
    self.ckpt.save(done, state, collected, run=self.run)


__all__ = ["RunCheckpoint", "SweepCheckpoint", "every_round"]
