"""Small shared fixtures for the test suite."""

import os
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest

import fedco


def portfolio_clients(sizes=(24, 8, 40), d=3, seed=0):
  """Per-client returns with different means, so clients are heterogeneous."""
  rng = np.random.default_rng(seed)
  return [
    (rng.normal(0.2 * (k + 1), 1.0, size=(n, d))).astype(np.float32) for k, n in enumerate(sizes)
  ]


def full_batch_args(problem, examples):
  """``(grad_h_fn, kwargs)`` for a deterministic full-batch oracle on one data set."""
  return fedco.oracle_args(problem, examples, examples, examples)


def as_np(tree):
  return (
    np.asarray(tree, np.float64)
    if not isinstance(tree, dict)
    else {k: np.asarray(v, np.float64) for k, v in tree.items()}
  )


def tanh_problem_data(sizes=(3, 5, 8), d=3, p=2, seed=0):
  rng = np.random.default_rng(seed)
  return [
    {
      "A": rng.normal(size=(n, p, d)).astype(np.float32),
      "c": rng.normal(size=(n, p)).astype(np.float32),
      "b": (0.3 * rng.normal(size=(n, d))).astype(np.float32),
    }
    for n in sizes
  ]


def zeros(d):
  return jnp.zeros((d,), jnp.float32)


def override(config, changes):
  """``config`` with ``changes`` (dotted keys, ``"methods.fedavg.q"``) applied, new fields
  allowed; returns ``config``."""
  with config.unlocked():
    for key, value in changes.items():
      *parents, last = key.split(".")
      node = config
      for part in parents:
        node = node[part]
      node[last] = value
  return config


# ---- heterogeneous least squares (SCAFFOLD, FedProx, adaptive servers) --------------------

LSQ_DIM = 4
LEAST_SQUARES = fedco.plain(lambda x, e: 0.5 * (e["a"] @ x - e["b"]) ** 2)


def least_squares_clients(sizes, *, spread=3.0, seed=0):
  """Per-client ``{a: [n, D], b: [n]}`` in float64, each client with its own optimum
  (``spread`` times a standard normal): far apart, so FedAvg's client drift shows."""
  rng = np.random.default_rng(seed)
  clients = []
  for n in sizes:
    a = rng.normal(size=(n, LSQ_DIM))
    x_star = spread * rng.normal(size=LSQ_DIM)
    clients.append({"a": a, "b": a @ x_star + 0.1 * rng.normal(size=n)})
  return clients


def least_squares_grad(client, x):
  """``grad h_i(x) = A^T (A x - b) / n`` in float64."""
  a, b = client["a"], client["b"]
  return a.T @ (a @ x - b) / a.shape[0]


def xla_flags(device_count):
  """This process's ``XLA_FLAGS`` (conftest.py's compile settings) for a subprocess, with
  ``--xla_force_host_platform_device_count=N`` in place of any device count, or without
  one when ``device_count`` is ``0``."""
  flags = [
    f
    for f in os.environ.get("XLA_FLAGS", "").split()
    if not f.startswith("--xla_force_host_platform_device_count")
  ]
  if device_count:
    flags.append(f"--xla_force_host_platform_device_count={device_count}")
  return " ".join(flags)


# ---- subprocess limits (decision 97) ------------------------------------------------------

TIMEOUT_SCALE_ENV = "FEDCO_TEST_TIMEOUT_SCALE"
# The root conftest.py's session-start measurement, "<compile seconds> <load> <cores>".
SPEED_ENV = "FEDCO_TESTS_SPEED"
# The median of conftest.py's three reference compiles on a quiet 2-core machine (an AMD
# EPYC VM at load below 2: 0.25-0.36 s): a machine that compiles it slower gets longer limits.
REFERENCE_COMPILE_S = 0.3
# A measured scale above this is taken as this, so that a hung subprocess still ends (the
# longest base limit, 600 s, becomes 80 min); the environment variable is not capped.
MAX_MEASURED_SCALE = 8.0


def _cores():
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def machine_load():
  """``"<1-minute load average> on <N> cores"`` now (``"unknown"`` where the system has none)."""
  try:
    return f"{os.getloadavg()[0]:.1f} on {_cores()} cores"
  except OSError:
    return "unknown"


