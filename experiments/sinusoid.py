r"""E3: federated sinusoid meta-regression (paper 003, Sec. 5.1), fully offline.

Tasks ``y = A sin(x + b pi / 5)``, ``x ~ U[-5, 5]``: the 25 training tasks ``A, b in {1..5}``
are spread evenly at random over ``config.num_clients = 5`` clients; every local step each
client's episode (``batch_size = 1``) is a meta-batch of ``tasks_per_step = 3`` of its tasks,
``shots = 10`` support and ``query_shots = 10`` query points each; ``test_tasks = 600``
unseen test tasks with ``A ~ U[0.1, 5]``, ``b ~ U[0, 5]``. Model: MLP 1-40-40-1 with ReLU
(``hidden``); MAML inner lr ``inner_lr = 0.001``, ``inner_steps = 1``, second order
(``first_order = False``). Problem layout: :mod:`fedco.problems.maml` (an example is an
episode over all of a client's task slots, so trackers keep one memory per task, as the
paper does for Local-SCGDM and Local-MOML). The compared methods are ``config.methods``,
with the paper's settings and ``local_steps = 5``, 600 rounds (3000 meta-iterations):

* ``local_scgdm`` (Local-SCGDM): ``learning_rate`` (eta) 1, ``beta = 0.01``, ``alpha = 0.8``,
  ``gamma = 0.7``;
* ``comfedl`` (Local-BSGD = ComFedL-MAML): ``learning_rate = 0.01``;
* ``local_scgd`` (Local-SCGD): ``learning_rate = 0.01``, ``gamma = 0.9``;
* ``local_moml`` (Local-MOML): ``learning_rate = 0.01``, ``beta = 0.7``.

Local-SCGD(M) average their tracker ``u`` over clients every round (SPEC 2.2, 2.3). Here ``u``
is each client's table of per-task memories, so the average mixes slot ``t`` of different
clients (different tasks); with inner lr 0.001 the adapted parameters of all tasks are within
``0.001 * grad`` of ``w``, so the mix is small, and Local-SCGDM's tracker recovers at rate
``gamma * eta = 0.7`` per step. Local-MOML sends only ``w``.

Every run has the same ``rounds * local_steps`` meta-iterations: a method with its own
``local_steps`` (or the ``local_steps`` ablation) runs ``rounds * local_steps / its
local_steps`` rounds and evaluates at the same meta-iterations (``eval_every`` is in rounds
at the shared ``local_steps``). Reported per evaluation (the meta-iteration is ``round *
local_steps``): ``train_mse`` (post-adaptation query MSE over the 25 training tasks, 4 fresh
draws each), ``val_mse`` (post-adaptation query MSE on the unseen test tasks; the test set is
the same for every seed and method, so comparisons are paired) and ``val_mse_before``
(before adaptation). Final values are those of the last evaluated round; ``*_tail`` average
the evaluations past 80% of the meta-iterations. ``config.ablation = "gamma" | "alpha" |
"local_steps"`` runs Local-SCGDM's ablations (paper Figs. 3-5) over
``config.ablation_values`` instead of the methods.

    python -m experiments.main --config=experiments/configs/sinusoid.py --workdir=runs/e3
    python -m experiments.main --config=experiments/configs/sinusoid.py \
        --config.ablation=gamma --workdir=runs/e3_gamma

Besides the runner's outputs, the summary holds ``local_scgdm_val_below_<label>`` per seed;
figures: ``mse.png`` (training and validation MSE against
meta-iterations, mean +- std over seeds) and ``fit.png`` (an unseen task, ``y = 2.5 sin(x +
1.5 pi / 5)`` as in the paper's Fig. 1, before and after adaptation, first seed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

import fedco
from fedco import extend
from fedco.data import sinusoid as sinusoid_data
from fedco.experiment import outputs, runner
from fedco.models.mlp import MLP, init_mlp
from fedco.problems.maml import MAML

ABLATION_DEFAULTS = {
  "gamma": (0.3, 0.5, 0.7, 0.9),
  "alpha": (0.5, 0.7, 0.8, 0.9),
  "local_steps": (1, 2, 5, 10),
}
# Local-SCGDM at the paper's settings, eta (learning_rate) 1: the ablations' base by default
SCGDM_DEFAULTS = {"beta": 0.01, "alpha": 0.8, "gamma": 0.7}
TEST_SEED = 12345  # one unseen test set for every seed and method (paired comparisons)
FIT_TASK = (2.5, 1.5)  # paper 003 Fig. 1: y = 5/2 sin(x + 3/2 * pi/5)
NUM_TRAIN_TASKS = 25
TAIL = 0.8  # *_tail: the evaluations past this fraction of the meta-iterations
RECORD_KEYS = ("train_mse", "val_mse", "val_mse_before")
TABLE_KEYS = ("val_mse", "train_mse", "val_mse_tail", "val_mse_before")
PROGRESS = "val_mse"
SEEDS_IN_ONE_PROGRAM = True  # its seeds differ only in data, model and metrics_data


def check(config) -> None:
  """E3's own fields (``ValueError`` naming ``--config.<field>``)."""
  for name in (
    "inner_steps",
    "num_clients",
    "tasks_per_step",
    "shots",
    "query_shots",
    "test_tasks",
    "episodes_per_client",
  ):
    extend.positive_int(f"--config.{name}", config[name])
  extend.positive("--config.inner_lr", config.inner_lr)
  if not isinstance(config.first_order, bool):
    raise ValueError(f"--config.first_order must be a bool, got {config.first_order!r}")
  outputs.check_int_list("--config.hidden", config.hidden, 1)
  if NUM_TRAIN_TASKS % config.num_clients:
    raise ValueError(
      f"--config.num_clients must divide the {NUM_TRAIN_TASKS} training tasks "
      f"evenly (1, 5 or 25), got {config.num_clients}"
    )
  per_client = NUM_TRAIN_TASKS // config.num_clients
  if config.tasks_per_step > per_client:
    raise ValueError(
      f"--config.tasks_per_step must be at most the {per_client} tasks of a "
      f"client, got {config.tasks_per_step}"
    )
  iterations = config.rounds * config.local_steps
  values = runner.ablation(config, ABLATION_DEFAULTS)
  if config.ablation == "local_steps":
    for v in values:
      if iterations % v:
        raise ValueError(
          f"--config.ablation_values must divide the {iterations} "
          f"meta-iterations (config.rounds * config.local_steps), got {v}"
        )
  elif values:
    base = ablation_base(config, runner.methods(config))
    for v in values:
      base.build(config_field="--config.ablation_values", **{config.ablation: v})


