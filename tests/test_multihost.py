"""Multi-process runs: two local CPU processes, each holding only its own clients' data.

The module fixture starts three subprocesses of ``tests/multihost_worker.py``: processes 0
and 1 of a ``jax.distributed`` run (a free localhost port as the coordinator, 2 CPU devices
each, so 4 global devices), and a one-process side (``--single``, 4 devices). Each worker
generates only the clients :func:`fedco.runtime.distributed.process_clients` gives it
(7 clients: 0-3 on process 0, 4-6 and one padding block on process 1), builds sharded data
with ``distributed.global_data`` and runs every algorithm of ``tests/mesh_check.py``'s registry
(18) with all 7 clients, and FedDRO (y averaged every step), MB-SGD (round-start refresh),
DRFA (server loss queries), TR-MAML (reported losses) and primal-dual DRO (a weight per
example id) with 3 of 7 clients sampled, for 3 rounds on the 4-device mesh
(:data:`tests.multihost_worker.CONFIGS`). FedAvg runs through ``fedco.simulate``; the other
configurations are traced into one compiled program, each in a named scope, so every compiled
collective names its configuration.
The one-process side computes the reference on one device from all clients' data, compiles
FedDRO on the same sharded arrays without the client-block layout (to show the collectives
check can fail) and runs DRFA with sampling and faults on client-block data over 4 devices.
Each worker process also checkpoints a Ditto run into a shared directory and resumes it
(:func:`tests.multihost_worker.checkpoint_roundtrip`), and saves and restores a state whose
client states are split by client over the two processes.
The subprocesses compile with ``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` (compilation is most of
the time; the collectives are the same as with full optimisation).
"""

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fedco
from fedco.runtime import distributed
from tests import helpers
from tests import multihost_worker as worker

TIMEOUT_S = 300
RTOL, ATOL = 1e-5, 1e-5


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _run_workers(out, limit_s=TIMEOUT_S):
  """The three workers' results as a :class:`tests.helpers.Shared`: ``(single, reports)``,
  or why they failed (a timeout after ``helpers.limit_s(limit_s)``, or exit codes with each
  log's tail), which each test that uses them reports as its own failure."""
  env = {
    **os.environ,
    "JAX_PLATFORMS": "cpu",
    "PYTHONPATH": str(helpers.ROOT),
    "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
    # devices per process come from initialize(local_device_count=2), not the flag
    "XLA_FLAGS": helpers.xla_flags(0),
  }  # compile time dominates
  port = _free_port()
  procs, logs = [], []
  limit = helpers.Limit(limit_s)
  script = str(helpers.ROOT / "tests" / "multihost_worker.py")
  commands = [
    [script, f"--process_id={i}", "--num_processes=2", f"--port={port}", f"--out={out}"]
    + [f"--initialization_timeout={max(1, round(helpers.limit_s(60)))}"]
    for i in range(2)
  ] + [[script, "--single"]]
  try:
    for i, command in enumerate(commands):
      log = open(out / f"output_{i}.txt", "w+")
      logs.append(log)
      procs.append(
        subprocess.Popen(
          [sys.executable] + command,
          env=env,
          cwd=helpers.ROOT,
          stdout=log,
          stderr=subprocess.STDOUT,
        )
      )
    for p in procs:
      while p.poll() is None and not limit.expired():
        try:
          p.wait(timeout=limit.slice())
        except subprocess.TimeoutExpired:
          pass
    codes = [p.poll() for p in procs]
    codes = None if None in codes else codes
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  texts = []
  for log in logs:
    log.seek(0)
    texts.append(log.read())
    log.close()
  if codes != [0, 0, 0]:
    names = ["process 0", "process 1", "single process"]
    what = "the multi-process workers (tests/multihost_worker.py)"
    head = limit.message(what) if codes is None else f"{what} failed with exit codes {codes}"
    tails = "\n".join(
      f"--- {names[i]} (exit {None if codes is None else codes[i]}) ---\n{t[-4000:]}"
      for i, t in enumerate(texts)
    )
    return helpers.Shared(failure=f"{head}; logs in {out}", details=tails)
  reports = [json.loads((out / f"process_{i}.json").read_text()) for i in range(2)]
  single = json.loads([l for l in texts[2].splitlines() if l.startswith("{")][-1])
  return helpers.Shared((single, reports))