def timeout_scale():
  """``(scale, why)``: what every subprocess limit of the suite is multiplied by.

  ``FEDCO_TEST_TIMEOUT_SCALE`` when set (any positive number, not capped); otherwise the
  slowdown conftest.py measured at the session's start, the larger of its reference compile
  against :data:`REFERENCE_COMPILE_S` and the load average per core, between 1 and
  :data:`MAX_MEASURED_SCALE`.
  """
  given = os.environ.get(TIMEOUT_SCALE_ENV)
  if given is not None:
    return check_timeout_scale(given), f"{TIMEOUT_SCALE_ENV}={given}"
  try:
    compile_s, load, cores = (float(v) for v in os.environ[SPEED_ENV].split())
  except (KeyError, ValueError):
    return 1.0, "no session-start measurement"
  slowdown = max(compile_s / REFERENCE_COMPILE_S, load / max(cores, 1.0))
  scale = min(max(1.0, slowdown), MAX_MEASURED_SCALE)
  why = (
    f"measured at the session's start: a reference compile of {compile_s:.2f} s "
    f"(quiet: {REFERENCE_COMPILE_S} s), load {load:.1f} on {cores:.0f} cores"
  )
  return scale, why


def check_timeout_scale(value):
  """``FEDCO_TEST_TIMEOUT_SCALE``'s value as a float; a one-line ``ValueError`` otherwise."""
  try:
    scale = float(value)
  except ValueError:
    scale = float("nan")
  if not 0 < scale < float("inf"):
    raise ValueError(
      f"{TIMEOUT_SCALE_ENV} must be a positive number (a factor on every subprocess "
      f"limit of the tests, e.g. 3), got {value!r}"
    )
  return scale


def limit_s(base_s):
  """The limit for a subprocess step that takes well under ``base_s`` seconds on a quiet
  2-core machine: ``base_s`` times :func:`timeout_scale`."""
  return base_s * timeout_scale()[0]


def timeout_message(what, base_s):
  """One line: ``what`` timed out, after how long, why that limit, how to raise it, and the
  machine's load now."""
  scale, why = timeout_scale()
  return (
    f"{what} timed out after {base_s * scale:.0f} s ({base_s:g} s x {scale:.2f}, {why}; "
    f"set {TIMEOUT_SCALE_ENV} to raise it); machine load now {machine_load()}"
  )


def timed_out(what, base_s):
  """Fails the running test with :func:`timeout_message` (no traceback)."""
  pytest.fail(timeout_message(what, base_s), pytrace=False)


def _name(args):
  command = args[0] if args else "subprocess"
  return " ".join(str(a) for a in command) if isinstance(command, (list, tuple)) else command


def run(*args, timeout, **kwargs):
  """``subprocess.run`` with ``timeout`` (a quiet machine's limit, seconds) scaled by
  :func:`limit_s`; a timeout fails the test naming the command and the limit."""
  try:
    return subprocess.run(*args, timeout=limit_s(timeout), **kwargs)
  except subprocess.TimeoutExpired:  # subprocess.run killed and reaped the child
    timed_out(f"`{_name(args)}`"[:300], timeout)


def wait(proc, timeout):
  """``proc.wait`` under a scaled limit; a timeout kills ``proc`` and fails the test."""
  try:
    return proc.wait(timeout=limit_s(timeout))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()
    timed_out(f"`{_name([proc.args])}`"[:300], timeout)


def communicate(proc, timeout, *, input=None):  # noqa: A002 (Popen's own name)
  """``proc.communicate`` under a scaled limit; a timeout kills ``proc`` and fails the test."""
  try:
    return proc.communicate(input=input, timeout=limit_s(timeout))
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.communicate()
    timed_out(f"`{_name([proc.args])}`"[:300], timeout)


def run_shared(*args, timeout, **kwargs):
  """:func:`run` for a module fixture: a :class:`Shared` of the ``CompletedProcess``, or of
  why it failed (a timeout, or a non-zero exit with its stderr's tail), which each test that
  uses it reports as its own failure."""
  name = f"`{_name(args)}`"[:300]
  try:
    out = subprocess.run(*args, timeout=limit_s(timeout), **kwargs)
  except subprocess.TimeoutExpired:
    return Shared(failure=timeout_message(name, timeout))
  if out.returncode != 0:
    tail = out.stderr[-3000:] if isinstance(out.stderr, str) else ""
    return Shared(failure=f"{name} exited with {out.returncode}", details=tail)
  return Shared(out)


def deadline(timeout):
  """``time.monotonic()`` at which a wait loop for a quiet machine's ``timeout`` seconds
  gives up (see :func:`limit_s`)."""
  return time.monotonic() + limit_s(timeout)


class Shared:
  """What a module fixture's subprocesses produced, or why they failed: each test that
  uses it calls :meth:`get`, which fails that test (with the reason, no traceback) instead
  of the fixture erroring every dependent test. ``details`` (logs) go with the first
  failure only."""

  def __init__(self, value=None, failure=None, details=""):
    self.value, self.failure, self.details = value, failure, details
    self._reported = False

  def get(self):
    if self.failure is not None:
      more = f"\n{self.details}" if not self._reported else " (logs: the first such failure)"
      self._reported = True
      pytest.fail(self.failure + more, pytrace=False)
    return self.value
