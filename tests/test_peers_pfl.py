"""Smoke tests of the pfl-research peer program (benchmarks/peers/pfl_bench.py), run with the
python of a virtual environment holding benchmarks/peers/requirements-pfl.txt; skipped where
pfl is not installed (it is a benchmark-only dependency)."""

import json
import sys

import numpy as np
import pytest

from tests import helpers

PROGRAM = helpers.ROOT / "benchmarks" / "peers" / "pfl_bench.py"

pytest.importorskip("pfl")
pytest.importorskip("torch")


def _run(*args):
  out = helpers.run(
    [sys.executable, str(PROGRAM), *args, "--threads=1"],
    check=False,
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_logistic_reports_one_round():
  report = _run("--workload=logistic", "--rounds=1")
  assert report["peer"] == "pfl" and report["workload"] == "logistic"
  assert report["rounds"] == 1 and len(report["round_seconds"]) == 1
  assert report["round_seconds"][0] > 0 and report["setup_seconds"] > 0
  assert report["client_updates_per_round"] == 10


def _feddro_reference(rounds):
  """FedDRO on the client-level KL-DRO log form in float64 NumPy, with the batches the
  program draws (rows ``default_rng([0, k, iteration, draw]).integers(0, 500, 32)``)."""
  sys.path.insert(0, str(PROGRAM.parent))
  import workloads  # pylint: disable=g-import-not-at-top

  w = workloads.WORKLOADS["feddro"]
  K, lr, beta, gamma = w.num_clients, w.learning_rate, workloads.FEDDRO_BETA, workloads.FEDDRO_GAMMA
  data = workloads.data("feddro")
  xs = [data["x"][workloads.client_rows("feddro", k)].astype(np.float64) for k in range(K)]
  ys = [data["y"][workloads.client_rows("feddro", k)] for k in range(K)]

  def batch(k, i, draw):
    rows = np.random.default_rng([0, k, i, draw]).integers(0, w.per_client, w.batch_size)
    return xs[k][rows], ys[k][rows]

  def loss_grad(p, xb, yb):
    z = xb @ p["w"].T + p["b"]
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    d = np.exp(logp)
    d[np.arange(len(yb)), yb] -= 1
    d /= len(yb)
    return -logp[np.arange(len(yb)), yb].mean(), {"w": d.T @ xb, "b": d.sum(0)}

  x_bar = {"w": np.zeros((workloads.CLASSES, workloads.FEATURES)), "b": np.zeros(workloads.CLASSES)}
  y_bar = np.zeros(K)
  for k in range(K):
    y_bar[k] = loss_grad(x_bar, *batch(k, 0, 0))[0]  # mean_k of g_k = K loss_k e_k
  i = 0
  for _ in range(rounds):
    models = [dict(x_bar) for _ in range(K)]
    for _ in range(w.local_steps):
      i += 1
      r = np.exp(y_bar / gamma - np.max(y_bar / gamma))
      r /= r.sum()
      new_y = []
      for k in range(K):
        xn, yn = batch(k, i, 2)
        g_old = K * loss_grad(models[k], xn, yn)[0]
        _, grad = loss_grad(models[k], *batch(k, i, 1))
        models[k] = {n: models[k][n] - lr * K * r[k] * grad[n] for n in grad}
        y_k = (1 - beta) * y_bar.copy()
        y_k[k] += K * loss_grad(models[k], xn, yn)[0] - (1 - beta) * g_old
        new_y.append(y_k)
      y_bar = np.mean(new_y, axis=0)
    x_bar = {n: np.mean([m[n] for m in models], axis=0) for n in x_bar}
  return y_bar


def test_feddro_equals_a_numpy_transcription():
  report = _run("--workload=feddro", "--rounds=2")
  assert report["rounds"] == 2 and report["feddro_lines"] > 0
  assert report["pfl_iterations_per_round"] == 5
  expected = _feddro_reference(2)
  np.testing.assert_allclose(report["final_y_bar"], expected, rtol=2e-5, atol=2e-5)
  assert np.ptp(expected) > 1e-2  # the clients' estimates moved apart: the check can fail
