r"""Many clients, few per round: FedAvg, SCAFFOLD, Local-SCGD on Synthetic-style clients, K <= 10^6.

Issue 30's scale benchmark. Each client is a Synthetic(1, 1)-style user (FedProx's recipe,
vectorized here: inputs around its own mean, labels from its own linear model; 60 features,
10 classes), holding ``n_k = min(5 + floor(LogNormal(2, 1)), 60)`` examples (about 14 on
average); 100 clients per round, 5 local steps of batch 10, multinomial logistic
regression. ``fedavg`` is stateless; ``scaffold`` keeps a control variate per client (the
model's size), the persistent client state that grows with ``K``; ``local_scgd`` is the
compositional case: client-level KL-DRO (``client_kl_dro``, temperature 10) whose loss
tracker starts from every client's mean of its first mini-batch (a streamed run's one pass
over the store before round 1, in ``init_seconds``; decision 90).

Two paths, each (K, algorithm, path) in a fresh subprocess: ``in_memory`` (every example
and every client's state resident) and ``streamed`` (the examples in a
:class:`fedco.data.ClientStore` on disk, each chunk reading only its sampled clients; the
persistent client state on disk too, :class:`fedco.runtime.streaming.StateStore`, only the
chunk's clients' rows on the device). Each records the data build time, the bytes of the
data and of the simulation state, the peak RSS, the disk used by the examples and by the
client state (``du``: allocated blocks; for a streamed stateful run also per sampled client,
``client_state_disk_bytes_per_sampled_client``), and the median rounds per second of
``--repeats`` timed chunks. A run whose
estimated footprint exceeds ``--max_gib`` is not started (recorded as skipped with the
estimate), so the benchmark never drives the machine out of memory. Issue 30's target:
K = 10^6 with 100 per round under 4 GiB of peak RSS, at a round time within 2x of the
in-memory path at K = 10^4.

Run::

    python -m benchmarks.federated_scale --out=benchmarks/results/federated_scale.json
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "benchmarks/results/federated_scale.json", "Where to write the JSON.")
flags.DEFINE_list("sizes", ["1000", "10000", "100000", "1000000"], "Client counts K.")
flags.DEFINE_list(
  "algorithms", ["fedavg", "scaffold"], "Algorithms (fedavg, scaffold, local_scgd)."
)
flags.DEFINE_integer("clients_per_round", 100, "Clients sampled per round.")
flags.DEFINE_integer("rounds", 20, "Rounds per timed run call.")
flags.DEFINE_integer("repeats", 3, "Timed run calls; the median is reported.")
flags.DEFINE_float("max_gib", 12.0, "Skip a size whose estimated footprint exceeds this.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_integer("timeout", 900, "Seconds per worker subprocess.")
flags.DEFINE_boolean("worker", False, "Internal: run one size in this process.")
flags.DEFINE_integer("clients", 1000, "Internal (worker): K.")
flags.DEFINE_string("algorithm", "fedavg", "Internal (worker): the algorithm.")
flags.DEFINE_string("result_file", "", "Internal (worker): where to write its JSON.")
flags.DEFINE_list("paths", ["in_memory", "streamed"], "in_memory, streamed (a ClientStore).")
flags.DEFINE_string(
  "store_dir", "", "Where streamed runs write their stores (default: a temp dir)."
)
flags.DEFINE_string("path", "in_memory", "Internal (worker): in_memory or streamed.")

DIM, CLASSES, LOCAL_STEPS, BATCH, MAX_PER_CLIENT = 60, 10, 5, 10, 60
PARAMS = DIM * CLASSES + CLASSES


def client_sizes(k: int, seed: int):
  import numpy as np

  rng = np.random.default_rng([seed, 1])
  return np.minimum(5 + rng.lognormal(2.0, 1.0, k).astype(np.int64), MAX_PER_CLIENT)


def estimate_gib(k: int, algorithm: str, seed: int, streamed: bool = False) -> float:
  """Peak memory, from what K = 10^5 measured: the examples (float32 features, int32
  label, the row list and owner; none when streamed) plus SCAFFOLD's client state (four
  model-sized arrays per client, 0.91 GiB at 10^5; streamed, only a chunk's clients' rows)
  about 2.5 times over (the state, its update and the round's copies: 2.34 GiB of peak RSS
  at 10^5 with the state resident)."""
  examples = 0 if streamed else int(client_sizes(k, seed).sum())
  held = min(k, FLAGS.rounds * FLAGS.clients_per_round) if streamed else k  # a chunk's rows
  state = held * PARAMS * 4 * (4 if algorithm == "scaffold" else 0)
  return (examples * (DIM * 4 + 4 + 8) + 2.5 * state) / 2**30


def synthetic_blocks(k: int, seed: int):
  """Per-client Synthetic(1, 1)-style data, ``(x, y, sizes)`` per block of 10,000 clients
  (vectorized; one RNG stream, so the in-memory and the streamed paths get the same data)."""
  import numpy as np

  sizes = client_sizes(k, seed)
  scale = np.arange(1, DIM + 1, dtype=np.float32) ** -0.6
  rng = np.random.default_rng([seed, 2])
  for lo in range(0, k, 10_000):
    block = sizes[lo : lo + 10_000]
    b = block.size
    u = rng.normal(0.0, 1.0, (b, 1, 1)).astype(np.float32)
    v = rng.normal(rng.normal(0.0, 1.0, (b, 1)), 1.0, (b, DIM)).astype(np.float32)
    w = u + rng.normal(0.0, 1.0, (b, DIM, CLASSES)).astype(np.float32)
    owner = np.repeat(np.arange(b), block)
    xs = v[owner] + scale * rng.standard_normal((owner.size, DIM), np.float32)
    logits = np.einsum("nd,ndc->nc", xs, w[owner]) + u[owner, 0]
    yield xs, logits.argmax(1).astype(np.int32), block


def synthetic_style(k: int, seed: int):
  """Every client's examples in memory: ``(examples, sizes, offsets)``."""
  import numpy as np

  xs, ys, sizes = zip(*synthetic_blocks(k, seed))
  sizes = np.concatenate(sizes)
  offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
  return {"x": np.concatenate(xs), "y": np.concatenate(ys)}, sizes, offsets


