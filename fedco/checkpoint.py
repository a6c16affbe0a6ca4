"""Checkpoints of a simulation: the whole :class:`~fedco.runtime.SimState` plus its history.

A checkpoint holds the server and client states, optimizer and aggregator states, the PRNG
key and the round counter (all inside ``SimState``), and the host-side per-round metrics
collected so far, so a resumed run continues bit for bit where it stopped. Checkpoints are
written by orbax, which writes into a temporary directory and renames it when complete: a
killed process leaves either a whole checkpoint or none. The last ``keep`` are kept.

Multi-process runs (``fedco.runtime.distributed``) checkpoint the same way, with every
process calling ``save`` and ``restore`` on the same directory (a file system they share):
arrays that span devices of other processes (replicated over them, or laid out by client
so that each process holds only its own part) go to orbax as global arrays, which writes
each shard once, and ``restore`` puts every shard back on the devices the ``template``
names. Arrays local to one process are copied to the host first.

``fedco.simulate(..., checkpoint_dir=...)`` and ``fedco.sweep`` use a :class:`Checkpointer`
themselves (resuming a run that was stopped); use one directly to keep states of your own
loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import warnings
import zlib
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedco import _validate

try:  # orbax runs each restore's reads through this in a fresh asyncio loop
  from orbax.checkpoint._src import asyncio_utils as _orbax_asyncio
except ImportError:  # pragma: no cover  # another orbax layout: restores run as orbax has them
  _orbax_asyncio = None


def _savable(leaf):
  """A host copy of ``leaf``, or the global array itself when it spans devices of other
  processes (``jax.device_get`` cannot read a part held elsewhere)."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    return leaf
  return jax.device_get(leaf)


_NO_METRICS = "__no_metrics__"


_WRITER_WAIT_S = 60.0  # at most this long for one failed save's other writers to stop


def _join_writers(before) -> None:
  """Waits (a bounded while) for the threads orbax started in a save that failed.

  orbax writes a checkpoint's items in threads of its own and a save raises on the first
  item that fails (a full disk), while the others may still be writing; one still running
  when the interpreter exits finds Python's executors shut down and logs a traceback
  ("cannot schedule new futures after interpreter shutdown") after the run's one-line
  error. So the error is raised only once they have stopped (or after _WRITER_WAIT_S).
  """
  for thread in set(threading.enumerate()) - before:
    if type(thread).__module__.startswith("orbax") and thread is not threading.current_thread():
      thread.join(_WRITER_WAIT_S)


class _SimStateOnDisk(NamedTuple):
  """A :class:`~fedco.runtime.SimState` as saved when its ``schedule`` is empty: the fields
  fedco wrote before ``sampling="epochs"`` added one, so those checkpoints still restore
  (orbax compares the tree's structure, and an empty field is still a node)."""

  round: Any
  key: Any
  server: Any
  server_opt_state: Any
  shared: Any
  clients: Any
  random_params: Any
  uplink: Any


class _SimStateWithSchedule(NamedTuple):
  """A :class:`~fedco.runtime.SimState` as saved when its ``timing`` is empty: the fields
  fedco wrote before ``delays`` added one."""

  round: Any
  key: Any
  server: Any
  server_opt_state: Any
  shared: Any
  clients: Any
  random_params: Any
  uplink: Any
  schedule: Any


def _on_disk(state):
  """``state`` as a checkpoint holds it (:class:`_SimStateOnDisk` for a ``SimState`` with no
  ``schedule`` and no ``timing``, :class:`_SimStateWithSchedule` for one with no
  ``timing``; anything else as it is)."""
  from fedco.runtime.rounds import SimState  # pylint: disable=g-import-not-at-top

  empty = lambda field: isinstance(field, tuple) and not field
  if not isinstance(state, SimState) or not empty(state.timing):
    return state
  return _SimStateOnDisk(*state[:8]) if empty(state.schedule) else _SimStateWithSchedule(*state[:9])


