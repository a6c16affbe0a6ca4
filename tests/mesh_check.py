"""Run every algorithm on one device and on an 8-device clients mesh; print max differences.

Executed by tests/test_mesh.py in a subprocess with
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` (the flag must precede jax's import).
Prints one JSON line per (algorithm, participation) with the largest absolute difference of
the final model and of the objective trajectory. Every configuration is traced into one
program per side (:func:`compile_all`, shared with ``tests/multihost_worker.py``), so the
whole check compiles two large programs (plus two inits) instead of 48 runs and 48 inits.
Both sides call the simulator's traced ``_init`` and ``_run_rounds`` as ``simulate`` does;
the public ``Simulator.init``/``run``/``simulate`` path on a mesh (placement, host fetch)
is covered by the other tests of ``tests/test_mesh.py`` and by ``tests/test_multihost.py``.
"""

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco.runtime import rounds as rounds_lib
from tests import registry as test_registry

# every registry configuration (settings from each algorithm's registration, 3 local steps),
# derived so that a new algorithm is checked too, but these five, which the contract tests
# run in simulate: GCIVR and Local-MOML (the costliest programs), FedMAML (= Per-FedAvg),
# FedYogi and FedAdagrad (FedAdam's code but for the second-moment rule)
SKIPPED = ("gcivr", "local_moml", "fedmaml", "fedyogi", "fedadagrad")
LABELS = tuple(label for label in test_registry.CASES if label not in SKIPPED)


def registry(num_rows=None):
  """``{label: (problem, algorithm)}`` from ``fedco.ALGORITHMS`` (``tests/registry.py``);
  ``num_rows`` sizes primal-dual DRO's row weights (default: this script's 10 clients)."""
  num_rows = NUM_ROWS if num_rows is None else num_rows
  configs = {}
  for label in LABELS:
    algorithm = test_registry.build(label, local_steps=3, num_examples=num_rows)
    configs[label] = (test_registry.problem_for(algorithm), algorithm)
  return configs


NUM_ROWS = sum(4 + 3 * k for k in range(10))  # the clients' rows in main()
SAMPLED = (
  "comfedl",
  "feddro",
  "mbsgd",
  "drfa",
  "primal_dual_dro",
  "tr_maml",
)  # averaging, every-step, round-start, aggregator


def compile_all(configs, data, mesh, *, x0, seed, rounds, batch_size, **simulator_options):
  """Every configuration of ``configs`` from ONE compiled program.

  ``configs`` is a list of ``(label, problem, algorithm, clients_per_round)``, optionally
  with a fifth entry: fields of the simulator's ``RunConfig`` to replace. Each runs as
  ``fedco.simulate`` runs it (``Simulator.init``'s ``_init``, then ``Simulator.run``'s
  ``_run_rounds`` for ``rounds`` rounds), but all of them are traced into one ``jax.jit`` for
  the inits and one for the rounds: compiling a few large programs costs about half as much
  as one program per configuration. Each configuration is traced under
  ``jax.named_scope(label)``, so every compiled instruction names the configuration it
  belongs to in its ``op_name``. Returns ``(outputs, compiled)``: ``outputs[i]`` is
  configuration ``i``'s ``(final state, metrics)`` and ``compiled`` is the rounds program.
  ``simulator_options`` go to every ``fedco.Simulator`` (e.g. ``evaluate=False``).
  """
  labels = [c[0] for c in configs]
  sims = [
    fedco.Simulator(
      problem, alg, data, batch_size=batch_size, clients_per_round=m, mesh=mesh, **simulator_options
    )
    for _, problem, alg, m, *_ in configs
  ]
  for sim, config in zip(sims, configs):
    if len(config) > 4:  # traced below from sim.config
      sim.config = dataclasses.replace(sim.config, **config[4])
  data = sims[0].data  # the same for every simulator (replicated once on a mesh)
  x0, key = jnp.asarray(x0), jax.random.PRNGKey(seed)  # as Simulator.init(x0, seed)
  replicated = None
  if mesh is not None:
    replicated = sims[0]._replicated
    x0, key = jax.device_put((x0, key), replicated)

  def scoped(fn):
    """``fn(sim, own, *shared)`` for every configuration (``own``: its entry of
    ``per_config``), each traced in a scope named by its label."""

    def all_configs(per_config, *shared):
      outs = []
      for label, sim, own in zip(labels, sims, per_config):
        with jax.named_scope(label):
          outs.append(fn(sim, own, *shared))
      return outs

    return all_configs

  placed = {} if mesh is None else {"out_shardings": replicated}  # as Simulator.run places it
  states = jax.jit(
    scoped(lambda sim, _, x, k, d: rounds_lib.init_state(sim.config, x, k, d)), **placed
  )([None] * len(sims), x0, key, data)
  run_all = scoped(lambda sim, state, d: rounds_lib.run_rounds(sim.config, state, d, rounds))
  compiled = jax.jit(run_all).lower(states, data).compile()
  return compiled(states, data), compiled