def write_synthetic_store(path: str, k: int):
  """The same clients, written block by block into a ClientStore (never all in memory)."""
  import numpy as np

  import fedco

  def clients():
    for xs, ys, sizes in synthetic_blocks(k, FLAGS.seed):
      for o, c in zip(np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes):
        yield {"x": xs[o : o + c], "y": ys[o : o + c]}

  return fedco.data.write_store(path, clients())


def worker():
  import jax
  import jax.numpy as jnp
  import numpy as np

  import fedco
  from benchmarks import _common as C

  k, name, streamed = FLAGS.clients, FLAGS.algorithm, FLAGS.path == "streamed"
  rss = {"after_imports": C.maxrss_bytes()}
  t0 = time.perf_counter()
  if streamed:  # written once per K (outside the timing), then only read
    path = os.path.join(FLAGS.store_dir, f"synthetic-{k}-{FLAGS.seed}")
    data = fedco.data.ClientStore(path) if os.path.isdir(path) else write_synthetic_store(path, k)
    sizes = data.counts
    data_bytes = disk_bytes = sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
  else:
    examples, sizes, offsets = synthetic_style(k, FLAGS.seed)
    rows = [np.arange(o, o + n) for o, n in zip(offsets, sizes)]
    data = fedco.FederatedData.from_index_lists(examples, rows, num_classes=CLASSES)
    del rows, examples
    data_bytes, disk_bytes = int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(data))), 0
  data_seconds = time.perf_counter() - t0
  rss["after_data"] = C.maxrss_bytes()

  def loss(params, example):
    logits = example["x"] @ params["w"] + params["b"]
    return jax.nn.logsumexp(logits) - logits[example["y"]]

  factory = {"fedavg": fedco.fedavg, "scaffold": fedco.scaffold, "local_scgd": fedco.local_scgd}[
    name
  ]
  problem = fedco.problems.client_kl_dro(loss, 10.0) if name == "local_scgd" else fedco.plain(loss)
  params = {"w": jnp.zeros((DIM, CLASSES)), "b": jnp.zeros((CLASSES,))}
  kwargs = dict(
    batch_size=BATCH,
    clients_per_round=FLAGS.clients_per_round,
    evaluate=False,
    chunk_rounds=FLAGS.rounds,
    seed=FLAGS.seed,
  )
  # One fedco.simulate call for both paths (the streamed one is its chunk loop) of
  # (repeats + 1) chunks of `rounds` rounds; an action at each chunk's end takes the time
  # (the state is on the host by then), and the first chunk (compilation) is left out.
  marks = []

  def mark(state, round_):
    del state, round_
    marks.append(time.perf_counter())
    state_disk.append(C.disk_bytes(state_tmp, prefix="fedco-client-state-"))

  state_disk = []  # streamed: the client state's files (sparse: blocks in use), per chunk
  state_tmp = tempfile.mkdtemp(prefix="fedco-scale-state-")
  tempfile.tempdir = state_tmp  # where simulate puts a run's client state without checkpoints

  total = FLAGS.rounds * (FLAGS.repeats + 1)
  action = fedco.runtime.RoundAction(mark, every_rounds=FLAGS.rounds, at_start=True)
  t0 = time.perf_counter()
  result = fedco.simulate(problem, factory(0.05, LOCAL_STEPS), data, params,
                          rounds=total, actions=[action], **kwargs)  # fmt: skip
  run_seconds = time.perf_counter() - t0
  rss["after_run"] = C.maxrss_bytes()
  state_bytes = int(sum(a.nbytes for a in jax.tree.leaves(result.state)))
  first = marks[1] - marks[0]
  times = list(np.diff(marks[1:]))
  med = statistics.median(times)
  state = result.state
  init_seconds = marks[0] - t0  # simulator, initial state, schedule (streamed), fingerprint
  layout = state_layout_disk(state, result.metrics["clients"], k) if streamed else {}
  result = {
    "clients": k,
    "algorithm": name,
    "path": FLAGS.path,
    "examples": int(sizes.sum()),
    "examples_per_client_mean": float(sizes.mean()),
    "rounds_per_call": FLAGS.rounds,
    "seconds": times,
    "rounds_per_s": FLAGS.rounds / med,
    "ms_per_round": 1e3 * med / FLAGS.rounds,
    "first_chunk_seconds": first,
    "whole_run_seconds": run_seconds,
    "data_build_seconds": data_seconds,
    "init_seconds": init_seconds,
    "federated_data_bytes": data_bytes,
    "sim_state_bytes": state_bytes,
    "maxrss_bytes": rss,
    "peak_rss_gib": rss["after_run"] / 2**30,
    "disk_bytes": disk_bytes,
    "client_state_disk_bytes_per_chunk": state_disk,
    "client_state_rows_on_device": C.leading_rows(state.clients),
    **layout,
    "final_params_finite": C.finite(state.server["params"]),
  }
  with open(FLAGS.result_file, "w") as f:
    json.dump(result, f)