@pytest.fixture(scope="module")
def multihost(tmp_path_factory):
  """The workers' results; a test that uses them calls ``.get()`` (fails on their failure)."""
  return _run_workers(tmp_path_factory.mktemp("multihost"))


def test_a_worker_timeout_fails_each_test_naming_the_limit(tmp_path, monkeypatch):
  """Workers past their limit are killed, and every test that uses them fails with one
  line saying so (the limit, the variable that raises it, the load), not a fixture error."""
  monkeypatch.setenv(helpers.TIMEOUT_SCALE_ENV, "0.002")  # 300 s -> 0.6 s: still importing
  shared = _run_workers(tmp_path)
  for i in range(2):
    with pytest.raises(pytest.fail.Exception) as failed:
      shared.get()
    first = str(failed.value).splitlines()[0]
    assert first.startswith(
      "the multi-process workers (tests/multihost_worker.py) timed out after 1 s (300 s x 0.00"
    ), first
    assert "set FEDCO_TEST_TIMEOUT_SCALE to raise it); machine load now" in first, first
    assert ("--- process 0 (exit None) ---" in str(failed.value)) == (i == 0)


def test_each_process_generates_and_holds_only_its_clients(multihost):
  _, reports = multihost.get()
  assert [r["generated"] for r in reports] == [[0, 1, 2, 3], [4, 5, 6]]
  assert [r["owned"] for r in reports] == [r["generated"] for r in reports]
  max_n, blocks = reports[0]["max_count"], reports[0]["num_blocks"]
  assert (max_n, blocks, reports[0]["rows"]) == (22, 8, 176)
  # each process's devices hold exactly its own blocks' rows: 0-3 on 0, 4-7 on 1
  for p, r in enumerate(reports):
    rows = sorted(tuple(s["rows"]) for s in r["shards"])
    assert rows == [
      (4 * p * max_n + 2 * d * max_n, 4 * p * max_n + 2 * (d + 1) * max_n) for d in range(2)
    ], rows


@pytest.mark.parametrize("label", [c[0] for c in worker.CONFIGS])
def test_two_processes_equal_one_process(multihost, label):
  single, reports = multihost.get()
  got, want = reports[0]["results"][label], single["reference"][label]
  assert got["clients"] == want["clients"]
  assert np.max(np.abs(np.asarray(want["params"]) - worker.X0)) > 1e-2  # the model moved
  for key in ("params", "objective", "client_losses"):
    np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=ATOL, err_msg=key)


def test_no_collective_carries_examples(multihost):
  """The compiled programs move models, trackers and per-client sums, never example rows.

  The present collectives are the client slots' models and trackers ``[8, d]``, their means
  and the per-client loss sums ``[7, 2]``. The control shows the check catches data
  movement: the same sharded arrays as a plain ``FederatedData`` (gathers by index) make
  XLA all-reduce the whole example array ``[176, 3]`` and mini-batches ``[8, 5, 3]``.
  """
  single, reports = multihost.get()
  max_n, rows = reports[0]["max_count"], reports[0]["rows"]
  assert (single["max_count"], single["rows"]) == (max_n, rows)
  assert any(worker.carries_examples(s, max_n, rows) for _, s in single["plain"])
  assert not any(worker.carries_examples(s, max_n, rows) for _, s in single["blocks"])
  for r in reports:
    collectives = dict(r["collectives"])
    outside = collectives.pop("", [])  # in the compiled program but in no configuration
    assert set(collectives) == {c[0] for c in worker.CONFIGS if c[0] != "fedavg"}
    for label, ops in list(collectives.items()) + [("", outside)]:
      assert not label or any(op == "all-reduce" for op, _ in ops), (label, ops)  # averaging
      for op, shape in ops:
        assert not worker.carries_examples(shape, max_n, rows), (r["process"], label, op, shape)


