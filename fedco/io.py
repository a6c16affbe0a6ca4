"""Atomic file writes: a reader never sees a half-written file, even after a kill."""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Iterable, List

TMP_PREFIX = ".tmp-"


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write(path, data, *, mode: str = "w") -> None:
  """Write ``data`` (str, or bytes with ``mode="wb"``) to ``path`` atomically."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + os.path.basename(path) + ".", dir=directory)
  try:
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
    with os.fdopen(fd, mode) as f:
      if callable(data):
        data(f)
      else:
        f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def remove_stale_temporaries(directory, names: Iterable[str]) -> List[str]:
  """Remove the temporary files that :func:`atomic_write` left in ``directory`` for the files
  ``names`` (a process killed while writing one); returns the names removed.

  Only regular files named ``.tmp-<name>.<8 random characters>`` (``mkstemp``'s names) go,
  never a directory, a link or any other file. A write in progress has such a file too: call
  this only while holding the lock its writers hold (a workdir's :class:`DirectoryLock`).
  """
  names = sorted(set(names))
  if not names:
    return []
  pattern = re.compile(
    "|".join(re.escape(f"{TMP_PREFIX}{name}.") + "[a-z0-9_]{8}" for name in names)
  )
  removed = []
  try:
    with os.scandir(os.fspath(directory)) as entries:
      stale = [e for e in entries if pattern.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
  except OSError:
    return removed
  for entry in stale:
    try:
      os.remove(entry.path)
    except OSError:
      continue
    removed.append(entry.name)
  return sorted(removed)


def atomic_write_json(path, value, *, indent: int = 2) -> None:
  """``json.dump(value)`` to ``path`` atomically (plain JSON values only)."""
  atomic_write(path, json.dumps(value, indent=indent) + "\n")


def _rewrite(handle, text: str) -> None:
  handle.seek(0)
  handle.truncate()
  handle.write(text)
  handle.flush()


class DirectoryLock:
  """An exclusive lock on a directory for one process: ``<directory>/.lock``.

  Held with ``fcntl.flock``, so the operating system releases it when the holder exits or is
  killed: a stale lock of a dead process is simply free again, and the next process takes it
  over. While held, the file records the holder (``held by pid ... since ...``) for the
  message another process gets; a clean release rewrites it to ``released by pid ... at
  ...``. The file itself stays (removing a lock file while another process may be opening
  it would let two processes hold two different files). The lock excludes other
  *processes*; within one process it is shared (a count), so nested users (an experiment's
  workdir and a run inside it) never lock themselves out. Use as a context manager or with
  :meth:`acquire` / :meth:`release`.

  Raises (on acquire):
    ValueError: another process holds the lock (the message names it), or the directory
      cannot be created or written.
  """

  NAME = ".lock"
  _held = {}  # path -> [open file, count] for the locks this process holds

  def __init__(self, directory, *, what: str = "directory"):
    self.directory = os.path.abspath(os.fspath(directory))
    self.path = os.path.join(self.directory, self.NAME)
    self.what = what
    self._file = None

  def acquire(self) -> "DirectoryLock":
    import datetime  # pylint: disable=g-import-not-at-top
    import fcntl  # pylint: disable=g-import-not-at-top
    import socket  # pylint: disable=g-import-not-at-top

    if self._file is not None:
      return self
    if self.path in DirectoryLock._held:
      DirectoryLock._held[self.path][1] += 1
      self._file = DirectoryLock._held[self.path][0]
      return self
    try:
      os.makedirs(self.directory, exist_ok=True)
      handle = open(self.path, "a+")  # pylint: disable=consider-using-with
    except OSError as err:
      raise ValueError(f"{self.what} {self.directory} cannot be used: {err.strerror}") from None
    try:
      fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
      handle.seek(0)
      holder = handle.read().strip().removeprefix("held by ") or "another process"
      handle.close()
      raise ValueError(
        f"{self.what} {self.directory} is in use by a running process ({holder}); "
        "wait for it to finish, stop it, or use another directory (a lock "
        "of a process that died frees itself)"
      ) from None
    start = datetime.datetime.now().isoformat(timespec="seconds")
    _rewrite(handle, f"held by pid {os.getpid()} on {socket.gethostname()} since {start}\n")
    self._file = handle
    DirectoryLock._held[self.path] = [handle, 1]
    return self

  def release(self) -> None:
    if self._file is None:
      return
    self._file = None
    entry = DirectoryLock._held.get(self.path)
    if entry is not None:
      entry[1] -= 1
      if entry[1] == 0:
        import datetime  # pylint: disable=g-import-not-at-top

        del DirectoryLock._held[self.path]
        try:  # say so, while still holding it: a reader never sees a held lock as free
          now = datetime.datetime.now().isoformat(timespec="seconds")
          _rewrite(entry[0], f"released by pid {os.getpid()} at {now}\n")
        except (OSError, ValueError):  # the directory went away, or interpreter shutdown
          pass
        entry[0].close()  # closing releases the flock

  def __enter__(self):
    return self.acquire()

  def __exit__(self, *exc):
    self.release()


__all__ = ["atomic_write", "atomic_write_json", "remove_stale_temporaries", "DirectoryLock"]
