r"""The experiment driver's command line (the flax examples' convention): a config file, overrides.

An experiment binary is a few lines (this repository's is ``experiments/main.py``)::

    import os

    from fedco.experiment import cli

    if __name__ == "__main__":
      cli.run(config_dir=os.path.join(os.path.dirname(__file__), "configs"))

or no binary at all (``python -m fedco.experiment.cli --config=<file> --workdir=<dir>``).
This repository's::

    python -m experiments.main --config=experiments/configs/dro_fl.py --workdir=runs/e1

The config names its experiment (``config.experiment``), which
:func:`fedco.experiment.runner.train_and_evaluate` runs. Every config field can be
overridden with ``--config.<field>=...`` (nested: ``--config.methods.qfedavg.q=1``; every
method's ``learning_rate`` and ``local_steps`` too). The flags below decide how a run goes,
never its numbers: rerunning a command resumes its runs from their checkpoints in
``--workdir`` (``--noresume`` starts them over). Bad input ends with one ``error: ...`` line
and exit status 1. Ctrl-C stops after the running chunk of rounds (its rows and a checkpoint
written) with one line and exit status 130; a second Ctrl-C ends the process at once.

Importing this module defines absl flags (``--config``, ``--workdir``, ...): import it from a
main module only, never from a library.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import logging
import os
import platform
import re
import signal
import sys
import sysconfig
import traceback
import warnings
from typing import List, Optional

import jax
import ml_collections
from absl import app, flags
from ml_collections import config_flags

import fedco
from fedco import _startup, extend
from fedco.experiment import outputs, runner

# The command line ml_collections reads its overrides from: the one parse_flags parses
# (filled there; empty while flags are defined, so nothing is read at import).
_ARGV: list = []
_CONFIG = config_flags.DEFINE_config_file(
  "config",
  None,
  "An experiment config file (a .py with get_config()); override any of its fields with "
  "--config.<field>=<value> (nested: --config.methods.<label>.learning_rate=0.1).",
  lock_config=True,
  sys_argv=_ARGV,
)
flags.DEFINE_string("workdir", None, "Output directory (created if missing).")
flags.DEFINE_bool(
  "progress",
  True,
  "Show a progress bar per run and print the final table (--noprogress: neither; runs that "
  "diverged are still said).",
)
flags.DEFINE_bool(
  "resume",
  True,
  "Resume runs from their checkpoints in --workdir (rerunning "
  "a command continues it); --noresume deletes them and starts over.",
)
flags.DEFINE_integer("checkpoint_every", 50, "Rounds between checkpoints of each run.")
flags.DEFINE_bool(
  "seeds_together",
  True,
  "Run a method's seeds as one vmapped program where "
  "the experiment allows it (--noseeds_together: one run at a time, less "
  "memory).",
)
flags.DEFINE_list("methods", [], "Run only these labels of config.methods (default: all).")


def _default_cache() -> str:
  """``~/.cache/fedco/jax/<this CPU>``: XLA compiles for the CPU it runs on, and JAX's cache
  keys do not name the CPU model, so machines that share a home keep separate folders."""
  try:
    with open("/proc/cpuinfo") as f:
      cpu = "".join(l for l in f if l.startswith(("model name", "flags")))
  except OSError:
    cpu = platform.processor()
  tag = hashlib.sha256(cpu.encode()).hexdigest()[:12]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return os.path.join(base, "fedco", "jax", f"{platform.machine()}-{tag}")


flags.DEFINE_string(
  "compilation_cache",
  _default_cache(),
  "Folder of JAX's persistent compilation cache: a program compiled once "
  "(a method's, for every seed; a rerun's) is loaded from it instead of "
  "compiled again. Delete the folder to clear it; '' turns it off.",
)
FLAGS = flags.FLAGS

# The folder of the binary's config files, listed when --config names no file (run() sets it).
CONFIG_DIR: Optional[str] = None


def run(config_dir: Optional[str] = None) -> None:
  """Parses the command line and runs its experiment.

  Args:
    config_dir: the folder of the binary's config files, listed when ``--config`` names no
      file (a relative path is taken from the current directory: pass one built from
      ``__file__`` to be independent of it).
  """
  global CONFIG_DIR
  CONFIG_DIR = os.path.abspath(config_dir) if config_dir else None
  for flag in FLAGS.get_flags_for_module(__name__):  # --help lists them as the binary's
    FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  _startup.begin()  # until main starts, a Ctrl-C is one line and exit status 130
  try:
    app.run(main, flags_parser=parse_flags)
  finally:
    _startup.end()


def _available() -> str:
  if not CONFIG_DIR or not os.path.isdir(CONFIG_DIR):
    return ""
  names = sorted(n for n in os.listdir(CONFIG_DIR) if n.endswith(".py") and n[0] != "_")
  return f"; available in {os.path.relpath(CONFIG_DIR)}/: {', '.join(names)}"


def main(argv):
  del argv
  _startup.end()  # started: Ctrl-C is Python's KeyboardInterrupt, handled below
  outputs.quiet_logs()
  if not sys.warnoptions:  # -W / PYTHONWARNINGS decide otherwise
    for category in (UserWarning, RuntimeWarning):  # fedco's: once a run, as one line
      warnings.filterwarnings("once", category=category)
  warnings.formatwarning = _format_warning
  _quiet_failed_writes()
  config = None
  try:
    if FLAGS.compilation_cache:  # before anything compiles
      cache = os.path.expanduser(FLAGS.compilation_cache)
      try:
        os.makedirs(cache, exist_ok=True)
      except OSError as err:
        raise ValueError(
          f"--compilation_cache={FLAGS.compilation_cache!r} cannot be used "
          f"({err.strerror}); name a writable folder, or '' to turn it "
          "off"
        ) from None
      jax.config.update("jax_compilation_cache_dir", cache)
    else:  # '' turns it off, also where JAX_COMPILATION_CACHE_DIR names a folder
      jax.config.update("jax_compilation_cache_dir", None)
    try:
      config = _CONFIG.value
    except (OSError, ValueError) as err:  # ml_collections loads the file lazily
      if isinstance(err, ValueError):
        raise ValueError(f"--config: {err}") from None
      raise FileNotFoundError(
        f"--config={FLAGS['config'].config_filename!r} is not a config file{_available()}"
      ) from None
    if config is None:
      raise ValueError(f"--config must name a config file (a .py with get_config()){_available()}")
    if not isinstance(config, ml_collections.ConfigDict):
      raise ValueError(
        f"--config={FLAGS['config'].config_filename!r}: get_config() must return an "
        f"ml_collections.ConfigDict, got a {type(config).__name__}; return "
        "ml_collections.ConfigDict({...})"
      )
    select(config, FLAGS.methods)
    options = runner.Options(
      progress=FLAGS.progress,
      resume=FLAGS.resume,
      seeds_together=FLAGS.seeds_together,
      checkpoint_every=extend.positive_int("--checkpoint_every", FLAGS.checkpoint_every),
      command=outputs.command_line(),
    )
    # After the guard (a run stopped), a Ctrl-C ends the process at once: the guard restores
    # this default disposition, so no Ctrl-C can land in Python's handler on the way out.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    with fedco.runtime.interrupt_guard():  # one Ctrl-C stops the loop of runs, once
      runner.train_and_evaluate(config, FLAGS.workdir, options)
  except KeyboardInterrupt as err:  # fedco.runtime.Interrupted, or Ctrl-C outside a run
    # Stopping (also before the guard): another Ctrl-C, while this prints or JAX's objects
    # are freed at exit, ends the process at once, as an unhandled one does, no traceback.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    print(interrupted_line(err, FLAGS.workdir), file=sys.stderr)
    sys.exit(130)
  except Exception as err:  # pylint: disable=broad-except
    line = error_line(err, config)
    if line is None:  # a bug: the whole traceback
      raise
    print(f"error: {line}", file=sys.stderr, flush=True)
    sys.exit(1)


def error_line(err: Exception, config=None) -> Optional[str]:
  """The one ``error:`` line of a failed run: bad input (a ``ValueError`` or
  ``FileNotFoundError``, with where a module raised it), a full disk (naming the flag of its
  folder), a package the experiment needs that is not installed, an import that fails in the
  experiment's own code (naming its file and line); ``None`` for anything else (a bug, shown
  with its traceback: an ``ImportError`` raised in fedco's own code too)."""
  full = disk_full(err)
  if full is not None:
    return full
  if isinstance(err, ImportError):
    experiment = config.get("experiment") if isinstance(config, ml_collections.ConfigDict) else None
    named = f"--config.experiment={experiment!r}" if experiment else "the run"
    missing = not_installed(err)
    if missing is not None:
      return (
        f"{named} needs a package that is not installed: {err.msg}{raised_at(err)}; "
        f"install it (pip install {missing}), or run an experiment that does not use it"
      )
    where = raised_at(err)
    if not where or _raised_in_fedco(err):  # fedco's own import failed: a bug
      return None
    return f"{named} failed to import: {err}{where}"
  if isinstance(err, (ValueError, FileNotFoundError)):
    return f"{err}{raised_at(err)}"
  return None