def state_layout_disk(state, clients, k: int):
  """Disk (``du``: allocated blocks) of a run's client-state files per sampled client: the
  run's sampled clients' rows written again, chunk by chunk as the run writes them, into a
  StateStore of its own (the run's own folder is removed at its end, and its last chunk's
  write may still be in flight when the actions see the disk)."""
  import jax
  import numpy as np

  from benchmarks import _common as C
  from fedco.runtime import paging

  if not paging.is_paged(state):
    return {}
  fresh = paging.fresh(state)
  parent = tempfile.mkdtemp(prefix="fedco-scale-layout-")
  store = paging.StateStore(os.path.join(parent, "s"), fresh, k, durable=False)
  for start in range(0, clients.shape[0], FLAGS.rounds):
    ids = np.unique(clients[start : start + FLAGS.rounds])
    store.write(ids, jax.tree.map(lambda a, n=ids.size: np.ones((n,) + a.shape, a.dtype), fresh))
    store.apply(start + FLAGS.rounds)
  store.close()
  used, sampled = C.disk_bytes(parent, "s"), int(np.unique(clients).size)
  shutil.rmtree(parent, ignore_errors=True)
  return {
    "client_state_sampled_clients": sampled,
    "client_state_row_bytes": int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(fresh))),
    "client_state_disk_bytes": used,
    "client_state_disk_bytes_per_sampled_client": used / sampled,
  }


