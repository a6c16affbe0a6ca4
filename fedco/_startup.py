"""Ctrl-C while a fedco command starts: one line and exit status 130, never a traceback.

``python -m fedco.experiment.cli`` (and every ``python -m fedco.<module>``) spends seconds
importing JAX, flax and orbax before any of its own code runs; a Ctrl-C there raised
``KeyboardInterrupt`` inside some import and printed a 20-frame traceback. This module is
the first thing ``import fedco`` runs: under ``python -m fedco.<module>`` it installs a
SIGINT handler that writes one line and ends the process with exit status 130 (nothing has
been written yet, so there is nothing to finish); the command's ``main`` calls :func:`end`
when it starts, giving Ctrl-C back to the handler it had (decision 98). Only Python's
default handler is replaced: Ctrl-C ignored (a background job) or a user's own handler
stays. A library import (a script or notebook importing fedco) is left alone. Imports
nothing heavy: it runs before JAX loads.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Optional

LINE = b"interrupted while starting, before anything ran; nothing was written\n"


def _stop(signum, frame) -> None:
  """The start-up's SIGINT handler: the line, and exit status 130 at once."""
  del signum, frame
  os.write(2, LINE)
  os._exit(130)  # nothing to flush or finish: no output exists yet


# The SIGINT handler begin() replaced, restored by end(); None while begin()'s is not installed.
_previous = None


def begin() -> None:
  """Ctrl-C from now until :func:`end` is one line and exit status 130 (main thread only).

  Only where Ctrl-C has Python's default handler (``KeyboardInterrupt``): a handler the user
  installed, or Ctrl-C ignored (``SIG_IGN``, as a shell starts a background job ``cmd &``),
  is left in place. A second call while its handler is installed changes nothing.
  """
  global _previous
  if (
    threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is signal.default_int_handler
  ):
    _previous = signal.signal(signal.SIGINT, _stop)


def hand_over(handler, previous) -> None:
  """A start-up handler of the caller's own (``experiments/main.py``'s, installed before
  fedco could be imported, in place of ``previous``) replaced by :func:`begin`'s, at once:
  :func:`end` restores ``previous``. Nothing changes if ``handler`` is not the one installed
  (the caller left Ctrl-C as it was: ignored, or a user's handler).
  """
  global _previous
  if (
    threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is handler
  ):
    signal.signal(signal.SIGINT, _stop)  # both end the process: no moment without either
    _previous = previous


def end() -> None:
  """The command has started: Ctrl-C has the handler it had before :func:`begin` again (if
  :func:`begin`'s handler is the one installed; any other is left as it is).

  Examples:
    >>> import signal
    >>> from fedco import _startup
    >>> before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job
    >>> _startup.begin(); signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    True
    >>> _startup.end(); signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    True
    >>> _ = signal.signal(signal.SIGINT, before)
  """
  global _previous
  if (
    threading.current_thread() is threading.main_thread()
    and signal.getsignal(signal.SIGINT) is _stop
  ):
    signal.signal(signal.SIGINT, _previous)
    _previous = None


def command(argv=None) -> Optional[str]:
  """The module ``python -m <module>`` runs (``None`` for a script, ``-c`` or a REPL)."""
  argv = list(getattr(sys, "orig_argv", ()) if argv is None else argv)
  i = 1
  while i < len(argv):
    arg = argv[i]
    if arg == "-m":
      return argv[i + 1] if i + 1 < len(argv) else None
    if arg.startswith("-m"):  # -mfedco.experiment.cli
      return arg[2:]
    if arg in ("-c", "-") or not arg.startswith("-"):  # a command, stdin or a script
      return None
    i += 2 if arg in ("-W", "-X", "--check-hash-based-pycs") else 1  # those take a value
  return None


_module = command()
if _module is not None and _module.startswith("fedco.") and sys.argv[:1] == ["-m"]:
  begin()  # the module is still being located: its packages are importing
