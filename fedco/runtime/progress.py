"""A dependency-free progress line: rounds done, rounds per second, the current objective."""

from __future__ import annotations

import sys
import time
from typing import Optional


class Progress:
  """Prints ``label [#####.....] 40/100 rounds  12.3 rounds/s  objective 0.4312``.

  On a terminal the line is redrawn in place; otherwise one line is printed per update.
  """

  def __init__(self, total: int, *, label: str = "", enabled: bool = True, stream=None):
    self.total, self.label, self.enabled = total, label, enabled
    self.stream = sys.stderr if stream is None else stream
    self.start = time.perf_counter()
    self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

  def update(self, done: int, metric: Optional[float] = None, name: str = "objective"):
    if not self.enabled:
      return
    elapsed = max(time.perf_counter() - self.start, 1e-9)
    width = 20
    filled = int(width * done / max(self.total, 1))
    line = (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} rounds"
            f"  {done / elapsed:.1f} rounds/s")
    if metric is not None:
      line += f"  {name} {metric:.5g}"
    if self._tty:
      self.stream.write("\r" + line)
    else:
      self.stream.write(line + "\n")
    self.stream.flush()

  def close(self):
    if self.enabled and self._tty:
      self.stream.write("\n")
      self.stream.flush()