def ablation_base(config, found) -> runner.Method:
  """The config's (first) Local-SCGDM method, or Local-SCGDM at the paper's settings."""
  return next((m for m in found if m.algorithm == "local_scgdm"), None) or runner.Method(
    "local_scgdm", "local_scgdm", dict(SCGDM_DEFAULTS), 1.0, config.local_steps
  )


def methods(config, setup) -> List[runner.Method]:
  """The config's methods, or Local-SCGDM's ablation; each with the ``rounds`` and
  ``eval_every`` of the shared meta-iterations among its settings."""
  del setup
  found = runner.methods(config)
  values = runner.ablation(config, ABLATION_DEFAULTS)
  if values:
    found = runner.ablated(config, ablation_base(config, found), values)
  return [
    dataclasses.replace(m, problem={**m.problem, **runner.same_iterations(config, m)})
    for m in found
  ]


def _episode(arrays):
  return {k: jnp.asarray(v) for k, v in arrays.items() if k not in ("amplitude", "phase")}


@dataclasses.dataclass(frozen=True)
class Shared:
  """What every run shares (``setup``'s result).

  Attributes:
    model: the MLP.
    meta: the MAML problem's helper (:class:`fedco.problems.maml.MAML`).
    test: the unseen test tasks (one episode, the same for every seed and method).
    problem: the MAML problem.
  """

  model: MLP
  meta: MAML
  test: Dict[str, Any]
  problem: fedco.Problem


@dataclasses.dataclass(frozen=True)
class PerSeed:
  """What one seed's runs share (``prepare``'s result): ``fedco.simulate``'s arguments.

  Attributes:
    problem: the MAML problem (``setup``'s).
    data: the seed's client episodes.
    params: the seed's initial model.
    metrics_fn: ``metrics_fn(params, tasks)``: query MSE after adaptation on the training
      and test tasks, and before it on the test tasks.
    metrics_data: ``metrics_fn``'s tasks, ``{"train", "test"}``.
  """

  problem: fedco.Problem
  data: fedco.FederatedData
  params: Any
  metrics_fn: Callable
  metrics_data: Dict[str, Any]


def setup(config) -> Shared:
  """The model, the MAML problem and the unseen test tasks (one set for every run)."""
  model = MLP(hidden=tuple(int(h) for h in config.hidden), out=1)
  meta = MAML(model.apply, config.inner_lr, config.inner_steps, config.first_order)
  test = _episode(
    sinusoid_data.unseen_tasks(
      TEST_SEED, num_tasks=config.test_tasks, shots=config.shots, query_shots=config.query_shots
    )
  )
  return Shared(model=model, meta=meta, test=test, problem=meta.problem("sinusoid_maml"))


def prepare(config, seed, setup) -> PerSeed:
  """A seed's client episodes, initial model and metrics (``fedco.simulate``'s arguments)."""
  fed, tasks = sinusoid_data.federated(
    seed,
    num_clients=config.num_clients,
    episodes_per_client=config.episodes_per_client,
    shots=config.shots,
    query_shots=config.query_shots,
    tasks_per_step=config.tasks_per_step,
  )
  train = _episode(
    sinusoid_data.training_eval_episode(
      tasks, TEST_SEED, shots=config.shots, query_shots=config.query_shots
    )
  )
  meta = setup.meta

  def metrics_fn(w, d):  # the tasks are an argument: every seed's run is one program
    return {
      "train_mse": jnp.mean(meta.adapted_losses(w, d["train"])),
      "val_mse": jnp.mean(meta.adapted_losses(w, d["test"])),
      "val_mse_before": jnp.mean(meta.adapted_losses(w, d["test"], steps=0)),
    }

  return PerSeed(
    problem=setup.problem,
    data=fed,
    params=init_mlp(setup.model, 1, seed),
    metrics_fn=metrics_fn,
    metrics_data={"train": train, "test": setup.test},
  )


