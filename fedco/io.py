"""Atomic file writes: a reader never sees a half-written file, even after a kill.

What fedco writes while a run goes on (streamed metric rows, sweep results, an experiment's
outputs and manifest) goes through :func:`atomic_write` / :func:`atomic_write_json`: the
text goes to a temporary file beside the target, is flushed to disk, and replaces the
target in one ``os.replace``. A process killed mid-write leaves the old file whole (and a
``.tmp-*`` file that :func:`remove_stale_temporaries` clears). :class:`DirectoryLock` keeps
two processes out of one working or checkpoint directory. :func:`pwrite_all` and
:func:`pread_all` move whole buffers at a position of a file (client stores and client
state read and write their rows with them).
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
from typing import IO, Any, Dict, Iterable, List, Optional

TMP_PREFIX = ".tmp-"
_CALL_BYTES = 256 << 20  # the most one pwrite / preadv moves (Linux: under 2 GiB a call)


def pwrite_all(fd: int, data, offset: int) -> None:
  """Every byte of ``data`` (a C-contiguous buffer) written to ``fd`` at ``offset``:
  ``pwrite`` may move fewer bytes than asked (Linux at most 2,147,479,552 a call), so it is
  called until all are written."""
  view, done = memoryview(data).cast("B"), 0
  while done < len(view):
    n = os.pwrite(fd, view[done : done + _CALL_BYTES], offset + done)
    if n <= 0:
      raise OSError(errno.EIO, f"pwrite wrote nothing at byte {offset + done}")
    done += n


def pread_all(fd: int, out, offset: int) -> int:
  """Reads ``fd`` from ``offset`` into ``out`` (a writable C-contiguous buffer) until it is
  full or the file ends (``preadv`` may move fewer bytes than asked); the bytes read."""
  view, done = memoryview(out).cast("B"), 0
  while done < len(view):
    n = os.preadv(fd, [view[done : done + _CALL_BYTES]], offset + done)
    if n <= 0:  # the end of the file
      break
    done += n
  return done


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write(path, data, *, mode: str = "w") -> None:
  r"""Writes a file atomically: readers see the old content or the new, never a part.

  The data go to a temporary file ``.tmp-<name>.<random>`` in the same directory (created
  with the usual permissions, ``0o666`` less the umask), are flushed and ``fsync``-ed, and
  the file then replaces ``path`` with ``os.replace`` (atomic on POSIX). On any error,
  including ``KeyboardInterrupt``, the temporary file is removed and the error re-raised;
  only a hard kill leaves one behind (see :func:`remove_stale_temporaries`).

  Args:
    path: the file to write (str or path-like); its directory must exist.
    data: the content: a ``str`` (or ``bytes`` with ``mode="wb"``), or a callable
      ``data(file)`` that writes into the open file itself (for large or streamed content).
    mode: the ``open`` mode of the temporary file: ``"w"`` (default, text) or ``"wb"``.

  Returns:
    ``None``.

  Examples:
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as directory:
    ...   path = os.path.join(directory, "rows.csv")
    ...   fedco.io.atomic_write(path, "round,loss\n1,0.5\n")
    ...   fedco.io.atomic_write(path, lambda f: f.write("round,loss\n2,0.25\n"))
    ...   print(open(path).read().splitlines(), os.listdir(directory))  # no temporary left
    ['round,loss', '2,0.25'] ['rows.csv']
  """
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
  """Removes the temporary files that a killed :func:`atomic_write` left behind.

  A process killed while writing one of the files ``names`` in ``directory`` leaves its
  temporary file. Only regular files named ``.tmp-<name>.<8 random characters>``
  (``mkstemp``'s names) for one of ``names`` go, never a directory, a link or any other
  file. A write in progress has such a file too: call this only while holding the lock its
  writers hold (a workdir's :class:`DirectoryLock`). Errors (a missing directory, a file
  that cannot be removed) are skipped silently.

  Args:
    directory: the directory to clean (str or path-like).
    names: the base names of the files whose temporaries may go (e.g. ``["rows.csv"]``).

  Returns:
    The sorted names of the temporary files removed (``[]`` when none).

  Examples:
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as directory:
    ...   open(os.path.join(directory, ".tmp-rows.csv.ab12cd34"), "w").close()  # a killed write
    ...   open(os.path.join(directory, "notes.txt"), "w").close()
    ...   print(fedco.io.remove_stale_temporaries(directory, ["rows.csv"]))
    ...   print(sorted(os.listdir(directory)))
    ['.tmp-rows.csv.ab12cd34']
    ['notes.txt']
  """
  names = sorted(set(names))
  if not names:
    return []
  pattern = re.compile(
    "|".join(re.escape(f"{TMP_PREFIX}{name}.") + "[a-z0-9_]{8}" for name in names)
  )
  removed: List[str] = []
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
  """Writes a value as JSON, atomically (see :func:`atomic_write`).

  The file holds ``json.dumps(value, indent=indent)`` and a final newline.

  Args:
    path: the file to write (str or path-like); its directory must exist.
    value: plain JSON values only: dicts with string keys, lists, strings, Python numbers,
      bools and ``None`` (convert NumPy and JAX values with ``.tolist()`` or ``float``).
    indent: the indentation of nested values (default 2).

  Returns:
    ``None``.

  Raises:
    TypeError: ``value`` holds something JSON cannot encode (e.g. a ``np.float32``); the
      file is left as it was.

  Examples:
    >>> import json
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as directory:
    ...   path = os.path.join(directory, "result.json")
    ...   fedco.io.atomic_write_json(path, {"round": 3, "loss": [0.5, 0.25]})
    ...   print(json.load(open(path)))
    {'round': 3, 'loss': [0.5, 0.25]}
  """
  atomic_write(path, json.dumps(value, indent=indent) + "\n")


def _rewrite(handle, text: str) -> None:
  handle.seek(0)
  handle.truncate()
  handle.write(text)
  handle.flush()


class DirectoryLock:
  """An exclusive lock on a directory for one process: ``<directory>/.lock``.

  ``fedco.simulate``'s and ``fedco.sweep``'s ``checkpoint_dir`` and an experiment's workdir
  are held with it, so two processes never write one directory. Held with ``fcntl.flock``,
  so the operating system releases it when the holder exits or is killed: a stale lock of a
  dead process is simply free again, and the next process takes it over. While held, the
  file records the holder (``held by pid ... since ...``) for the message another process
  gets; a clean release rewrites it to ``released by pid ... at ...``. The file itself stays
  (removing a lock file while another process may be opening it would let two processes
  hold two different files). The lock excludes other *processes*; within one process it is
  shared (a count), so nested users (an experiment's workdir and a run inside it) never
  lock themselves out. Use as a context manager or with :meth:`acquire` / :meth:`release`.
  Constructing it takes nothing; the directory is created on acquire.

  Args:
    directory: the directory to lock (str or path-like; created on acquire if missing).
    what: how messages name the directory (default ``"directory"``; fedco passes the
      argument's name, e.g. ``"checkpoint_dir"``).

  Attributes:
    directory: the absolute path of the locked directory.
    path: the absolute path of the lock file, ``<directory>/.lock``.
    what: as given.

  Raises:
    ValueError: (on acquire) another process holds the lock (the message names it), or
      the directory cannot be created or written.

  Examples:
    >>> import os
    >>> import tempfile
    >>> import fedco
    >>> with tempfile.TemporaryDirectory() as directory:
    ...   lock = fedco.io.DirectoryLock(os.path.join(directory, "run"), what="workdir")
    ...   with lock:
    ...     with fedco.io.DirectoryLock(lock.directory):  # nested in one process: shared
    ...       print(open(lock.path).read().strip())
    ...   print(open(lock.path).read().strip())
    held by pid ... since ...
    released by pid ... at ...
  """

  NAME = ".lock"
  _held: Dict[str, List[Any]] = {}  # path -> [open file, count] for the locks this process holds

  def __init__(self, directory, *, what: str = "directory"):
    self.directory = os.path.abspath(os.fspath(directory))
    self.path = os.path.join(self.directory, self.NAME)
    self.what = what
    self._file: Optional[IO[str]] = None

  def acquire(self) -> "DirectoryLock":
    """Takes the lock (creating the directory), or adds one holder in this process.

    Does not wait: a lock held by another process is an error at once.

    Returns:
      ``self``, so that ``lock = DirectoryLock(path).acquire()`` works.

    Raises:
      ValueError: another process holds the lock (the message names it), or the directory
        cannot be created or written.
    """
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
    """Drops this holder; the last holder in the process frees the lock (a no-op if not held)."""
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