def not_installed(err: ImportError) -> Optional[str]:
  """The top-level package ``err`` says is missing, where it really is absent (a
  ``ModuleNotFoundError`` for a package that cannot be found); ``None`` for any other import
  error (a module missing inside an installed package, one that fails as it imports)."""
  name = getattr(err, "name", None) if isinstance(err, ModuleNotFoundError) else None
  if not name:
    return None
  top = name.split(".")[0]
  try:
    found = importlib.util.find_spec(top)
  except (ImportError, ValueError):  # a module without a spec: it is there
    return None
  return top if found is None else None


def _raised_in_fedco(err: BaseException) -> bool:
  """Whether the innermost frame of ``err``'s traceback is in fedco's own code."""
  frames = traceback.extract_tb(err.__traceback__)
  if not frames:
    return False
  package = os.path.join(os.path.realpath(os.path.dirname(fedco.__file__)), "")
  return os.path.realpath(frames[-1].filename).startswith(package)


class _NoSpaceEcho(logging.Filter):
  """Drops the log records and unraisable errors a full disk causes in orbax's background
  writers (each failed write logged with its traceback, then "Event loop is closed" from
  the writes still under way: 284 lines for one full disk): the run's own error says it in
  one line (:func:`disk_full`)."""

  seen = False

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage() + (repr(record.exc_info[1]) if record.exc_info else "")
    if NO_SPACE.search(text):
      _NoSpaceEcho.seen = True
      return False
    return True

  @staticmethod
  def unraisable(hook):
    def unraisable(info):
      echo = isinstance(info.exc_value, RuntimeError) and "Event loop is closed" in str(
        info.exc_value
      )
      if not (echo and _NoSpaceEcho.seen):
        hook(info)

    return unraisable


