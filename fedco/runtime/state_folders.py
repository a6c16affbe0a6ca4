"""A run's temporary client-state folder, and the folders of killed runs (decision 95).

A streamed stateful run without ``checkpoint_dir`` keeps its :class:`~fedco.runtime.StateStore`
in a ``fedco-client-state-*`` folder of the temporary directory (``TMPDIR``), which it
removes at its end. It holds the folder's owner file locked (``fcntl.flock``) for as long
as it lives, so the next run can tell a killed run's folder (nobody holds its lock) from a
live one's, whichever machine or container it runs on.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import IO, Dict, List, Optional

__all__ = ["remove_abandoned", "remove_temporary", "temporary_folder"]

PREFIX, OWNER = "fedco-client-state-", "owner.json"


def _boot_id() -> Optional[str]:
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:
    return None


_HELD: Dict[
  str, IO[str]
] = {}  # folder -> the open owner file whose flock this process holds for the run


def remove_abandoned(directory: Optional[str] = None) -> List[str]:
  """Removes the ``fedco-client-state-*`` folders under ``directory`` (default: the temporary
  directory) that killed runs left: those whose owner file no process holds locked.

  A run holds an exclusive ``fcntl.flock`` on its folder's owner file for as long as it
  lives (the operating system drops it when the process exits or is killed), so a folder
  is removed only if it carries an owner file written that way and that lock can be taken
  without waiting. Process ids and boot ids prove nothing where the temporary directory is
  shared by machines or PID namespaces (an NFS scratch, containers sharing ``/tmp``), so
  they are not used. Over NFS ``flock`` may not reach other machines; in doubt, use a
  ``TMPDIR`` of each machine's own. A folder without such an owner file, or whose lock is
  held (by any process, this one included), stays; nothing else is ever removed.

  Returns:
    The removed paths.
  """
  import fcntl  # pylint: disable=g-import-not-at-top

  directory = tempfile.gettempdir() if directory is None else directory
  removed: List[str] = []
  try:
    with os.scandir(directory) as entries:
      folders = [
        e.path for e in entries if e.name.startswith(PREFIX) and e.is_dir(follow_symlinks=False)
      ]
  except OSError:
    return removed
  for folder in folders:
    if folder in _HELD:
      continue
    try:
      with open(os.path.join(folder, OWNER), "rb") as f:
        try:
          fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its run lives
          continue
        owner = json.loads(f.read().decode())
        if not isinstance(owner, dict) or owner.get("lock") != "flock":
          continue  # not written by a run that holds its lock (an earlier fedco's)
        shutil.rmtree(folder, ignore_errors=True)  # while holding the lock
        removed.append(folder)
    except (OSError, ValueError):  # no owner file, or not ours
      continue
  return removed


def temporary_folder() -> str:
  """A new ``fedco-client-state-*`` folder in the temporary directory holding an owner file
  (pid, host, boot id: for people) that this process holds locked (``fcntl.flock``) until
  :func:`remove_temporary`, after removing abandoned ones (:func:`remove_abandoned`)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  import socket  # pylint: disable=g-import-not-at-top

  remove_abandoned()
  folder = tempfile.mkdtemp(prefix=PREFIX)
  me = {"pid": os.getpid(), "host": socket.gethostname(), "boot": _boot_id(), "lock": "flock"}
  staging = os.path.join(folder, f".{OWNER}")
  handle = open(staging, "w+")  # pylint: disable=consider-using-with
  try:  # locked before it is visible under its name: no other run ever sees it free
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    json.dump(me, handle)
    handle.flush()
    os.replace(staging, os.path.join(folder, OWNER))
  except BaseException:
    handle.close()
    shutil.rmtree(folder, ignore_errors=True)
    raise
  _HELD[folder] = handle
  return folder


def remove_temporary(folder: str) -> None:
  """Removes a :func:`temporary_folder`, then releases its owner file's lock."""
  try:
    shutil.rmtree(folder, ignore_errors=True)
  finally:
    handle = _HELD.pop(folder, None)
    if handle is not None:
      handle.close()
