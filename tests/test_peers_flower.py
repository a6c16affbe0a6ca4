"""Smoke test of Flower's peer program (benchmarks/peers/flower_bench.py): one tiny round of
the logistic workload on Flower's Simulation Engine. Skipped where flwr is not installed (it
is a benchmark-only dependency, in its own virtual environment: requirements-flower.txt);
run it with that environment's python: ``/path/to/flower-venv/bin/python -m pytest
tests/test_peers_flower.py``."""

import json
import sys

import pytest

from tests import helpers

PROGRAM = helpers.ROOT / "benchmarks" / "peers" / "flower_bench.py"


def test_flower_side_reports_one_logistic_round():
  pytest.importorskip("flwr")
  pytest.importorskip("torch")
  out = helpers.run(
    [sys.executable, str(PROGRAM), "--workload=logistic", "--rounds=1"],
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  report = json.loads(out.stdout.strip().splitlines()[-1])
  assert report["peer"] == "flower" and report["workload"] == "logistic"
  assert report["rounds"] == 1 and len(report["round_seconds"]) == 1
  assert report["round_seconds"][0] > 0 and report["setup_seconds"] > 0
  assert report["client_updates_per_round"] == 10