def _quiet_failed_writes() -> None:
  """Installs :class:`_NoSpaceEcho` on the root logger's handlers (absl's, which asyncio's
  and orbax's records reach) and around ``sys.unraisablehook``, once."""
  if any(isinstance(f, _NoSpaceEcho) for h in logging.getLogger().handlers for f in h.filters):
    return
  for handler in logging.getLogger().handlers:
    handler.addFilter(_NoSpaceEcho())
  sys.unraisablehook = _NoSpaceEcho.unraisable(sys.unraisablehook)


NO_SPACE = re.compile(r"No space left on device|Disk quota exceeded|os_error_code='(28|122)'")
_WRITING = re.compile(r'(?:Failed writing|writing|file): "([^"]+)"')


def disk_full(err: Optional[BaseException]) -> Optional[str]:
  """The one line for a write that failed because the disk is full (an ``OSError`` with
  ``ENOSPC``/``EDQUOT`` from fedco's writers, or orbax's ``RESOURCE_EXHAUSTED`` error from a
  checkpoint), naming the flag whose folder it was; ``None`` for any other error."""
  seen, path = set(), None
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
      path = err.filename
      break
    if NO_SPACE.search(str(err)):
      found = _WRITING.search(str(err))
      path = found.group(1) if found else None
      break
    err = err.__cause__ or err.__context__
  else:
    return None
  where = None
  for flag in ("workdir", "compilation_cache"):
    folder = FLAGS[flag].value if flag in FLAGS else None
    if (
      folder
      and path
      and os.path.abspath(path).startswith(
        os.path.join(os.path.abspath(os.path.expanduser(folder)), "")
      )
    ):
      where = f"--{flag}={folder!r}"
      break
  where = where or (f"--workdir={FLAGS.workdir!r}" if "workdir" in FLAGS else "the output")
  wrote = f" (writing {os.fspath(path)})" if path else ""
  return (
    f"{where}: no space left on its device{wrote}; free space there or use a folder on "
    "another disk (rerunning the command resumes from the last complete checkpoint; "
    "results already complete are kept)"
  )