def build(config, method, seed, prepared) -> runner.Run:
  del seed
  return runner.Run(
    prepared.problem,
    method.build(),
    prepared.data,
    prepared.params,
    metrics_fn=prepared.metrics_fn,
    metrics_data=prepared.metrics_data,
    simulate={"evaluate": False},
    record_keys=RECORD_KEYS,
    **runner.same_iterations(config, method),
  )


def finish(config, method, seed, result, final):
  """The final meta-iteration and the ``*_tail`` means."""
  del seed
  rounds = np.flatnonzero(result.metrics["evaluated"])  # the evaluated rounds - 1
  late = (rounds + 1) * method.local_steps > TAIL * config.rounds * config.local_steps
  tail = rounds[late] if late.any() else rounds[-1:]
  final["iteration"] = final["round"] * method.local_steps
  for key in ("val_mse", "train_mse"):
    final[f"{key}_tail"] = float(np.mean(np.asarray(result.metrics[key])[tail]))


def summarize(config, outcome) -> Dict[str, Any]:
  summary = {
    "ablation": config.ablation,
    "rounds": config.rounds,
    "local_steps": config.local_steps,
    "iterations": config.rounds * config.local_steps,
  }
  finals = outcome.finals
  if "local_scgdm" in finals:
    val = lambda label, seed: finals[label].get(seed, {}).get("val_mse", float("nan"))
    for other in finals:
      if other != "local_scgdm":
        summary[f"local_scgdm_val_below_{other}"] = {
          seed: val("local_scgdm", seed) < val(other, seed) for seed in outcome.seeds
        }
  return summary


def plot(wd, config, outcome):
  """``mse.png``: training and validation MSE against meta-iterations, mean +- std over seeds;
  ``fit.png``: see :func:`plot_fit`."""
  panels = (("train_mse", "training tasks"), ("val_mse", "unseen test tasks"))
  fig = outputs.curves(
    outcome.records,
    outcome.labels,
    panels,
    title="sinusoid, post-adaptation query MSE",
    x="meta-iteration (round x local_steps)",
    steps={m.label: m.local_steps for m in outcome.methods},
    finals=outcome.finals,
  )
  wd.save_figure(fig, "mse.png")
  first = outcome.seeds[0]
  plot_fit(
    wd,
    {
      label: outcome.results[(label, first)].params
      for label in outcome.labels
      if (label, first) in outcome.results
    },
    outcome.setup.meta,
    config,
  )


def plot_fit(wd, fitted, meta, config):
  """The paper's Fig. 1 task, fitted from ``shots`` support points, before/after adapting
  (``fitted``: the first seed's models)."""
  amplitude, phase = FIT_TASK
  rng = np.random.default_rng(TEST_SEED)
  sx, sy = sinusoid_data.draw_points(rng, np.float32(amplitude), np.float32(phase), config.shots)
  grid = np.linspace(-5, 5, 200, dtype=np.float32)[:, None]

  @jax.jit
  def curves(params, sx, sy, grid):
    adapted = meta.adapt(params, sx, sy, first_order=True)
    predict = lambda p: jax.vmap(lambda x: meta.apply_fn(p, x))(grid)[:, 0]
    return predict(params), predict(adapted)

  fig = outputs.figure(figsize=(6, 4))
  ax = fig.add_subplot()
  ax.plot(
    grid[:, 0], sinusoid_data.sinusoid(grid[:, 0], amplitude, phase), "k", label="ground truth"
  )
  ax.scatter(sx[:, 0], sy[:, 0], c="k", marker="x", zorder=3, label="support shots")
  for i, (label, params) in enumerate(fitted.items()):
    before, after = curves(params, sx, sy, grid)
    # markers at staggered points keep curves that coincide apart
    (line,) = ax.plot(
      grid[:, 0],
      after,
      marker=outputs.MARKERS[i % len(outputs.MARKERS)],
      markersize=4,
      markevery=(i * 20 // len(fitted), 20),
      label=f"{label} (adapted)",
    )
    ax.plot(grid[:, 0], before, "--", color=line.get_color(), alpha=0.5, linewidth=1)
  ax.set_title(
    f"unseen task y = {amplitude:g} sin(x + {phase:g} pi/5); dashed: before "
    f"{config.inner_steps} step(s) at lr {config.inner_lr:g}",
    fontsize=8,
  )
  ax.set(xlabel="x", ylabel="y")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  wd.save_figure(fig, "fit.png")