class RunMismatchError(ValueError):
  """A checkpoint directory holds another run's checkpoints (a ``ValueError``).

  Raised by :meth:`Checkpointer.restore` given ``run=`` (and so by a ``fedco.simulate`` or
  ``fedco.sweep`` resuming from ``checkpoint_dir``) when the checkpoint's run fingerprint
  differs from the current run's, or the checkpoint records none; the message names what
  differs. Use another directory, or ``checkpoint_mismatch='restart'`` to start over there.
  """


class _Damaged(Exception):
  """A checkpoint that cannot be used (unreadable, incomplete or failing its checksums)."""


def _checksums(tree) -> Dict[str, Optional[str]]:
  """``{path: crc32 of shape, dtype and bytes}`` of every leaf; ``None`` for global arrays
  held partly by other processes (each process can only read its own shards)."""
  out: Dict[str, Optional[str]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    key = jax.tree_util.keystr(path) or "."
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      out[key] = None
      continue
    a = np.ascontiguousarray(np.asarray(leaf))
    out[key] = f"{zlib.crc32(a.tobytes(), zlib.crc32(f'{a.shape}{a.dtype}'.encode())):08x}"
  return out


# ---- reads that end with their restore --------------------------------------------------
#
# orbax runs a restore's reads as tasks of a fresh asyncio loop and closes the loop as soon as
# one fails (a damaged file), with the others still in flight: each then reports on stderr as
# it ends ("RuntimeError: Event loop is closed" from TensorStore's callback) or is collected
# ("Exception ignored in: <coroutine _read_array_index_and_device_put ...>"), dozens of lines
# after the restore itself said "damaged". Within `_reads_finish()`, such a loop first lets the
# reads it started end (a damaged checkpoint's few files: quick; a minute at most), so a failed
# restore leaves nothing running. orbax's own way is kept for everything else.

_RESTORES = [0]  # restores of ours in progress (any thread: orbax may read in a pool)
_RESTORES_LOCK = threading.Lock()
_ORBAX_RUN = getattr(_orbax_asyncio, "_run_sync_via_new_loop", None)
_LEFT_READS_S = 60.0


def _run_sync_via_new_loop(coro):
  """orbax's ``asyncio_utils._run_sync_via_new_loop``; during a restore of ours, a failure
  lets the loop's other tasks end before the loop closes."""
  if not _RESTORES[0]:
    return _ORBAX_RUN(coro)
  loop = asyncio.new_event_loop()
  try:
    asyncio.set_event_loop(loop)
    return loop.run_until_complete(coro)
  except Exception:
    _let_tasks_end(loop)
    raise
  finally:
    asyncio.set_event_loop(None)
    loop.close()


def _let_tasks_end(loop) -> None:
  left = asyncio.all_tasks(loop)
  if not left:
    return
  _, late = loop.run_until_complete(asyncio.wait(left, timeout=_LEFT_READS_S))
  for task in late:
    task.cancel()
  if late:
    loop.run_until_complete(asyncio.wait(late, timeout=5.0))
  for task in left:  # their errors are the same damage: retrieved, so asyncio logs none
    if task.done() and not task.cancelled():
      task.exception()


@contextlib.contextmanager
def _reads_finish():
  if _ORBAX_RUN is None:  # another orbax: nothing to change
    yield
    return
  with _RESTORES_LOCK:
    _RESTORES[0] += 1
    # pylint: disable-next=protected-access
    _orbax_asyncio._run_sync_via_new_loop = _run_sync_via_new_loop
  try:
    yield
  finally:
    with _RESTORES_LOCK:
      _RESTORES[0] -= 1


_ORBAX_FILES = os.path.join(os.path.dirname(os.path.abspath(ocp.__file__)), "")


class _OrbaxRecords(logging.Filter):
  """Drops the log records orbax's own code makes (logged from a file of ``orbax.checkpoint``
  through absl, or by a logger named ``orbax...``); every other record passes."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (
      record.name.startswith("orbax") or os.path.abspath(record.pathname).startswith(_ORBAX_FILES)
    )


_QUIET_FILTER = _OrbaxRecords()
_QUIET_LOCK = threading.Lock()
_QUIET_LOGGERS: list = []  # the loggers holding the filter while any _quiet() is in use
_QUIET_USES = [0]


@contextlib.contextmanager
def _quiet():
  """orbax's log lines (e.g. "Failed to json parse Metadata file" for a damaged checkpoint's
  metadata) held back: a damaged checkpoint is fedco's one line, not orbax's.

  A filter on absl's logger (through which orbax logs) and orbax's own loggers drops only
  orbax's records, for as long as any use is open (uses in several threads overlap: the last
  to end removes it); a user's own log lines, absl's included, pass, and no logger's level
  changes.
  """
  with _QUIET_LOCK:
    if _QUIET_USES[0] == 0:
      names = ["absl"] + [
        name
        for name, logger in list(logging.root.manager.loggerDict.items())
        if name.startswith("orbax") and isinstance(logger, logging.Logger)
      ]
      _QUIET_LOGGERS[:] = [logging.getLogger(name) for name in names]
      for logger in _QUIET_LOGGERS:
        logger.addFilter(_QUIET_FILTER)
    _QUIET_USES[0] += 1
  try:
    yield
  finally:
    with _QUIET_LOCK:
      _QUIET_USES[0] -= 1
      if _QUIET_USES[0] == 0:
        for logger in _QUIET_LOGGERS:
          logger.removeFilter(_QUIET_FILTER)
        _QUIET_LOGGERS.clear()


def _cause(err: BaseException) -> BaseException:
  """The innermost cause of ``err`` (TensorStore's own error under orbax's wrapper)."""
  seen = {id(err)}
  while err.__cause__ is not None and id(err.__cause__) not in seen:
    err = err.__cause__
    seen.add(id(err))
  return err


def _fallback_note(directory, causes, used) -> str:
  """One line: the damaged checkpoints ``causes`` (``(round, cause)``), the one ``used``."""
  rounds = ", ".join(str(r) for r, _ in causes)
  if len(causes) == 1:
    what = f"checkpoint of round {rounds} in {directory} is damaged ({causes[0][1]})"
  else:
    detail = "; ".join(f"round {r}: {e}" for r, e in causes)
    what = f"checkpoints of rounds {rounds} in {directory} are damaged ({detail})"
  return f"{what}; resuming from round {used}, the newest intact one"


def _brief(shapes):
  text = ", ".join(shapes)
  return text if len(text) <= 120 else text[:117] + "..."


def _check_run(directory, round_, saved, current):
  """Refuse a checkpoint written by another run (different fingerprint)."""
  from fedco.runtime import fingerprint as fp  # pylint: disable=g-import-not-at-top

  if saved is None:
    raise RunMismatchError(
      f"checkpoint of round {round_} in {directory} records no run "
      "fingerprint; it cannot be shown to belong to this run. Use another "
      "checkpoint_dir, or checkpoint_mismatch='restart' to start over there"
    )
  if saved.get("fingerprint") == current["fingerprint"]:
    return
  diff = fp.differences(saved.get("description") or {}, current["description"])
  raise RunMismatchError(
    f"{directory} holds checkpoints of another run (round {round_}; differs in "
    f"{', '.join(diff[:6]) or 'its fingerprint'}); use another checkpoint_dir, or "
    "checkpoint_mismatch='restart' to start over there"
  )


class Checkpointer:
  """Saves and restores ``(round, SimState, metrics)`` under one directory.

  Each :meth:`save` writes one round's state (any pytree of arrays; ``fedco.simulate``
  saves its whole :class:`~fedco.runtime.SimState`), the per-round metrics so far and the
  host rows, with a checksum of every array; orbax writes it atomically, so a killed process
  leaves a whole checkpoint or none. :meth:`restore` returns the newest intact one (a
  damaged one is skipped with a warning) in the structure of a template. Only the newest
  ``keep`` rounds are kept. A checkpoint of another model or algorithm (other array shapes)
  is a ``ValueError``; one of another run (``run=`` fingerprints) a
  :class:`RunMismatchError`.

  Args:
    directory: where checkpoints live (str or path-like; created if missing); one
      sub-directory per round.
    keep: how many of the newest checkpoints to keep (an integer ``>= 1``; default 3).

  Raises:
    ValueError: ``directory`` is not a non-empty path, or ``keep`` is not an integer
      ``>= 1``.

  Examples:
    >>> import os
    >>> import tempfile
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as directory:
    ...   ckpt = fedco.checkpoint.Checkpointer(os.path.join(directory, "ckpt"), keep=2)
    ...   for r in (1, 2, 3):  # the state after round r, and the metrics of rounds 1..r
    ...     state = {"params": jnp.array([1.0, 2.0]) * r, "count": jnp.int32(r)}
    ...     ckpt.save(r, state, {"loss": np.array([0.5, 0.25, 0.125])[:r]})
    ...   print(ckpt.all_rounds())  # keep=2: round 1 was deleted
    ...   template = {"params": jnp.zeros(2), "count": jnp.int32(0)}
    ...   round_, state, metrics = ckpt.restore(template)  # the newest intact round
    ...   print(round_, state["params"].tolist(), metrics["loss"].tolist())
    ...   ckpt.close()
    [2, 3]
    3 [3.0, 6.0] [0.5, 0.25, 0.125]
  """

  def __init__(self, directory, *, keep: int = 3):
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory).strip():
      raise ValueError(f"checkpoint directory must be a non-empty path, got {directory!r}")
    keep = _validate.positive_int("keep", keep)
    self.directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, enable_async_checkpointing=False, create=True
    )
    with _quiet():  # it reads every checkpoint's metadata
      self._manager = ocp.CheckpointManager(
        self.directory,
        options=options,
        item_handlers={
          "state": ocp.StandardCheckpointHandler(),
          "history": ocp.StandardCheckpointHandler(),
          "host": ocp.JsonCheckpointHandler(),
        },
      )

  def latest_round(self) -> Optional[int]:
    """The newest saved round, or ``None`` when there is none."""
    return self._manager.latest_step()

  def all_rounds(self):
    """The saved rounds, oldest first (a list of ints; ``[]`` when there is none)."""
    return sorted(self._manager.all_steps())

  def save(
    self,
    round_: int,
    state,
    metrics: Dict[str, np.ndarray],
    host_rows: Sequence[Dict[str, Any]] = (),
    *,
    run: Optional[Dict[str, Any]] = None,
  ) -> None:
    """Write the checkpoint of round ``round_`` (blocks until it is complete on disk).

    ``host_rows`` are the host actions' rows so far (JSON-able dicts), restored with
    ``restore(..., with_host_rows=True)``; ``run`` is the run's ``{"fingerprint",
    "description"}`` (:mod:`fedco.runtime.fingerprint`), checked on restore. Checksums of
    every saved array are stored beside them and verified on restore. A round that is
    already saved is left as it is (a run is deterministic, so it holds the same state).
    """
    if int(round_) in self._manager.all_steps():
      return
    history = {k: np.asarray(v) for k, v in metrics.items()}
    if not history:  # orbax refuses an empty item (a run that diverged in its first chunk)
      history = {_NO_METRICS: np.zeros((1,), np.float32)}
    state = _on_disk(jax.tree.map(_savable, state))
    meta = {
      "rows": list(host_rows),
      "run": run,
      "checksums": {"state": _checksums(state), "history": _checksums(history)},
    }
    before = set(threading.enumerate())
    try:
      self._manager.save(
        int(round_),
        args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          history=ocp.args.StandardSave(history),
          host=ocp.args.JsonSave(meta),
        ),
        force=True,
      )
      self._manager.wait_until_finished()
    except BaseException:
      _join_writers(before)
      raise

  def restore(
    self,
    template,
    round_: Optional[int] = None,
    *,
    with_host_rows: bool = False,
    run: Optional[Dict[str, Any]] = None,
  ) -> Tuple:
    """``(round, state, metrics)`` of round ``round_`` (default: the newest intact one), and
    the host actions' rows as a fourth item with ``with_host_rows=True``.

    ``template`` is a state of the same structure (e.g. ``Simulator.init(params)``); the
    restored leaves take its pytree structure, shapes and dtypes. Without ``round_``, a
    checkpoint that cannot be read or whose arrays fail their checksums is skipped and the
    next older one is tried; the one used then comes with one warning naming the damaged ones
    and their causes.

    Raises:
      FileNotFoundError: no checkpoint in the directory.
      RunMismatchError: ``run`` is given and the checkpoint was written by another run (the
        message names what differs).
      ValueError: no checkpoint is intact (the message names the directory and each cause).
    """
    rounds = [int(round_)] if round_ is not None else sorted(self.all_rounds(), reverse=True)
    if not rounds:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    causes = []
    for candidate in rounds:
      try:
        with _quiet():
          out = self._restore_one(template, candidate)
      except _Damaged as err:
        causes.append((candidate, err))
        continue
      state, metrics, meta = out
      if run is not None:
        _check_run(self.directory, candidate, meta.get("run"), run)
      if causes and round_ is None:
        warnings.warn(_fallback_note(self.directory, causes, candidate), stacklevel=2)
      if not with_host_rows:
        return candidate, state, metrics
      return candidate, state, metrics, list(meta.get("rows", []))
    raise ValueError(
      f"no intact checkpoint in {self.directory}: {'; '.join(f'round {r}: {e}' for r, e in causes)}"
    )

  def _restore_one(self, template, round_):
    self._check_fits(template, round_)
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, _on_disk(template))
    try:
      with _reads_finish():
        restored = self._manager.restore(
          round_,
          args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            history=ocp.args.StandardRestore(),
            host=ocp.args.JsonRestore(),
          ),
        )
    except Exception as err:  # pylint: disable=broad-except  # orbax raises many kinds
      err = _cause(err)
      lines = [l for l in str(err).splitlines() if l.strip()]
      raise _Damaged(
        f"unreadable ({type(err).__name__}: {lines[0][:200] if lines else 'no message'})"
      ) from None
    leaves = jax.tree.leaves(restored.state)
    treedef = jax.tree.structure(template)
    if len(leaves) != treedef.num_leaves:
      raise _Damaged(f"{len(leaves)} arrays where the simulation has {treedef.num_leaves}")
    state = jax.tree.unflatten(treedef, leaves)
    metrics = {k: np.asarray(v) for k, v in dict(restored.history).items()}
    meta = dict(restored.host or {})
    sums = meta.get("checksums")
    if sums is None:
      raise _Damaged("no checksums (written by an older fedco, or its metadata is damaged)")
    state_sums = _checksums(jax.tree.map(_savable, state))
    for name, (want, got) in (
      ("state", (sums.get("state"), state_sums)),
      ("metrics", (sums.get("history"), _checksums(metrics))),
    ):
      if want != got:
        bad = [k for k in sorted(set(want or {}) | set(got)) if (want or {}).get(k) != got.get(k)]
        raise _Damaged(f"checksum mismatch in its {name} ({', '.join(bad[:4])})")
    metrics.pop(_NO_METRICS, None)
    return state, metrics, meta

  def _check_fits(self, template, round_):
    """A readable checkpoint whose arrays' shapes differ from the template's was written for
    another model or algorithm: a ``ValueError``, not damage (no older one is tried)."""
    try:
      with _reads_finish():
        meta = self._manager.item_metadata(round_)["state"]
      saved = jax.tree.leaves(meta)
      saved = sorted(f"{tuple(m.shape)}" for m in saved)
    except Exception as err:  # pylint: disable=broad-except
      raise _Damaged(f"unreadable metadata ({type(err).__name__})") from None
    want = sorted(f"{tuple(np.shape(leaf))}" for leaf in jax.tree.leaves(template))
    if saved != want:
      raise ValueError(
        f"checkpoint of round {round_} in {self.directory} does not fit the simulation's "
        f"state (another model, parameter layout or algorithm?): it holds {len(saved)} "
        f"arrays of shapes {_brief(saved)}, the simulation {len(want)} of {_brief(want)}; "
        "use another checkpoint_dir"
      )

  def delete_all(self) -> None:
    """Delete every checkpoint of this directory (only the round directories it wrote)."""
    for round_ in self.all_rounds():
      self._manager.delete(round_)

  def close(self):
    """Releases orbax's checkpoint manager; the checkpoints stay on disk."""
    self._manager.close()


__all__ = ["Checkpointer", "RunMismatchError"]