# ---- one process: layout, resident mode, argument checks ------------------------------


def _clients(sizes):
  return [
    {"r": np.full((n, 3), k, np.float32) + np.arange(n, dtype=np.float32)[:, None]}
    for k, n in enumerate(sizes)
  ]


def test_global_data_layout_on_one_process():
  sizes = [2, 5, 3]
  data = distributed.global_data(_clients(sizes), 3, fedco.runtime.client_mesh(1))
  assert isinstance(data, distributed.ClientBlockData)
  assert (data.num_clients, data.max_count, data.num_blocks) == (3, 5, 3)
  np.testing.assert_array_equal(data.counts, sizes)
  np.testing.assert_array_equal(data.index[0], [0, 1, 0, 0, 0])
  np.testing.assert_array_equal(data.flat_owner, [0, 0, 3, 3, 3, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3])
  np.testing.assert_allclose(
    data.flat_weights(), [0.5, 0.5, 0, 0, 0] + [0.2] * 5 + [1 / 3] * 3 + [0, 0], rtol=1e-6
  )
  for k, ex in enumerate(_clients(sizes)):
    np.testing.assert_array_equal(data.client(k)["r"], ex["r"])
  # a mapping of ids works as well; the metadata agrees
  again = distributed.global_data(
    dict(enumerate(_clients(sizes))), 3, fedco.runtime.client_mesh(1), client_sizes=sizes
  )
  np.testing.assert_array_equal(again.examples["r"], data.examples["r"])


