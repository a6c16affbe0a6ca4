"""Atomic file writes: a reader never sees a half-written file, even after a kill."""

from __future__ import annotations

import json
import os
import tempfile

TMP_PREFIX = ".tmp-"


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def atomic_write(path, data, *, mode: str = "w") -> None:
  """Write ``data`` (str, or bytes with ``mode="wb"``) to ``path`` atomically."""
  path = os.fspath(path)
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + os.path.basename(path) + ".",
                             dir=directory)
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


def atomic_write_json(path, value, *, indent: int = 2) -> None:
  """``json.dump(value)`` to ``path`` atomically (plain JSON values only)."""
  atomic_write(path, json.dumps(value, indent=indent) + "\n")
