"""Small shared fixtures for the test suite."""

import os
import pathlib
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest

import fedco

ROOT = pathlib.Path(__file__).resolve().parents[1]  # the checkout
# The shipped real data beside the checkout (``../shared/data``); tests that read it skip when
# it is absent.
SHARED_DATA = ROOT.parent / "shared" / "data"


def docs_program(name: str):
  """The module of ``docs/<name>.py`` (a script there, not a package), loaded once."""
  import importlib.util
  import sys

  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
  return sys.modules[name]


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


def _load_scale():
  """The 1-minute load average per core now (``0`` where the system has none)."""
  try:
    return os.getloadavg()[0] / _cores()
  except OSError:
    return 0.0


def current_scale():
  """``(scale, why)`` for a limit checked now: :func:`timeout_scale`, or the load per core
  now where that is larger (up to :data:`MAX_MEASURED_SCALE`): load that came after the
  session's start lengthens the limits of the steps still waiting."""
  scale, why = timeout_scale()
  if TIMEOUT_SCALE_ENV in os.environ:
    return scale, why
  now = min(_load_scale(), MAX_MEASURED_SCALE)
  if now > scale:
    return now, f"load now {machine_load()}; {why}"
  return scale, why


def limit_s(base_s):
  """The limit for a subprocess step that takes well under ``base_s`` seconds on a quiet
  2-core machine: ``base_s`` times :func:`current_scale`."""
  return base_s * current_scale()[0]


def timeout_message(what, base_s, scale=None):
  """One line: ``what`` timed out, after how long, why that limit, how to raise it, and the
  machine's load now."""
  scale, why = current_scale() if scale is None else scale
  return (
    f"{what} timed out after {base_s * scale:.0f} s ({base_s:g} s x {scale:.2f}, {why}; "
    f"set {TIMEOUT_SCALE_ENV} to raise it); machine load now {machine_load()}"
  )


class Limit:
  """A step's limit from now: ``base_s`` (a quiet machine's) times :func:`current_scale`,
  re-read on every check, so that load arriving while the step runs lengthens it."""

  POLL_S = 2.0

  def __init__(self, base_s):
    self.base_s, self.start = base_s, time.monotonic()
    self.scale = current_scale()

  def left(self):
    """Seconds left (``<= 0``: expired), at most :attr:`POLL_S` apart between checks."""
    self.scale = max(self.scale, current_scale(), key=lambda s: s[0])
    return self.base_s * self.scale[0] - (time.monotonic() - self.start)

  def expired(self):
    return self.left() <= 0

  def slice(self):
    """How long to block before checking again."""
    return max(0.01, min(self.POLL_S, self.left()))

  def message(self, what):
    return timeout_message(what, self.base_s, self.scale)


def deadline(timeout):
  """A :class:`Limit` for a wait loop (``if limit.expired(): ...``) of a quiet machine's
  ``timeout`` seconds."""
  return Limit(timeout)


def timed_out(what, limit):
  """Fails the running test with ``limit``'s message (a :class:`Limit`, or a quiet machine's
  seconds), without a traceback."""
  message = limit.message(what) if isinstance(limit, Limit) else timeout_message(what, limit)
  pytest.fail(message, pytrace=False)


def _name(args):
  command = args[0] if args else "subprocess"
  text = " ".join(str(a) for a in command) if isinstance(command, (list, tuple)) else command
  return f"`{text}`"[:300]


def _communicate(proc, limit, input=None):  # noqa: A002 (Popen's own name)
  """``proc.communicate`` under ``limit``; ``None`` (``proc`` killed and reaped) when it
  expired. Retrying after ``TimeoutExpired`` loses no output (Python's documentation)."""
  while True:
    try:
      return proc.communicate(input=input, timeout=limit.slice())
    except subprocess.TimeoutExpired:
      input = None  # sent already: a retry may not pass it again  # noqa: A001
      if limit.expired():
        proc.kill()
        proc.communicate()
        return None


def _run(args, kwargs, timeout):
  """``(CompletedProcess or None, Limit)``: ``subprocess.run``'s arguments under a limit."""
  limit = Limit(timeout)
  capture, check = kwargs.pop("capture_output", False), kwargs.pop("check", False)
  stdin_input = kwargs.pop("input", None)
  if capture:
    kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
  if stdin_input is not None:
    kwargs["stdin"] = subprocess.PIPE
  with subprocess.Popen(*args, **kwargs) as proc:
    out = _communicate(proc, limit, stdin_input)
  if out is None:
    return None, limit
  done = subprocess.CompletedProcess(proc.args, proc.returncode, *out)
  if check:
    done.check_returncode()
  return done, limit


def run(*args, timeout, **kwargs):
  """``subprocess.run`` under a :class:`Limit` of ``timeout`` (a quiet machine's seconds);
  a timeout kills the process and fails the test naming the command and the limit."""
  done, limit = _run(args, kwargs, timeout)
  if done is None:
    timed_out(_name(args), limit)
  return done


def wait(proc, timeout):
  """``proc.wait`` under a :class:`Limit`; a timeout kills ``proc`` and fails the test."""
  limit = Limit(timeout)
  while True:
    try:
      return proc.wait(timeout=limit.slice())
    except subprocess.TimeoutExpired:
      if limit.expired():
        proc.kill()
        proc.wait()
        timed_out(_name([proc.args]), limit)


def communicate(proc, timeout, *, input=None):  # noqa: A002 (Popen's own name)
  """``proc.communicate`` under a :class:`Limit`; a timeout kills ``proc`` and fails the
  test."""
  limit = Limit(timeout)
  out = _communicate(proc, limit, input)
  if out is None:
    timed_out(_name([proc.args]), limit)
  return out


def run_shared(*args, timeout, **kwargs):
  """:func:`run` for a module fixture: a :class:`Shared` of the ``CompletedProcess``, or of
  why it failed (a timeout, or a non-zero exit with its stderr's tail), which each test that
  uses it reports as its own failure."""
  done, limit = _run(args, kwargs, timeout)
  if done is None:
    return Shared(failure=limit.message(_name(args)))
  if done.returncode != 0:
    tail = done.stderr[-3000:] if isinstance(done.stderr, str) else ""
    return Shared(failure=f"{_name(args)} exited with {done.returncode}", details=tail)
  return Shared(done)


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