def main():
  assert jax.device_count() == 8, jax.devices()
  rng = np.random.default_rng(0)
  clients = [
    {"r": rng.normal(0.1 * k, 1.0, size=(4 + 3 * k, 3)).astype(np.float32)} for k in range(10)
  ]
  data = fedco.FederatedData.from_clients(clients)
  names = sys.argv[1:] or list(registry())
  # 10 clients -> 16 slots for all; 3 sampled -> 8 slots for one algorithm per server kind
  configs = [
    (f"{name}_m{m}", *registry()[name], m)
    for name in names
    for m in ((None, 3) if name in SAMPLED else (None,))
  ]
  compiled = [
    compile_all(configs, data, mesh, x0=jnp.full((3,), 0.1), seed=3, rounds=4, batch_size=4)
    for mesh in (None, fedco.runtime.client_mesh(8))
  ]
  runs = [outputs for outputs, _ in compiled]
  # The client axis is laid along the mesh: each round pads the 10 clients to 16 slots,
  # 2 rows per device, so the round's [slots, 3] leaves are f32[2,3] in the 8-device program
  # where the one-device program has f32[10,3]. (Persistent client states stay replicated
  # between rounds, [10, 3] on every device; a few unrelated [2, 3] values exist anyway.)
  texts = [program.as_text() for _, program in compiled]
  print(
    json.dumps(
      {
        "check": "client_layout",
        **{
          f"{side}_{shape}": text.count(f"f32[{shape},3]")
          for side, text in zip(("one_device", "eight_devices"), texts)
          for shape in (2, 10, 16)
        },
      }
    ),
    flush=True,
  )
  for (label, _, _, m), (one, one_metrics), (eight, eight_metrics) in zip(configs, *runs):
    one, eight = np.asarray(one.server["params"]), np.asarray(eight.server["params"])
    print(
      json.dumps(
        {
          "algorithm": label.rsplit("_m", 1)[0],
          "clients_per_round": m,
          "params": float(np.max(np.abs(one - eight))),
          "objective": float(
            np.max(
              np.abs(np.asarray(one_metrics["objective"]) - np.asarray(eight_metrics["objective"]))
            )
          ),
          "same_clients": bool(np.array_equal(one_metrics["clients"], eight_metrics["clients"])),
          "moved": float(np.max(np.abs(one - 0.1))),
        }
      ),
      flush=True,
    )


def sweep_check():
  """``fedco.sweep`` with its runs laid along 8 devices against one device: 8 runs (one per
  device) and 9 runs (padded to 16), with the per-device shards of the 8-run states."""
  from fedco.problems import portfolio  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(1)
  data = fedco.FederatedData.from_clients(
    [{"r": rng.normal(0.2 * k, 1.0, size=(3 + k, 3)).astype(np.float32)} for k in range(5)]
  )
  out = {"check": "sweep"}
  for rates, seeds in (((0.05, 0.1, 0.2, 0.3), (0, 1)), ((0.05, 0.1, 0.2), (0, 1, 2))):
    kw = dict(
      rounds=3,
      grid={"learning_rate": list(rates)},
      seeds=seeds,
      algorithm_kwargs={"local_steps": 2, "beta": 0.5},
      batch_size=4,
      clients_per_round=3,
    )
    one = fedco.sweep(portfolio(1.0), fedco.feddro, data, jnp.zeros(3), **kw)
    eight = fedco.sweep(
      portfolio(1.0), fedco.feddro, data, jnp.zeros(3), mesh=fedco.runtime.client_mesh(8), **kw
    )
    runs = len(one.runs)
    out[f"runs_{runs}_params"] = float(
      np.max(np.abs(np.asarray(one.params) - np.asarray(eight.params)))
    )
    out[f"runs_{runs}_objective"] = float(
      np.max(np.abs(one.metrics["objective"] - eight.metrics["objective"]))
    )
    out[f"runs_{runs}_shape"] = list(np.shape(eight.params))
    if runs == 8:
      leaf = eight.state.server["params"]
      out["shard_shapes"] = sorted({tuple(s.data.shape) for s in leaf.addressable_shards})
      out["shard_devices"] = len({s.device for s in leaf.addressable_shards})
  # three seeds, each its own partition of the same examples and its own initial model
  parts = [np.random.default_rng(s).permutation(25).reshape(5, 5) for s in range(3)]
  per_seed = fedco.runtime.PerSeed(
    [fedco.FederatedData.from_index_lists({"r": data.examples["r"]}, list(p)) for p in parts]
  )
  starts = fedco.runtime.PerSeed([jnp.full(3, 0.1 * s) for s in range(3)])
  kw = dict(rounds=3, seeds=(0, 1, 2), batch_size=4, clients_per_round=3)
  one = fedco.sweep(portfolio(1.0), fedco.feddro(0.1, 2), per_seed, starts, **kw)
  eight = fedco.sweep(
    portfolio(1.0), fedco.feddro(0.1, 2), per_seed, starts, mesh=fedco.runtime.client_mesh(8), **kw
  )
  out["per_seed_params"] = float(np.max(np.abs(np.asarray(one.params) - np.asarray(eight.params))))
  out["per_seed_spread"] = float(np.ptp(np.asarray(one.params), axis=0).max())
  print(json.dumps(out), flush=True)