def run_one(k: int, name: str, path_kind: str, store_dir: str):
  """One (K, algorithm, path) in a fresh subprocess; a row of the JSON."""
  from benchmarks import _common as C

  estimate = estimate_gib(k, name, FLAGS.seed, streamed=path_kind == "streamed")
  row = {"clients": k, "algorithm": name, "path": path_kind, "estimated_gib": estimate}
  if estimate > FLAGS.max_gib:
    row["skipped"] = f"estimated {estimate:.1f} GiB > --max_gib={FLAGS.max_gib}"
    print(f"K={k} {name} {path_kind}: skipped ({row['skipped']})", flush=True)
    return row
  args = [f"--path={path_kind}", f"--clients={k}", f"--algorithm={name}"]
  args += [f"--{f}={getattr(FLAGS, f)}" for f in ("clients_per_round", "rounds", "repeats")]
  args += [f"--seed={FLAGS.seed}", f"--store_dir={store_dir}"]
  result, error, wall = C.run_worker("benchmarks.federated_scale", args, FLAGS.timeout, 1500)
  row.update(result or {"error": error})
  row["subprocess_wall_seconds"] = wall
  if "error" in row:
    print(f"K={k} {name} {path_kind}: FAILED {row['error'][-300:]}", flush=True)
  else:
    print(
      f"K={k} {name} {path_kind}: {row['ms_per_round']:.1f} ms/round, peak RSS "
      f"{row['peak_rss_gib']:.2f} GiB, data {row['federated_data_bytes'] / 2**30:.2f} GiB "
      f"({'disk' if row['disk_bytes'] else 'memory'}), state "
      f"{row['sim_state_bytes'] / 2**30:.2f} GiB, build {row['data_build_seconds']:.0f} s"
      + (
        f", client state {row['client_state_disk_bytes_per_sampled_client']:.0f} B of disk "
        f"per sampled client ({row['client_state_row_bytes']} B of state)"
        if "client_state_disk_bytes" in row
        else ""
      ),
      flush=True,
    )
  return row


def main(argv):
  del argv
  if FLAGS.worker:
    worker()
    return
  from benchmarks import _common as C

  for name in FLAGS.algorithms:
    if name not in ("fedavg", "scaffold", "local_scgd"):
      raise app.UsageError(f"--algorithms: unknown {name!r}; choose fedavg, scaffold, local_scgd")
  machine = C.machine_info()
  print(
    f"machine: {machine['cpu_model']} x{machine['cpu_count']}, load {machine['load_average_start']}"
  )
  rows = []
  store_dir = FLAGS.store_dir or tempfile.mkdtemp(prefix="fedco-scale-")
  for k in [int(s) for s in FLAGS.sizes]:
    for name in FLAGS.algorithms:
      for path_kind in FLAGS.paths:
        rows.append(run_one(k, name, path_kind, store_dir))
  if not FLAGS.store_dir:  # the stores this run wrote into its own temporary folder
    shutil.rmtree(store_dir, ignore_errors=True)
  ran = {(r["clients"], r["algorithm"], r["path"]): r for r in rows if "rounds_per_s" in r}
  versus = {}
  for name in FLAGS.algorithms:
    base = ran.get((10_000, name, "in_memory"))
    big = ran.get((1_000_000, name, "streamed"))
    if base and big:
      versus[name] = {
        "streamed_1e6_ms_per_round": big["ms_per_round"],
        "in_memory_1e4_ms_per_round": base["ms_per_round"],
        "ratio": big["ms_per_round"] / base["ms_per_round"],
        "peak_rss_gib_1e6_streamed": big["peak_rss_gib"],
      }
  out = {
    "benchmark": "federated_scale",
    "timestamp": C.timestamp(),
    "config": {
      "sizes": [int(s) for s in FLAGS.sizes],
      "algorithms": list(FLAGS.algorithms),
      "clients_per_round": FLAGS.clients_per_round,
      "local_steps": LOCAL_STEPS,
      "batch_size": BATCH,
      "rounds_per_call": FLAGS.rounds,
      "repeats": FLAGS.repeats,
      "data": "Synthetic(1, 1)-style, 60 features, 10 classes, n_k = min(5 + LogNormal(2, 1), 60)",
      "model": "multinomial logistic regression",
      "max_gib": FLAGS.max_gib,
    },
    "machine": machine,
    "load_average_end": C.load_average(),
    "results": rows,
    "target": "K = 10^6 with 100 per round under 4 GiB peak RSS, rounds within 2x of the "
    "in-memory path at K = 10^4",
    "streamed_path": "examples read per chunk from a fedco.data.ClientStore on disk; the "
    "persistent client state (SCAFFOLD's control variates) on disk too "
    "(fedco.runtime.streaming.StateStore), only the chunk's clients' rows on the device",
    "million_clients_streamed_vs_ten_thousand_in_memory": versus,
  }
  C.write_json(FLAGS.out, out)
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  app.run(main)
