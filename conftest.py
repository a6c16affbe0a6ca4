"""pytest defaults for this repository.

The suite runs on two pytest-xdist workers, each test module on one worker (``--dist
loadfile``: module fixtures and shared compiled runs stay in one process), unless the
command line decides otherwise: ``-n0`` or ``-p no:xdist`` runs in this process (a subset,
a debugger), ``-n 4`` on four workers. Set here rather than in ``setup.cfg``'s ``addopts``,
where ``-n 2`` would make ``-p no:xdist`` an error.

Compilation dominates the suite (hundreds of small programs), so the tests compile with
JAX's ``jax_disable_most_optimizations`` (XLA and LLVM skip their expensive passes: the
programs are tiny, the compilation is not) and share JAX's persistent compilation cache, in
a folder per CPU model (XLA compiles for the CPU it runs on) under ``~/.cache/fedco/``: a
program compiled by one test, worker or subprocess is loaded by the others, and by the next
run. Both are set in the environment, so subprocesses (the driver, multi-process workers)
inherit them; set ``JAX_DISABLE_MOST_OPTIMIZATIONS=0`` or ``JAX_COMPILATION_CACHE_DIR`` to
choose otherwise (decision 80). A test module that sets ``COMPILE_OPTIMIZED = True`` compiles
with XLA's optimizations (its subprocesses too): XLA's CPU backend at optimization level 0
miscompiles the backward pass of the im2col convolutions into NaNs (the same program is
finite op by op and when optimized), so the modules that train convolutional models opt
out, and so does a test marked ``@pytest.mark.compile_optimized`` (or a parameter with that
mark) in a module that does not.
"""

import contextlib
import hashlib
import os
import pathlib
import platform
import subprocess
import sys

import pytest
from _pytest import doctest

WORKERS = 2


def _cache_dir() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      cpu = "".join(line for line in f if line.startswith(("model name", "flags")))
  except OSError:
    cpu = platform.processor()
  tag = hashlib.sha256(cpu.encode()).hexdigest()[:12]
  base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser(os.path.join("~", ".cache"))
  return os.path.join(base, "fedco", "jax-tests", f"{platform.machine()}-{tag}")


os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache_dir())
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA:CPU's legacy emitters in place of its MLIR fusion emitters: a quarter less compilation
# time (decision 85). Appended to ``XLA_FLAGS`` (here and in subprocesses; a value already
# there wins); ``tests.helpers.xla_flags`` keeps it where a subprocess sets a device count.
LEGACY_EMITTERS = "--xla_cpu_use_fusion_emitters=false"


def _xla_knows(flag: str) -> bool:
  """Whether this jaxlib's XLA accepts ``flag`` (it aborts on an unknown one, and a later
  jaxlib may drop this one): asked once, in a subprocess, by the first pytest process."""
  probe = subprocess.run(
    [sys.executable, "-c", "import jax; jax.devices()"],
    env={**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"},
    capture_output=True,
    timeout=300,
    check=False,
  )
  return probe.returncode == 0


if "FEDCO_TESTS_XLA_FLAGS" not in os.environ:  # the workers inherit the answer
  given = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_use_fusion_emitters" not in given and _xla_knows(LEGACY_EMITTERS):
    os.environ["XLA_FLAGS"] = f"{given} {LEGACY_EMITTERS}".strip()
  os.environ["FEDCO_TESTS_XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
  if (
    not config.pluginmanager.hasplugin("xdist")
    or hasattr(config, "workerinput")
    or config.option.numprocesses is not None
    or config.getoption("usepdb", False)
  ):
    return
  config.option.numprocesses = WORKERS
  if config.option.dist == "no":
    config.option.dist = "loadfile"


_FEDCO = pathlib.Path(__file__).parent / "fedco"


@contextlib.contextmanager
def _optimized():
  """XLA's optimizations on (here and in subprocesses) inside the block."""
  import jax  # pylint: disable=g-import-not-at-top

  name = "JAX_DISABLE_MOST_OPTIMIZATIONS"
  env, flag = os.environ.get(name), jax.config.values["jax_disable_most_optimizations"]
  os.environ[name] = "0"
  jax.config.update("jax_disable_most_optimizations", False)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", flag)
    if env is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = env


def pytest_configure(config):
  config.addinivalue_line(
    "markers", "compile_optimized: this test compiles with XLA's optimizations (conftest.py)"
  )


@pytest.fixture(autouse=True, scope="module")
def _compile_mode(request):
  """Optimized compilation for a module with ``COMPILE_OPTIMIZED = True`` (see above)."""
  if not getattr(request.module, "COMPILE_OPTIMIZED", False):
    yield
    return
  with _optimized():
    yield


@pytest.fixture(autouse=True)
def _compile_mode_of_test(request):
  """Optimized compilation for one test (or parameter) marked ``compile_optimized``, in a
  module whose other tests compile unoptimized."""
  if request.node.get_closest_marker("compile_optimized") is None:
    yield
    return
  with _optimized():
    yield


def pytest_collect_file(file_path, parent):
  """Collects the examples in ``fedco/``'s docstrings as doctests (``testpaths`` names it).

  Only the library's modules: ``--doctest-modules`` would also import every helper under
  ``tests/`` (some set ``XLA_FLAGS`` when imported).
  """
  if file_path.suffix == ".py" and _FEDCO in file_path.parents:
    return doctest.DoctestModule.from_parent(parent, path=file_path)
  return None
