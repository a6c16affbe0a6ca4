"""Every algorithm gives the same numbers on one device and on an 8-device clients mesh."""

import json
import os
import sys

import jax
import jax.numpy as jnp
import pytest

import fedco
from fedco.problems import portfolio
from tests import helpers, mesh_check


@pytest.fixture(scope="module")
def mesh_run():
  """``tests/mesh_check.py``'s rows as a ``helpers.Shared``: a test that uses them calls
  ``.get()``, which fails that test when the check timed out or failed."""
  env = {
    **os.environ,
    "XLA_FLAGS": helpers.xla_flags(8),
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": str(helpers.ROOT),
  }
  out = helpers.run_shared(
    [sys.executable, str(helpers.ROOT / "tests" / "mesh_check.py")],
    env=env,
    cwd=helpers.ROOT,
    capture_output=True,
    text=True,
    timeout=600,
  )
  if out.failure is None:
    lines = out.value.stdout.splitlines()
    out.value = [json.loads(line) for line in lines if line.startswith("{")]
  return out


def test_client_axis_is_laid_along_the_mesh(mesh_run):
  """Equal numbers alone would not show placement: the compiled 8-device program holds each
  client-stacked state leaf as 2 of the 16 client slots per device, never all clients."""
  mesh_results = mesh_run.get()
  layout = next(r for r in mesh_results if r.get("check") == "client_layout")
  # measured: [2, 3] 11 -> 604 values, [10, 3] 590 -> 118 (the replicated client states)
  assert layout["eight_devices_2"] > 10 * max(layout["one_device_2"], 1), layout
  assert layout["eight_devices_10"] < 0.5 * layout["one_device_10"], layout


def test_every_algorithm_agrees_on_one_and_eight_devices(mesh_run):
  mesh_results = mesh_run.get()
  mesh_results = [r for r in mesh_results if "check" not in r]
  names = {r["algorithm"] for r in mesh_results}
  assert names == set(mesh_check.LABELS)
  assert len(mesh_results) == len(names) + len(mesh_check.SAMPLED)
  assert {r["algorithm"] for r in mesh_results if r["clients_per_round"] == 3} == {
    "comfedl",
    "feddro",
    "mbsgd",
    "drfa",
    "primal_dual_dro",
    "tr_maml",
  }
  for r in mesh_results:
    label = f"{r['algorithm']} (clients_per_round={r['clients_per_round']})"
    assert r["moved"] > 1e-2, label
    assert r["same_clients"], label
    assert r["params"] < 1e-5, label
    assert r["objective"] < 1e-5, label


def test_privacy_and_compression_agree_on_one_and_eight_devices(mesh_run):
  """Clipping, noise, codecs and their per-client state with sampling and dropout."""
  mesh_results = mesh_run.get()
  check = next(r for r in mesh_results if r.get("check") == "uplink")
  assert check["moved"] > 1e-2, check
  assert check["params"] < 1e-5 and check["objective"] < 1e-5, check
  assert check["epsilon"][0] == check["epsilon"][1] > 0, check


def test_fedbuff_agrees_on_one_and_eight_devices(mesh_run):
  """Each buffer's clients from their own versions' models, padded to the mesh."""
  check = next(r for r in mesh_run.get() if r.get("check") == "asynchronous")
  assert check["moved"] > 1e-2 and check["clients_equal"], check
  assert check["params"] < 1e-5 and check["time"] == 0.0, check


def test_mesh_argument_is_checked():
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  with pytest.raises(ValueError, match="mesh"):
    fedco.Simulator(portfolio(1.0), fedco.feddro(), data, mesh="gpu")
  with pytest.raises(ValueError, match="num_devices"):
    fedco.runtime.client_mesh(jax.device_count() + 1)


def test_padding_on_a_one_device_mesh_changes_nothing():
  """A mesh of one device has no padding; the program still agrees with no mesh."""
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  run = lambda mesh: fedco.simulate(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    jnp.zeros(3),
    rounds=3,
    batch_size=4,
    mesh=mesh,
  )
  a, b = run(None), run(fedco.runtime.client_mesh(1))
  assert float(jnp.max(jnp.abs(a.params - b.params))) < 1e-6


def test_a_mesh_run_compiles_once():
  """init's and run's outputs carry the same shardings, so run never compiles twice."""
  data = fedco.FederatedData.from_clients([{"r": c} for c in helpers.portfolio_clients()])
  sim = fedco.Simulator(
    portfolio(1.0),
    fedco.feddro(0.1, 2, beta=0.5),
    data,
    batch_size=4,
    mesh=fedco.runtime.client_mesh(1),
  )
  state = sim.init(jnp.zeros(3), 0)
  for _ in range(3):
    state, _ = sim.run(state, 2)
  assert sim._run._cache_size() == 1


def test_sweep_lays_runs_along_the_mesh(mesh_run):
  """8 runs on 8 devices: each device holds one run's model ([1, 3] shards), and the
  numbers equal the one-device sweep; 9 runs are padded to 16 and cut back to 9."""
  mesh_results = mesh_run.get()
  check = next(r for r in mesh_results if r.get("check") == "sweep")
  assert check["shard_shapes"] == [[1, 3]] and check["shard_devices"] == 8, check
  for runs in (8, 9):
    assert check[f"runs_{runs}_shape"] == [runs, 3], check
    assert check[f"runs_{runs}_params"] < 1e-6 and check[f"runs_{runs}_objective"] < 1e-5, check
  # per-seed partitions of shared examples: the same along the mesh, different per seed
  assert check["per_seed_params"] < 1e-6 and check["per_seed_spread"] > 1e-3, check
