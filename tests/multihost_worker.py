"""One process of a multi-process run, for tests/test_multihost.py.

``multihost_worker.py --process_id=I --num_processes=P --port=PORT --out=DIR`` joins a
``jax.distributed`` run on ``localhost:PORT`` with 2 CPU devices per process, generates ONLY
its own clients' examples (each client's rows come from a generator seeded by its id, so no
process can read another's), builds sharded data with ``distributed.global_data`` and runs
every configuration of :data:`CONFIGS` (every algorithm of ``mesh_check.registry()``,
plus sampled variants) on the mesh of all global devices. Each
process writes ``DIR/process_I.json`` (which clients it generated, which global rows its
devices hold, each configuration's compiled collectives); process 0 adds every
configuration's final model, objective trajectory, client losses and sampled clients.

``multihost_worker.py --single`` computes the one-process side from the same
:func:`client_examples` and :data:`CONFIGS` (see :func:`single`).
"""

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time

import numpy as np

NUM_CLIENTS = 7  # 4 devices -> 2 clients per device, 8 blocks (one padding block)
DEVICES_PER_PROCESS = 2
ROUNDS, BATCH, SEED = 3, 5, 3
X0 = 0.1


def client_examples(k):
  """Client ``k``'s examples, from a generator of its own (sizes 4, 7, ..., 22)."""
  rng = np.random.default_rng(1000 + k)
  return {"r": rng.normal(0.1 * k, 1.0, size=(4 + 3 * k, 3)).astype(np.float32)}


def _mesh_check():
  """tests/mesh_check.py: the registry of every algorithm configuration (shared with the
  1-vs-8-device test). Importable as ``mesh_check`` when tests/ is on ``sys.path`` (this
  file run as a script; pytest's default import mode), else as ``tests.mesh_check``."""
  try:
    import mesh_check  # pylint: disable=g-import-not-at-top
  except ImportError:
    from tests import mesh_check  # pylint: disable=g-import-not-at-top
  return mesh_check


NUM_ROWS = sum(4 + 3 * k for k in range(NUM_CLIENTS))  # the rows of client_examples


def algorithms():
  """``{name: (problem, algorithm)}``: :func:`mesh_check.registry`, primal-dual DRO sized to
  this run's rows (builds no arrays, so it may run before ``distributed.initialize``)."""
  return _mesh_check().registry(num_rows=NUM_ROWS)


# 3 of 7 clients sampled (unsampled clients' slots masked), one algorithm per server kind:
# a tracker averaged every step (feddro), a round-start refresh (mbsgd), a server that
# queries sampled clients' losses (drfa), one that weighs reported losses (tr_maml) and one
# that keeps a weight per example row (primal_dual_dro).
SAMPLED = ("feddro", "mbsgd", "drfa", "tr_maml", "primal_dual_dro")
# (label, algorithm, clients_per_round): every registry algorithm with all clients, then the
# sampled ones. FedAvg runs through fedco.simulate; the others through one compiled chunk
# whose collectives are recorded.
CONFIGS = [(name, name, None) for name in algorithms()] + [
  (f"{name}_m3", name, 3) for name in SAMPLED
]


def _host(params, metrics):
  return {
    "params": np.asarray(params).tolist(),
    "objective": np.asarray(metrics["objective"]).tolist(),
    "client_losses": np.asarray(metrics["client_losses"]).tolist(),
    "clients": np.asarray(metrics["clients"]).tolist(),
  }


def run_config(label, data, mesh):
  """One configuration through ``fedco.simulate``, as host lists (on every process)."""
  import jax.numpy as jnp

  import fedco
  from fedco.runtime import distributed

  _, name, m = next(c for c in CONFIGS if c[0] == label)
  problem, alg = algorithms()[name]
  result = fedco.simulate(
    problem,
    alg,
    data,
    jnp.full((3,), X0),
    rounds=ROUNDS,
    seed=SEED,
    batch_size=BATCH,
    clients_per_round=m,
    mesh=mesh,
  )
  return _host(distributed.fetch(result.params), result.metrics)