def raised_at(err) -> str:
  """``" (raised at FILE:LINE, in FUNCTION)"``: where in the experiment's own code ``err``
  came from (the innermost frame outside fedco, the standard library and installed
  packages), for an error whose message names no flag: bad input names the ``--flag`` to
  change, so an error that names none is most likely a bug in a module's code to find
  (``''`` otherwise, or where no such frame exists)."""
  if "--" in str(err) or isinstance(err, FileNotFoundError):  # bad input: said in full
    return ""
  paths = sysconfig.get_paths()
  skipped = tuple(
    os.path.join(os.path.realpath(p), "")
    for p in (os.path.dirname(fedco.__file__), paths["stdlib"], paths["purelib"], paths["platlib"])
  )
  frames = [
    f
    for f in traceback.extract_tb(err.__traceback__)
    if not os.path.realpath(f.filename).startswith(skipped)
  ]
  if not frames:
    return ""
  frame = frames[-1]
  try:
    name = os.path.relpath(frame.filename)
  except (ValueError, OSError):  # no file name, or no current directory
    name = frame.filename or "?"
  name = frame.filename if name.startswith("..") else name  # outside: the whole path
  return f" (raised at {name}:{frame.lineno}, in {frame.name})"


def interrupted_line(err, workdir=None) -> str:
  """The one line a stopped run prints: what was written, as the workdir holds it (a run
  cannot say it for the runs before it: those that diverged wrote no rows past their
  divergence), and how to go on."""
  what = str(err) if isinstance(err, fedco.runtime.Interrupted) else "interrupted"
  if isinstance(err, fedco.runtime.Interrupted) and workdir:
    for claim in (": the metrics of rounds ", ": nothing is lost"):  # the run's own words
      head, said, _ = what.rpartition(claim)
      if said:
        what = f"{head}: {written(workdir)}"
        break
  return f"{what}; rerun the same command to resume (finished runs and checkpoints are kept)"


def written(workdir) -> str:
  """What a stopped run's workdir holds: its rows so far and its runs' checkpoints."""
  path = os.path.join(workdir, outputs.STAGING, outputs.METRICS)
  try:
    found = [r.get("round") for r in outputs.read_jsonl(path, partial_last=True)]
  except (OSError, ValueError):
    found = []
  rounds: List[int] = [r for r in found if isinstance(r, int)]
  rows = (
    f"{outputs.STAGING}/{outputs.METRICS} holds {len(rounds)} rows up to round {max(rounds)}"
    if rounds
    else "no metrics rows are written (runs that diverge write none past their divergence)"
  )
  folder = os.path.join(workdir, outputs.CHECKPOINTS)
  runs = [
    n
    for n in (os.listdir(folder) if os.path.isdir(folder) else ())
    if os.path.isdir(os.path.join(folder, n))
    and any(s.isdigit() for s in os.listdir(os.path.join(folder, n)))
  ]
  kept = f"checkpoints of {len(runs)} run{'s' * (len(runs) != 1)}" if runs else "no checkpoint"
  return f"{rows}; {kept} in {outputs.CHECKPOINTS}/"


def select(config, labels) -> None:
  """Keep only the methods ``labels`` (``--methods``) of ``config.methods``."""
  if not labels:
    return
  unknown = [label for label in labels if label not in config.methods]
  if unknown:
    raise ValueError(
      f"--methods: {unknown} are not in config.methods; allowed: {', '.join(config.methods)}"
    )
  with config.unlocked():
    for label in list(config.methods):
      if label not in labels:
        del config.methods[label]


_default_format_warning = warnings.formatwarning


def _format_warning(message, category, *args, **kwargs):
  if issubclass(category, (UserWarning, RuntimeWarning)):
    return f"warning: {message}\n"
  return _default_format_warning(message, category, *args, **kwargs)


class _Unusable(Exception):
  """A ``--flagfile`` or ``--config`` that names no file of its kind (one ``error:`` line)."""


CONFIG_FLAG = re.compile(r"--?config(?:=(.*))?", re.S)