def uplink_check():
  """FedDRO with privacy (noise on the mean and clipping), compression (top-k with error
  feedback on the model, quantization on the every-step ``y``), 3 of 10 clients sampled and
  client dropout, through ``fedco.simulate`` on one device and on 8."""
  from fedco.problems import portfolio  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(2)
  data = fedco.FederatedData.from_clients(
    [{"r": rng.normal(0.1 * k, 1.0, size=(4 + 2 * k, 3)).astype(np.float32)} for k in range(10)]
  )
  kw = dict(
    rounds=4,
    batch_size=4,
    clients_per_round=3,
    participation=0.8,
    compression={
      "params": fedco.compression.top_k(0.5),
      "y": fedco.compression.stochastic_quantization(8),
    },
    privacy=fedco.privacy.gaussian(0.5, noise_multiplier=0.3),
  )
  runs = [
    fedco.simulate(portfolio(1.0), fedco.feddro(0.1, 2), data, jnp.full((3,), 0.1), mesh=mesh, **kw)
    for mesh in (None, fedco.runtime.client_mesh(8))
  ]
  one, eight = (np.asarray(r.params) for r in runs)
  print(
    json.dumps(
      {
        "check": "uplink",
        "params": float(np.max(np.abs(one - eight))),
        "objective": float(
          np.max(np.abs(runs[0].metrics["objective"] - runs[1].metrics["objective"]))
        ),
        "epsilon": [float(r.metrics["epsilon"][-1]) for r in runs],
        "moved": float(np.max(np.abs(one - 0.1))),
      }
    ),
    flush=True,
  )


def asynchronous_check():
  """FedBuff (6 clients in flight of 10, a buffer of 3, stragglers, a ring of 3 models so
  some reports are discarded) through ``fedco.simulate`` on one device and on 8: each
  buffer's 3 clients padded to the mesh, each from its own version's model."""
  rng = np.random.default_rng(3)
  data = fedco.FederatedData.from_clients(
    [{"a": rng.normal(0.1 * k, 1.0, size=(3 + k, 3)).astype(np.float32)} for k in range(10)]
  )
  problem = fedco.plain(lambda w, e: jnp.sum((w - e["a"]) ** 2))
  kw = dict(
    rounds=6,
    batch_size=None,
    evaluate=False,
    clients_per_round=3,
    delays=fedco.runtime.Delays(spread=0.5, jitter=0.5, straggler_fraction=0.3),
    asynchronous=fedco.runtime.Buffered(6, max_staleness=2),
  )
  runs = [
    fedco.simulate(problem, fedco.fedavg(0.1, 2), data, jnp.zeros(3), mesh=mesh, **kw)
    for mesh in (None, fedco.runtime.client_mesh(8))
  ]
  one, eight = (np.asarray(r.params) for r in runs)
  print(
    json.dumps(
      {
        "check": "asynchronous",
        "params": float(np.max(np.abs(one - eight))),
        "time": float(np.max(np.abs(runs[0].metrics["time"] - runs[1].metrics["time"]))),
        "clients_equal": bool(
          np.array_equal(runs[0].metrics["clients"], runs[1].metrics["clients"])
        ),
        "moved": float(np.max(np.abs(one))),
      }
    ),
    flush=True,
  )


if __name__ == "__main__":
  main()
  sweep_check()
  uplink_check()
  asynchronous_check()
