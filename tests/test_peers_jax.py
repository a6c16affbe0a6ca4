"""Smoke tests of the JAX peer programs (benchmarks/peers/jax_bench.py): one tiny round each;
DrJAX's is skipped where drjax is not installed (it is a benchmark-only dependency)."""

import json
import sys

import numpy as np
import pytest

from tests import helpers

PROGRAM = helpers.ROOT / "benchmarks" / "peers" / "jax_bench.py"


def _run(*args):
  out = helpers.run(
    [sys.executable, str(PROGRAM), *args],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_fedco_side_reports_one_round():
  report = _run("--peer=fedco", "--workload=logistic", "--rounds=1")
  assert report["peer"] == "fedco" and report["rounds"] == 1
  assert report["round_seconds"][0] > 0 and report["client_updates_per_round"] == 10


def test_drjax_side_equals_fedco_on_the_whole_data_check():
  pytest.importorskip("drjax")
  fedco_params = _run("--peer=fedco", "--workload=check")["final_params"]
  drjax_params = _run("--peer=drjax", "--workload=check")["final_params"]
  for k in ("w", "b"):
    np.testing.assert_allclose(drjax_params[k], fedco_params[k], atol=1e-6)
  assert np.abs(np.asarray(fedco_params["w"])).max() > 1e-3  # it trained
