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

The first pytest process also times a small reference compile and reads the load, from which
``tests/helpers.py`` scales every subprocess limit of the tests (``FEDCO_TEST_TIMEOUT_SCALE``
replaces that scale), and the tests :data:`SMOKE` lists are marked ``smoke``:
``python -m pytest -m smoke`` runs them (decision 97).
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


# The reference compile behind the tests' subprocess limits (``tests.helpers.timeout_scale``,
# decision 97): a small scanned gradient, compiled three times without the compilation
# cache after a warm-up; prints the median seconds.
_REFERENCE_COMPILE = """
import statistics, time
import jax, jax.numpy as jnp
jax.config.update("jax_enable_compilation_cache", False)
jax.jit(lambda x: x + 1).lower(jnp.zeros(3)).compile()
def f(x, w, k):
  def body(c, _):
    c = jnp.tanh(c @ w) + k * jnp.sin(c)
    return c, jnp.sum(c)
  c, ys = jax.lax.scan(body, x, None, length=4)
  return jnp.sum(c) + jnp.sum(ys)
times = []
for k in (1.0, 2.0, 3.0):
  start = time.perf_counter()
  grad = jax.jit(jax.grad(lambda x, w: f(x, w, k), argnums=1))
  grad.lower(jnp.zeros((8, 8)), jnp.zeros((8, 8))).compile()
  times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def _probe(flags: str) -> "float | None":
  """Seconds of the reference compile in a subprocess with ``XLA_FLAGS=flags``; ``None``
  when it failed (this jaxlib's XLA aborts on an unknown flag, and a later jaxlib may drop
  one), ``inf`` when it ran past 300 s. Asked once, by the first pytest process."""
  try:
    probe = subprocess.run(
      [sys.executable, "-c", _REFERENCE_COMPILE],
      env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
  except subprocess.TimeoutExpired:
    return float("inf")
  try:
    return float(probe.stdout.split()[-1]) if probe.returncode == 0 else None
  except (IndexError, ValueError):
    return None


def _load() -> str:
  try:
    cores = len(os.sched_getaffinity(0))
  except AttributeError:
    cores = os.cpu_count() or 1
  try:
    return f"{os.getloadavg()[0]:.2f} {cores}"
  except OSError:
    return f"0 {cores}"


if "FEDCO_TESTS_XLA_FLAGS" not in os.environ:  # the workers inherit the answers
  given = os.environ.get("XLA_FLAGS", "")
  load = _load()  # before the probe's own load
  compile_s = None
  if "xla_cpu_use_fusion_emitters" not in given:
    compile_s = _probe(f"{given} {LEGACY_EMITTERS}".strip())
    if compile_s is not None and compile_s != float("inf"):
      os.environ["XLA_FLAGS"] = f"{given} {LEGACY_EMITTERS}".strip()
  if compile_s is None:
    compile_s = _probe(given)
  os.environ["FEDCO_TESTS_XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")
  os.environ["FEDCO_TESTS_SPEED"] = f"{compile_s if compile_s is not None else 0} {load}"


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

# The smoke subset, ``python -m pytest -m smoke`` (about 2 minutes on 2 cores; decision 97):
# one or a few fast tests per main area, each a real end-to-end check of its area, not the
# area's edge cases. Marked here rather than in the files, so the whole subset reads in one
# place; an entry without ``[...]`` marks every parameter. ``tests/test_subprocess_limits.py``
# checks that each entry names a test that exists.
SMOKE = (
  # transforms: the optax contract in a user's loop, the VJP oracle, a float64 transcription
  "tests/test_contract.py::test_readme_style_chain_with_schedule_converges",
  "tests/test_estimators.py::test_compositional_grad_equals_grad_of_composition_for_pytrees",
  "tests/test_transcriptions.py::test_comfedl",
  # simulate: the vmapped runtime against a per-client loop, determinism, the ledger
  "tests/test_runtime.py::test_same_seed_same_result_and_seeds_matter",
  "tests/test_runtime.py::test_ledger_counts_what_each_algorithm_sends",
  # streaming: the client store and a streamed run equal to the in-memory one
  "tests/test_streaming.py::test_store_round_trip_and_damage",
  "tests/test_streaming.py::test_a_streamed_run_of_many_clients_equals_the_in_memory_one",
  # sweeps: a grid of runs in one program against separate runs
  "tests/test_sweep.py::test_each_run_equals_its_separate_simulate_call",
  # privacy and compression: clipping on the uplink
  "tests/test_uplink.py::test_clipping_bounds_each_clients_delta",
  # checkpoint resume: SIGKILL mid-run, then resume bit for bit (a subprocess)
  "tests/test_checkpoint.py::test_sigkill_and_resume_is_bit_identical[comfedl]",
  # Ctrl-C: the driver stops with one line and exit 130 (a subprocess)
  "tests/test_interrupts.py::test_the_driver_stops_on_one_ctrl_c_with_one_line_and_exit_130",
  # experiment driver: the binary end to end, and a bad flag in one line
  "tests/test_experiments.py::test_e7_binary_runs",
  "tests/test_experiments.py::test_e7_binary_bad_flag_exits_cleanly",
  # data loaders: scikit-learn digits, LEAF and FedJAX SQLite files
  "tests/test_data.py::test_load_digits_shapes_range_and_split",
  "tests/test_natural_data.py::test_leaf_femnist_one_client_per_writer_in_file_order",
  "tests/test_natural_data.py::test_fedjax_emnist_clients_from_sqlite",
  # the contract kit on a user's algorithm
  "tests/test_testing_kit.py::test_the_cheap_checks_and_the_report",
  # the suite's own subprocess limits
  "tests/test_subprocess_limits.py::test_a_timeout_is_one_failure_naming_limit_variable_and_load",
)


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
  """Marks the :data:`SMOKE` tests ``smoke`` (before ``-m`` selects)."""
  smoke = set(SMOKE)
  for item in items:
    if item.nodeid in smoke or item.nodeid.split("[")[0] in smoke:
      item.add_marker(pytest.mark.smoke)


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
  scale = os.environ.get("FEDCO_TEST_TIMEOUT_SCALE")
  if scale is not None:  # checked here: one line, before any test (tests/helpers.py)
    try:
      ok = 0 < float(scale) < float("inf")
    except ValueError:
      ok = False
    if not ok:
      raise pytest.UsageError(
        "FEDCO_TEST_TIMEOUT_SCALE must be a positive number (a factor on every subprocess "
        f"limit of the tests, e.g. 3), got {scale!r}"
      )
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