def _values(argv, pattern):
  """The values ``argv`` gives the flag ``pattern`` matches (``--f=v`` or ``--f v``)."""
  out, i = [], 1
  while i < len(argv) and argv[i] != "--":
    match = pattern.fullmatch(argv[i])
    if match:
      if match.group(1) is None:
        i += 1
        out.append(argv[i] if i < len(argv) else "")
      else:
        out.append(match.group(1))
    i += 1
  return out


def _flagfile_error(path, reason) -> _Unusable:
  return _Unusable(
    f"--flagfile={path!r} cannot be read ({reason}); it must name a readable "
    "file of flags, one per line"
  )


def _not_a_config(path, why: str = "") -> _Unusable:
  return _Unusable(f"--config={path!r} is not a config file{why}{_available()}")


def _config_file(argv):
  """The file the last ``--config`` of ``argv`` names (``None`` without one): a ``.py`` file,
  or :class:`_Unusable` (ml_collections would load anything as Python, with a traceback)."""
  values = _values(argv, CONFIG_FLAG)
  if not values:
    return None
  path, _, mode = values[-1].partition(":")
  if not (path.endswith(".py") and os.path.isfile(path)):
    raise _not_a_config(path)
  if mode:  # the old "dro_fl.py:grid": variants are files now
    raise _not_a_config(values[-1], f" (variants are files: {path[:-3]}_{mode}.py)")
  return path


def parse_flags(argv):
  """absl's parsing, with a bad ``--config.<field>`` override as one ``error:`` line (an
  unknown field, a value of the wrong type) instead of ml_collections' traceback. A
  ``--flagfile`` that cannot be read, a ``--config`` that names no config file or one that
  fails to load are one ``error:`` line too."""
  rest, config_file = [], None
  try:
    rest = FLAGS.read_flags_from_files(argv, force_gnu=False)
    config_file = _config_file(rest)
    _ARGV[:] = argv
    return FLAGS(argv)
  except _Unusable as err:
    print(f"error: {err}", file=sys.stderr)
  except flags.CantOpenFlagFileError as err:  # one named inside a flag file
    text = " ".join(str(err).split()).removeprefix("ERROR:: ")
    match = re.search(r"\[Errno \d+\] ([^:]+): '(.*)'$", text)
    print(f"error: {_flagfile_error(*match.group(2, 1)) if match else text}", file=sys.stderr)
  except flags.Error as err:
    lines = [l for l in str(err).strip().splitlines() if l.strip()]
    if len(lines) > 1:  # a config file that raised: its own last line, not the traceback
      lines = [f"--config: {lines[-1].split(': ', 1)[-1]}"]
    print(f"error: {lines[0]} (see --help)", file=sys.stderr)
  except (AttributeError, KeyError, TypeError, ValueError) as err:
    if isinstance(err, AttributeError) and "'get_config'" in str(err) and config_file:
      print(
        f"error: {_not_a_config(config_file, ' (it defines no get_config())')}", file=sys.stderr
      )
      sys.exit(1)
    while err.args and isinstance(err.args[0], Exception):  # AttributeError(KeyError(...))
      err = err.args[0]
    text = f"no field {err.args[0]}" if isinstance(err, KeyError) and err.args else err
    text = " ".join(str(text).split())  # one line (ml_collections adds "Did you mean ...")
    text = text.replace("' Did you mean", "'; did you mean")
    overrides = [a.split("=")[0] for a in rest[1:] if a.startswith("--config.")]
    named = re.search(r"'([^']+)'", text)  # the missing field, where the message names it
    bad = [o for o in overrides if named and named.group(1) in o.split(".")] or overrides
    print(
      f"error: cannot apply {', '.join(bad) or '--config'}: {text} (a config override "
      "must name an existing field, with a value of its type)",
      file=sys.stderr,
    )
  except Exception as err:  # pylint: disable=broad-except  # the config file's own code
    if config_file is None:
      raise
    lines = [l for l in str(err).splitlines() if l.strip()] or [""]
    print(
      f"error: --config={config_file!r} cannot be loaded: {type(err).__name__}: {lines[0].strip()}",
      file=sys.stderr,
    )
  sys.exit(1)


if __name__ == "__main__":  # python -m fedco.experiment.cli --config=... (no binary of your own)
  run()