# A collective and its result shape in compiled HLO text, e.g. "%x = f32[8,2]{1,0} all-gather(".
COLLECTIVE = re.compile(
  r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s+(all-gather|all-reduce|all-to-all|"
  r"collective-permute|reduce-scatter)(?:-start)?\("
)


def carries_examples(shape, max_n, rows):
  """Whether a collective's result shape text could hold example rows.

  Example data shows up as a dimension of a block's row count ``max_n`` or of the global row
  count ``rows``, or as a mini-batch ending in ``[..., BATCH, 3]``. Models, trackers and
  per-client sums (``[8, 3]``, ``[8, 2]``, ``[7, 2]``, ``[3]``) do not match.
  """
  for text in re.findall(r"\[([\d,]*)\]", shape):
    dims = tuple(int(d) for d in text.split(",") if d)
    if max_n in dims or rows in dims or dims[-2:] == (BATCH, 3):
      return True
  return False


def compiled_collectives(sim, state):
  compiled = sim._run.lower(
    state, sim.data, sim.metrics_data, np.int32(ROUNDS), rounds=ROUNDS
  ).compile()
  ops = sorted(
    {
      (mt.group(2), mt.group(1))
      for mt in map(COLLECTIVE.match, compiled.as_text().splitlines())
      if mt
    }
  )
  return compiled, ops


def single():
  """The one-process side, in one process with 4 CPU devices; prints one JSON line.

  * ``reference``: every configuration of :data:`CONFIGS` on one device (``mesh=None``) from
    all clients' data, as the workers run them: FedAvg through ``fedco.simulate``, the
    others from one compiled program (:func:`run_compiled`);
  * ``blocks`` / ``plain``: FedDRO's collectives on client-block data over 4 devices and, as
    a negative control for :func:`carries_examples`, on the same sharded arrays as a plain
    ``FederatedData`` (whose index gathers XLA serves by moving rows); compiled only;
  * ``owner``: FedDRO on the client-level KL-DRO log form, whose inner reads each
    example's client label, on plain data with ``with_owner`` (one device) and on the
    client-block data with ``ClientBlockData.with_owner`` (4 devices, one padding block);
  * ``resident``: DRFA with 3 of 5 clients sampled, dropout and stragglers, on client-block
    data over the 4-device mesh (2 clients per device, 3 padding blocks) and on plain data
    on one device: masked sampling, fault draws and the aggregator's loss queries.
  """
  import jax

  jax.config.update("jax_num_cpu_devices", 4)
  import jax.numpy as jnp

  import fedco
  from fedco.runtime import distributed

  clients = [client_examples(k) for k in range(NUM_CLIENTS)]
  plain = fedco.FederatedData.from_clients(clients)
  out = {"reference": run_each(plain, None)[0]}
  mesh = fedco.runtime.client_mesh(4)
  blocks = distributed.global_data(clients, NUM_CLIENTS, mesh)
  problem, alg = algorithms()["feddro"]
  out.update(max_count=blocks.max_count, rows=blocks.num_examples)
  for label, data in (
    ("blocks", blocks),
    (
      "plain",
      fedco.FederatedData(
        blocks.examples,
        blocks.counts,
        blocks.offsets,
        blocks.flat_rows,
        blocks.flat_owner,
        blocks.max_count,
      ),
    ),
  ):
    sim = fedco.Simulator(problem, alg, data, batch_size=BATCH, mesh=mesh)
    if label == "plain":  # the control keeps the rows sharded (Simulator would replicate them)
      sim.data = data
    state = jax.device_put(sim.init(jnp.full((3,), X0), SEED), sim._replicated)
    out[label] = compiled_collectives(sim, state)[1]
  # the KL-DRO log form reads each example's client label: block data over 4 devices (one
  # padding block) labelled by ClientBlockData.with_owner, against one-process data
  log_form = fedco.problems.client_kl_dro_log(
    lambda x, e: 0.5 * jnp.sum((x - e["r"]) ** 2), gamma=1.0, num_clients=NUM_CLIENTS
  )
  out["owner"] = [
    _host(distributed.fetch(r.params), r.metrics)
    for r in (
      fedco.simulate(
        log_form,
        fedco.feddro(0.05, 2, beta=0.5),
        d,
        jnp.full((3,), X0),
        rounds=ROUNDS,
        seed=SEED,
        batch_size=BATCH,
        mesh=m,
      )
      for d, m in ((plain.with_owner(), None), (blocks.with_owner(), mesh))
    )
  ]
  five = clients[:5]
  runs = [
    fedco.simulate(
      algorithms()["fedavg"][0],
      fedco.drfa(0.1, 3, weights_lr=0.01),
      data,
      jnp.full((3,), X0),
      rounds=ROUNDS,
      seed=1,
      batch_size=4,
      clients_per_round=3,
      participation=0.7,
      straggler_prob=0.3,
      mesh=mesh_,
    )
    for data, mesh_ in (
      (fedco.FederatedData.from_clients(five), None),
      (distributed.global_data(five, 5, mesh), mesh),
    )
  ]
  out["resident"] = [
    {
      **_host(distributed.fetch(r.params), r.metrics),
      "survivors": np.asarray(r.metrics["survivors"]).tolist(),
      "local_steps": np.asarray(r.metrics["local_steps"]).tolist(),
      "lambda": [np.asarray(l).tolist() for l in jax.tree.leaves(r.state.server_opt_state)],
    }
    for r in runs
  ]
  print(json.dumps(out), flush=True)


# The op_name of a compiled instruction, e.g. 'op_name="jit(all_configs)/feddro/while/..."'.
OP_NAME = re.compile(r'op_name="([^"]*)"')


def run_compiled(labels, data, mesh):
  """Every configuration of ``labels`` from ONE compiled program
  (:func:`mesh_check.compile_all`), plus its collectives.

  Each configuration is traced under ``jax.named_scope(label)``, so every compiled collective
  names the configuration it belongs to in its ``op_name``; returns ``({label: host
  results}, {label: collectives})`` with ``""`` for collectives outside every configuration
  (``mesh=None``: no collectives).
  """
  import jax.numpy as jnp

  from fedco.runtime import distributed

  configs = []
  for label in labels:
    _, name, m = next(c for c in CONFIGS if c[0] == label)
    configs.append((label, *algorithms()[name], m))
  outs, compiled = _mesh_check().compile_all(
    configs, data, mesh, x0=jnp.full((3,), X0), seed=SEED, rounds=ROUNDS, batch_size=BATCH
  )
  fetched = distributed.fetch([(state.server["params"], metrics) for state, metrics in outs])
  results = {label: _host(*f) for label, f in zip(labels, fetched)}
  collectives = {}
  for line in compiled.as_text().splitlines():
    mt = COLLECTIVE.match(line)
    if mt:
      scope = OP_NAME.search(line)
      parts = scope.group(1).split("/") if scope else []
      owner = parts[1] if len(parts) > 1 and parts[1] in labels else ""
      collectives.setdefault(owner, set()).add((mt.group(2), mt.group(1)))
  return results, {k: sorted(v) for k, v in collectives.items()}


def run_each(data, mesh, timing=None):
  """Every configuration of :data:`CONFIGS`: FedAvg through ``fedco.simulate``
  (:func:`run_config`), the others through :func:`run_compiled`; ``(results, collectives)``.
  """
  timing = {} if timing is None else timing
  t = time.perf_counter()
  results = {"fedavg": run_config("fedavg", data, mesh)}
  timing["fedavg"] = time.perf_counter() - t
  t = time.perf_counter()
  compiled, collectives = run_compiled([c[0] for c in CONFIGS if c[0] != "fedavg"], data, mesh)
  timing["compiled"] = time.perf_counter() - t
  results.update(compiled)
  return {label: results[label] for label, _, _ in CONFIGS}, collectives


def _max_abs_diff(a, b):
  """The largest absolute difference between two pytrees of host arrays (in float64)."""
  import jax

  return max(
    float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def checkpoint_roundtrip(mesh, directory):
  """Checkpoints across processes: Ditto (a personal model per client) on 8 clients runs 2
  rounds with a checkpoint after each, then a second ``simulate`` call with the same
  ``checkpoint_dir`` resumes from round 2 (it must say so) and runs to round 4; a third
  call runs the 4 rounds without checkpoints. Then the round-2 state, with its
  client states laid out by client over the mesh (no process holding all of them), is saved
  and restored with ``fedco.checkpoint.Checkpointer`` directly. Every process takes part in
  every call; returns, on every process, the layouts, the saved rounds and the largest
  differences (resumed against straight, restored against saved).
  """
  import jax
  import jax.numpy as jnp

  import fedco
  from fedco.runtime import distributed

  problem, alg = algorithms()["ditto"]
  # 8 clients (each process generating its own), so client states split evenly over 4 devices
  data = distributed.global_data(
    [client_examples(k) for k in distributed.process_clients(8, mesh)], 8, mesh
  )
  kwargs = dict(seed=SEED, batch_size=BATCH, mesh=mesh, progress=False)
  x0 = jnp.full((3,), X0)
  first = fedco.simulate(
    problem, alg, data, x0, rounds=2, checkpoint_dir=directory, checkpoint_every=1, **kwargs
  )
  said = io.StringIO()
  with contextlib.redirect_stderr(said):
    resumed = fedco.simulate(
      problem, alg, data, x0, rounds=4, checkpoint_dir=directory, checkpoint_every=1, **kwargs
    )
  straight = fedco.simulate(problem, alg, data, x0, rounds=4, **kwargs)
  got, want = distributed.fetch((resumed.state, straight.state))
  # The simulator hands back client states replicated over the mesh; a state laid out by
  # client (each process holding only its own devices' slots) must save and restore too.
  from fedco import checkpoint as checkpoint_lib

  by_client = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients"))
  laid_out = first.state._replace(clients=jax.device_put(first.state.clients, by_client))
  split = [
    not (leaf.is_fully_addressable or leaf.is_fully_replicated)
    for leaf in jax.tree.leaves(laid_out.clients)
  ]
  ckpt = checkpoint_lib.Checkpointer(directory + "_by_client")
  ckpt.save(2, laid_out, first.metrics)
  back_round, back, _ = ckpt.restore(laid_out)
  ckpt.close()
  back_specs = {str(leaf.sharding.spec) for leaf in jax.tree.leaves(back.clients)}
  back_host, laid_host = distributed.fetch((back, laid_out))
  back_diff = _max_abs_diff(back_host, laid_host)
  diff = _max_abs_diff(got, want)
  return {
    "client_state_spans_processes": all(
      not leaf.is_fully_addressable for leaf in jax.tree.leaves(first.state.clients)
    ),
    "by_client_split": bool(split) and all(split),
    "by_client_round": back_round,
    "by_client_specs": sorted(back_specs),
    "by_client_max_diff": back_diff,
    "rounds_saved": sorted(int(n) for n in os.listdir(directory) if n.isdigit()),
    "resumed_from_2": "resumed from round 2" in said.getvalue(),
    "state_max_diff": diff,
    "objective_max_diff": float(
      np.max(np.abs(resumed.metrics["objective"] - straight.metrics["objective"]))
    ),
    "rounds": int(got.round),
    "moved": float(np.max(np.abs(np.asarray(got.server["params"]) - X0))),
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--process_id", type=int)
  parser.add_argument("--num_processes", type=int, default=2)
  parser.add_argument("--port", type=int)
  parser.add_argument("--out")
  parser.add_argument("--single", action="store_true", help="see single()")
  parser.add_argument(
    "--initialization_timeout", type=int, default=60, help="seconds for both to join"
  )
  args = parser.parse_args()
  if args.single:
    return single()
  start = time.perf_counter()
  from fedco.runtime import distributed

  distributed.initialize(
    f"localhost:{args.port}",
    args.num_processes,
    args.process_id,
    local_device_count=DEVICES_PER_PROCESS,
    initialization_timeout=args.initialization_timeout,
  )
  import jax

  import fedco

  assert jax.process_count() == args.num_processes, jax.process_count()
  assert jax.device_count() == DEVICES_PER_PROCESS * args.num_processes, jax.devices()
  mesh = fedco.runtime.client_mesh()
  mine = distributed.process_clients(NUM_CLIENTS, mesh)
  others = [
    k
    for p in range(args.num_processes)
    if p != args.process_id
    for k in distributed.process_clients(NUM_CLIENTS, mesh, p)
  ]
  generated = []

  def load(k):
    assert k in mine and k not in others, (k, mine)
    generated.append(k)
    return client_examples(k)

  data = distributed.global_data([load(k) for k in mine], NUM_CLIENTS, mesh)
  examples = data.examples["r"]
  assert not examples.is_fully_addressable
  shards = [
    {"device": str(s.device), "rows": [s.index[0].start, s.index[0].stop]}
    for s in examples.addressable_shards
  ]
  # every row this process holds is one of its own clients' rows or padding
  local_rows = np.concatenate([np.asarray(s.data) for s in examples.addressable_shards])
  own = np.concatenate([client_examples(k)["r"] for k in mine])
  assert all(np.any(np.all(own == row, axis=1)) for row in local_rows)

  report = {
    "process": args.process_id,
    "generated": generated,
    "owned": mine,
    "shards": shards,
    "num_blocks": data.num_blocks,
    "max_count": data.max_count,
    "rows": int(examples.shape[0]),
  }
  report["timing"] = {"setup": time.perf_counter() - start}
  results, report["collectives"] = run_each(data, mesh, report["timing"])
  t = time.perf_counter()
  try:  # a failure here fails only the checkpoint test, not every 2-process test
    report["checkpoint"] = checkpoint_roundtrip(mesh, os.path.join(args.out, "checkpoints"))
  except Exception:  # pylint: disable=broad-except
    import traceback  # pylint: disable=g-import-not-at-top

    report["checkpoint"] = {"error": traceback.format_exc()[-3000:]}
  report["timing"]["checkpoint"] = time.perf_counter() - t
  if args.process_id == 0:
    report["results"] = results
  report["seconds"] = time.perf_counter() - start
  with open(os.path.join(args.out, f"process_{args.process_id}.json"), "w") as f:
    json.dump(report, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  sys.exit(main())
