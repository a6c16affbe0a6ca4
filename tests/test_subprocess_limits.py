"""The suite's subprocess limits (``tests/helpers.py``, decision 97): scaled by the machine's
measured slowdown or ``FEDCO_TEST_TIMEOUT_SCALE``, and a timeout reported as one failure
naming the limit, how to raise it and the load, never a traceback or a fixture error."""

import os
import subprocess
import sys

import pytest

from tests import helpers

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def speed(monkeypatch):
  """Sets the session-start measurement ``"<compile s> <load> <cores>"``, no override, and
  no load now (the limits re-read it: the machine's own would change the numbers)."""
  monkeypatch.delenv(helpers.TIMEOUT_SCALE_ENV, raising=False)
  monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
  return lambda value: monkeypatch.setenv(helpers.SPEED_ENV, value)


@pytest.mark.parametrize(
  "measured,scale",
  [
    ("0.1 0.5 2", 1.0),  # a fast quiet machine keeps the base limits
    ("0.6 0.5 2", 2.0),  # compiles twice as slow as the reference
    ("0.3 9 2", 4.5),  # load 9 on 2 cores
    ("30 0 2", helpers.MAX_MEASURED_SCALE),  # measured, yet finite
    ("inf 0 2", helpers.MAX_MEASURED_SCALE),  # the reference compile itself timed out
  ],
)
def test_limits_scale_with_the_measured_slowdown(speed, measured, scale):
  speed(measured)
  assert helpers.timeout_scale()[0] == pytest.approx(scale)
  assert helpers.limit_s(100) == pytest.approx(100 * scale)


def test_load_that_arrives_later_lengthens_a_waiting_limit(speed, monkeypatch):
  """A limit re-reads the load on every check: it grows with load that came after the
  session's start (up to the cap) and never shrinks back."""
  speed("0.1 0 2")
  monkeypatch.setattr(helpers, "_cores", lambda: 2)
  load = lambda value: monkeypatch.setattr(os, "getloadavg", lambda: (value, 0.0, 0.0))
  load(1.0)
  limit = helpers.Limit(100)
  assert 99 < limit.left() <= 100
  load(12.0)  # 6 per core
  assert 599 < limit.left() <= 600
  assert "(100 s x 6.00, load now 12.0 on 2 cores; measured at the session's start: a" in (
    limit.message("step")
  )
  load(1.0)
  assert limit.left() > 599
  load(100.0)
  assert limit.left() <= 100 * helpers.MAX_MEASURED_SCALE


def test_the_environment_variable_replaces_the_measurement(speed, monkeypatch):
  speed("30 0 2")
  monkeypatch.setenv(helpers.TIMEOUT_SCALE_ENV, "20")  # not capped: the user asked
  assert helpers.limit_s(300) == 6000
  assert helpers.timeout_scale()[1] == "FEDCO_TEST_TIMEOUT_SCALE=20"
  for bad in ("0", "-1", "fast", "inf", "nan"):
    monkeypatch.setenv(helpers.TIMEOUT_SCALE_ENV, bad)
    with pytest.raises(ValueError, match=f"^FEDCO_TEST_TIMEOUT_SCALE must be a positive .*{bad}"):
      helpers.limit_s(1)


def test_a_bad_scale_stops_pytest_with_one_line():
  env = {**os.environ, helpers.TIMEOUT_SCALE_ENV: "fast"}
  out = helpers.run(
    [sys.executable, "-m", "pytest", "--co", "-p", "no:xdist", "tests/test_structure.py"],
    cwd=helpers.ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout + out.stderr
  assert out.stderr.strip().splitlines() == [
    "ERROR: FEDCO_TEST_TIMEOUT_SCALE must be a positive number (a factor on every subprocess "
    "limit of the tests, e.g. 3), got 'fast'"
  ], out.stderr


def _fails_with_a_timeout(call, base):
  with pytest.raises(pytest.fail.Exception) as failed:
    call()
  message = str(failed.value)
  assert "\n" not in message and "Traceback" not in message, message
  assert f"timed out after 1 s ({base} s x 0.01" in message, message
  assert "FEDCO_TEST_TIMEOUT_SCALE=0.01; set FEDCO_TEST_TIMEOUT_SCALE to raise it" in message
  assert "); machine load now " in message and " cores" in message, message
  return message


def test_a_timeout_is_one_failure_naming_limit_variable_and_load(monkeypatch):
  """``run``, ``wait`` and ``communicate`` fail the test in one line and leave no process."""
  monkeypatch.setenv(helpers.TIMEOUT_SCALE_ENV, "0.01")  # 100 s -> 1 s
  message = _fails_with_a_timeout(lambda: helpers.run(SLEEP, timeout=100), 100)
  assert message.startswith(f"`{sys.executable} -c import time; time.sleep(60)` timed out")
  for step in (helpers.wait, helpers.communicate):
    proc = subprocess.Popen(SLEEP, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _fails_with_a_timeout(lambda step=step, proc=proc: step(proc, 120), 120)
    assert proc.returncode == -9  # killed and reaped


def test_run_is_subprocess_run_with_input_and_output(speed):
  speed("0.1 0 2")
  done = helpers.run([sys.executable, "-c", "print(7)"], timeout=100, capture_output=True)
  assert done.returncode == 0 and done.stdout.strip() == b"7"
  echo = "import sys, time; time.sleep(2.5); print(sys.stdin.read())"  # past one wait slice
  done = helpers.run(
    [sys.executable, "-c", echo], timeout=300, input="hi", capture_output=True, text=True
  )
  assert done.stdout == "hi\n"


def test_a_shared_failure_fails_each_test_and_gives_the_logs_once():
  shared = helpers.Shared(failure="workers timed out after 300 s", details="the log's tail")
  messages = []
  for _ in range(3):
    with pytest.raises(pytest.fail.Exception) as failed:
      shared.get()
    messages.append(str(failed.value))
  assert messages[0] == "workers timed out after 300 s\nthe log's tail"
  assert messages[1:] == ["workers timed out after 300 s (logs: the first such failure)"] * 2
  assert helpers.Shared(value=(1, 2)).get() == (1, 2)


def test_run_shared_holds_a_timeout_or_an_exit_for_the_tests(monkeypatch):
  monkeypatch.setenv(helpers.TIMEOUT_SCALE_ENV, "0.01")
  shared = helpers.run_shared(SLEEP, timeout=100, capture_output=True, text=True)
  assert "timed out after 1 s (100 s x 0.01" in shared.failure
  crash = [sys.executable, "-c", "import sys; sys.exit('boom')"]
  shared = helpers.run_shared(crash, timeout=100, capture_output=True, text=True)
  assert shared.failure.endswith("exited with 1") and shared.details.strip() == "boom"


def test_every_smoke_entry_names_a_test_that_exists():
  """A renamed or deleted test would silently leave the smoke subset (conftest.py)."""
  import conftest  # the root conftest.py, which pytest has imported

  areas = {entry.split("::")[0] for entry in conftest.SMOKE}
  assert len(conftest.SMOKE) >= 10 and len(areas) >= 8, conftest.SMOKE
  for entry in conftest.SMOKE:
    path, name = entry.split("::")
    function, _, param = name.partition("[")
    source = (helpers.ROOT / path).read_text()
    assert f"\ndef {function}(" in source, entry
    assert not param or param.rstrip("]") in source, entry
