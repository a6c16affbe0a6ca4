"""Where the test suite's XLA compilation time goes, by call site and by test (issue 29).

A pytest plugin plus a report. Each pytest process (each xdist worker) records every XLA
compilation through ``jax.monitoring`` (JAX's backend-compile event): its duration, the
compiled function's name, the innermost frame of this repository that asked for it, and the
test running. Programs compiled for one operation run eagerly (outside ``jax.jit``) are told
apart: many of them at a run's start cost seconds that one compiled program would not
(decision 84). Run the suite with an empty compilation cache, then the report::

  rm -rf /tmp/compile-cache /tmp/compile-profile
  FEDCO_COMPILE_PROFILE=/tmp/compile-profile JAX_COMPILATION_CACHE_DIR=/tmp/compile-cache \\
    python -m pytest -p benchmarks.compile_profile
  python -m benchmarks.compile_profile /tmp/compile-profile \\
    --out=benchmarks/results/compile_profile.json

The report prints the totals, the costliest call sites and test files, and writes them as
JSON with the machine. Compilations in subprocesses (the driver, multi-process tests) are
not seen.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import sys
import traceback

import jax

ROOT = str(pathlib.Path(__file__).resolve().parents[1]) + os.sep
EVENT = "/jax/core/compile/backend_compile_duration"
_current = {"test": "(collection)"}
_records: list = []


def _site(stack) -> str:
  for frame in reversed(stack):
    if frame.filename.startswith(ROOT) and not frame.filename.endswith("compile_profile.py"):
      return f"{frame.filename[len(ROOT) :]}:{frame.lineno} {frame.name}"
  return "(outside the repository)"


def _listener(event, duration, **kwargs):
  if event != EVENT:
    return
  stack = traceback.extract_stack()
  eager = any(f.name == "apply_primitive" for f in stack)
  _records.append((_current["test"], _site(stack), kwargs.get("fun_name", "?"), duration, eager))


def pytest_configure(config):
  if os.environ.get("FEDCO_COMPILE_PROFILE"):
    jax.monitoring.register_event_duration_secs_listener(_listener)


def pytest_runtest_logstart(nodeid, location):
  _current["test"] = nodeid


def pytest_sessionfinish(session):
  folder = os.environ.get("FEDCO_COMPILE_PROFILE")
  if folder and _records:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"process-{os.getpid()}.json")
    with open(path, "w") as f:
      json.dump(_records, f)


def report(folder: str, top: int = 25) -> dict:
  """The records of every process in ``folder``, summed by site and by test file."""
  records = []
  for path in sorted(pathlib.Path(folder).glob("process-*.json")):
    records += json.loads(path.read_text())
  if not records:
    raise FileNotFoundError(f"folder {folder!r} holds no process-*.json records")
  by_site, by_file, count = collections.Counter(), collections.Counter(), collections.Counter()
  for test, site, name, seconds, eager in records:
    key = f"{'eager ' if eager else ''}{name} @ {site}"
    by_site[key] += seconds
    count[key] += 1
    by_file[test.split("::")[0]] += seconds
  eager = sum(r[3] for r in records if r[4])
  from benchmarks import _common  # pylint: disable=g-import-not-at-top

  return {
    "machine": _common.machine_info(),
    "compilations": len(records),
    "seconds": round(sum(r[3] for r in records), 1),
    "eager_seconds": round(eager, 1),
    "sites": [
      {"site": k, "seconds": round(v, 2), "compilations": count[k]}
      for k, v in by_site.most_common(top)
    ],
    "test_files": [{"file": k, "seconds": round(v, 1)} for k, v in by_file.most_common(top)],
  }


def main(argv) -> None:
  usage = "usage: python -m benchmarks.compile_profile FOLDER [--out=FILE.json]"
  if len(argv) < 2 or any(not arg.startswith("--out=") for arg in argv[2:]):
    raise SystemExit(usage)
  try:
    result = report(argv[1])
  except FileNotFoundError as err:
    raise SystemExit(f"FileNotFoundError: {err}") from None
  print(
    f"{result['compilations']} compilations, {result['seconds']} s "
    f"({result['eager_seconds']} s for single operations run eagerly)"
  )
  for row in result["sites"]:
    print(f"{row['seconds']:8.1f} s {row['compilations']:5}  {row['site']}")
  for arg in argv[2:]:
    pathlib.Path(arg[len("--out=") :]).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
  main(sys.argv)