def test_block_data_with_owner_matches_one_process_data():
  """``ClientBlockData.with_owner`` labels each row with its block's client, and FedDRO on
  the client-level KL-DRO log form (which reads the label) gives the same run on block data
  as on one-process data."""
  sizes = [2, 5, 3]
  mesh = fedco.runtime.client_mesh(1)
  blocks = distributed.global_data(_clients(sizes), 3, mesh).with_owner()
  np.testing.assert_array_equal(blocks.examples["client"], np.repeat([0, 1, 2], 5))
  for k in range(3):
    np.testing.assert_array_equal(blocks.client(k)["client"], [k] * sizes[k])
  plain = fedco.FederatedData.from_clients(_clients(sizes)).with_owner()
  problem = fedco.problems.client_kl_dro_log(
    lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2), gamma=1.0, num_clients=3
  )
  runs = [
    fedco.simulate(
      problem, fedco.feddro(0.05, 2, beta=0.5), data, jnp.zeros(3), rounds=3, batch_size=2, mesh=m
    )
    for data, m in ((blocks, mesh), (plain, None))
  ]
  assert float(jnp.max(jnp.abs(runs[1].params))) > 1e-2  # it moved
  np.testing.assert_allclose(runs[0].params, runs[1].params, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(runs[0].metrics["objective"], runs[1].metrics["objective"], rtol=1e-5)
  with pytest.raises(ValueError, match="already names"):
    blocks.with_owner()


def test_resident_run_equals_plain_run_with_sampling_and_faults(multihost):
  """DRFA, 3 of 5 clients, dropout and stragglers: client-block data on 4 devices (masked,
  not moved, sampling; padding blocks; the aggregator's loss queries) = plain, one device."""
  single, _ = multihost.get()
  plain, blocks = single["resident"]
  for key in ("clients", "survivors", "local_steps"):
    assert blocks[key] == plain[key], key
  assert np.max(np.abs(np.asarray(plain["params"]) - worker.X0)) > 1e-2
  for key in ("params", "objective", "client_losses", "lambda"):
    np.testing.assert_allclose(blocks[key], plain[key], rtol=RTOL, atol=ATOL, err_msg=key)


def test_owner_labels_on_four_devices_match_one_device(multihost):
  """The KL-DRO log form on block data labelled by ``ClientBlockData.with_owner`` (4 devices,
  a padding block) equals the one-device run on ``FederatedData.with_owner``."""
  single, _ = multihost.get()
  plain, blocks = single["owner"]
  assert np.max(np.abs(np.asarray(plain["params"]) - worker.X0)) > 1e-2
  for key in ("params", "objective", "client_losses"):
    np.testing.assert_allclose(blocks[key], plain[key], rtol=RTOL, atol=ATOL, err_msg=key)


def test_layout_rule():
  mesh = fedco.runtime.client_mesh(1)
  assert distributed.client_layout(7, mesh)[:2] == (7, 7)
  assert distributed.process_clients(7, mesh) == list(range(7))
  with pytest.raises(ValueError, match="num_clients"):
    distributed.process_clients(0, mesh)
  with pytest.raises(ValueError, match="process_index"):
    distributed.process_clients(3, mesh, process_index=1)
  with pytest.raises(ValueError, match="mesh"):
    distributed.process_clients(3, "cpu")


def test_bad_arguments():
  mesh = fedco.runtime.client_mesh(1)  # initialises jax's backend: initialize must refuse
  with pytest.raises(ValueError, match="coordinator_address"):
    distributed.initialize("localhost", 2, 0)
  with pytest.raises(ValueError, match="coordinator_address"):
    distributed.initialize("localhost:99999", 2, 0)
  with pytest.raises(ValueError, match="num_processes"):
    distributed.initialize("localhost:1234", 0, 0)
  with pytest.raises(ValueError, match="process_id"):
    distributed.initialize("localhost:1234", 2, 2)
  with pytest.raises(ValueError, match="local_device_count"):
    distributed.initialize("localhost:1234", 2, 1, local_device_count=0)
  with pytest.raises(RuntimeError, match="before any JAX"):  # this process already used jax
    distributed.initialize("localhost:1234", 2, 1)
  with pytest.raises(ValueError, match="local_clients"):
    distributed.global_data(_clients([2, 3]), 3, mesh)
  with pytest.raises(ValueError, match="local_clients"):
    distributed.global_data({0: _clients([2])[0], 5: _clients([2])[0]}, 2, mesh)
  with pytest.raises(ValueError, match="client 1"):
    distributed.global_data([{"r": np.zeros((2, 3))}, {"r": np.zeros((2, 4))}], 2, mesh)
  with pytest.raises(ValueError, match="client 1"):
    distributed.global_data([{"r": np.zeros((2, 3))}, {"r": np.zeros((0, 3))}], 2, mesh)
  with pytest.raises(ValueError, match="client_sizes"):
    distributed.global_data(_clients([2, 3]), 2, mesh, client_sizes=[2, 4])
  data = distributed.global_data(_clients([2, 3]), 2, mesh)
  other = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("clients", "model"))
  problem, alg = worker.algorithms()["fedavg"]
  with pytest.raises(ValueError, match="another mesh"):
    fedco.Simulator(problem, alg, data, mesh=other)


def test_checkpoints_save_and_resume_across_processes(multihost):
  """Checkpoints of a 2-process run: every process saves into and restores from one shared
  directory. A run resumed from round 2 equals the straight 4-round run exactly, and a state
  whose client states are split by client over the processes (each holding only its own
  devices' slots) comes back with the same values and the same layout."""
  _, reports = multihost.get()
  for r in reports:
    c = r["checkpoint"]
    assert "error" not in c, c.get("error")
    assert c["client_state_spans_processes"], c
    assert c["rounds_saved"] == [2, 3, 4], c  # keep=3 of rounds 1-4
    assert c["resumed_from_2"], c
    assert c["rounds"] == 4 and c["moved"] > 1e-2, c
    assert c["state_max_diff"] == 0.0 and c["objective_max_diff"] == 0.0, c
    assert c["by_client_split"] and c["by_client_round"] == 2, c
    assert c["by_client_specs"] == ["P('clients',)"], c
    assert c["by_client_max_diff"] == 0.0, c
