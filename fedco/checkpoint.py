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
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import numpy as np
import orbax.checkpoint as ocp

from fedco import _validate


def _savable(leaf):
  """A host copy of ``leaf``, or the global array itself when it spans devices of other
  processes (``jax.device_get`` cannot read a part held elsewhere)."""
  if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
    return leaf
  return jax.device_get(leaf)


class Checkpointer:
  """Saves and restores ``(round, SimState, metrics)`` under one directory.

  Args:
    directory: where checkpoints live (created if missing); one sub-directory per round.
    keep: how many of the newest checkpoints to keep (``>= 1``).
  """

  def __init__(self, directory, *, keep: int = 3):
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory).strip():
      raise ValueError(f"checkpoint directory must be a non-empty path, got {directory!r}")
    keep = _validate.positive_int("keep", keep)
    self.directory = os.path.abspath(os.fspath(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False,
                                           create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_round(self) -> Optional[int]:
    """The newest saved round, or ``None`` when there is none."""
    return self._manager.latest_step()

  def all_rounds(self):
    return sorted(self._manager.all_steps())

  def save(self, round_: int, state, metrics: Dict[str, np.ndarray],
           host_rows: Sequence[Dict[str, Any]] = ()) -> None:
    """Write the checkpoint of round ``round_`` (blocks until it is complete on disk).

    ``host_rows`` are the host actions' rows so far (JSON-able dicts), restored with
    ``restore(..., with_host_rows=True)``. A round that is already saved is left as it is
    (a run is deterministic, so it holds the same state).
    """
    if int(round_) in self._manager.all_steps():
      return
    history = {k: np.asarray(v) for k, v in metrics.items()}
    self._manager.save(int(round_), args=ocp.args.Composite(
        state=ocp.args.StandardSave(jax.tree.map(_savable, state)),
        history=ocp.args.StandardSave(history),
        host=ocp.args.JsonSave({"rows": list(host_rows)})), force=True)
    self._manager.wait_until_finished()

  def restore(self, template, round_: Optional[int] = None, *,
              with_host_rows: bool = False) -> Tuple:
    """``(round, state, metrics)`` of round ``round_`` (default: the newest), and the host
    actions' rows as a fourth item with ``with_host_rows=True``.

    ``template`` is a state of the same structure (e.g. ``Simulator.init(params)``); the
    restored leaves take its pytree structure, shapes and dtypes.
    """
    round_ = self.latest_round() if round_ is None else int(round_)
    if round_ is None:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      restored = self._manager.restore(round_, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), history=ocp.args.StandardRestore(),
          host=ocp.args.JsonRestore()))
    except (ValueError, KeyError, TypeError) as err:
      lines = [l for l in str(err).splitlines() if l.strip()]
      raise ValueError(
          f"checkpoint of round {round_} in {self.directory} does not fit the simulation's "
          f"state (another model, parameter layout or algorithm?); remove it or use another "
          f"checkpoint_dir. orbax: {lines[0][:300] if lines else type(err).__name__}") from err
    leaves = jax.tree.leaves(restored.state)
    treedef = jax.tree.structure(template)
    if len(leaves) != treedef.num_leaves:
      raise ValueError(f"checkpoint of round {round_} in {self.directory} does not match the "
                       f"simulation: {len(leaves)} arrays, expected {treedef.num_leaves}")
    state = jax.tree.unflatten(treedef, leaves)
    metrics = {k: np.asarray(v) for k, v in dict(restored.history).items()}
    if not with_host_rows:
      return round_, state, metrics
    return round_, state, metrics, list((restored.host or {}).get("rows", []))

  def close(self):
    self._manager.close()
