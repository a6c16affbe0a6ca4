"""The experiment skeleton: :func:`train_and_evaluate` runs an experiment from its config.

An experiment is a module holding its science only (``experiments/<name>.py`` in this
repository, or your own ``my_package.my_module``); this module owns the rest: the workdir
and its lock, config checks, checkpoints (resumed on rerun), the metric writers, the seeds
x methods loop through ``fedco.simulate`` (or each method's seeds through one
``fedco.sweep``), divergence notes, the final table, the trade-off figures and
``summary.json``.

**An experiment module** (or an instance of a subclass of
:class:`fedco.experiment.Experiment`, which names every hook with its default) defines
(only ``build``, ``TABLE_KEYS`` and ``PROGRESS`` are required; :mod:`~fedco.experiment.protocol`
refuses a misspelled hook, a hook of the wrong kind and one whose parameters cannot take
these arguments, in one line naming the hooks):

* ``TABLE_KEYS``: the final values its table shows (mean +- std over the seeds);
* ``PROGRESS``: the metric the progress bar shows;
* ``check(config)``: its own fields, checked (``ValueError`` naming ``--config.<field>``);
* ``setup(config)``: what every run shares (data loaded once), passed to ``prepare``;
* ``methods(config, setup)``: the runs (default: :func:`methods`; an ablation's variants);
* ``prepare(config, seed, setup)``: what the runs of one seed share (data, initial model);
* ``build(config, method, seed, prepared) -> Run``: one run's problem, algorithm, data,
  initial model and metrics;
* ``finish(config, method, seed, result, final)``: add values to a finished run's ``final``;
* ``summarize(config, outcome) -> dict``: the summary's own entries (the runner adds
  ``seeds``, ``settings``, ``methods``, ``table``, ``wall_seconds`` and ``machine``);
* ``plot(wd, config, outcome)``: its figures;
* ``report(summary) -> lines``: lines printed after the table;
* ``TRADEOFF``: ``{"epsilon" | "bytes_up": panels}``, each panel ``(metric, axis label[,
  "log"])``: the privacy and compression trade-off figures, drawn when a method has
  ``privacy`` or ``compression``.
* ``SEEDS_IN_ONE_PROGRAM = True``: ``build``'s runs of one method differ from seed to seed
  only in ``data``, ``params`` and ``metrics_data`` (the problem, algorithm and
  ``metrics_fn`` of the first seed serve them all), so its seeds run as one vmapped
  ``fedco.sweep`` program (per-seed inputs stacked; rows, checkpoint and resume as before;
  results equal separate runs up to float round-off). A run that diverges there is run
  again alone, so its note is ``fedco.simulate``'s; seeds whose inputs' shapes differ, or
  with a host evaluation, run one by one (so does ``--noseeds_together``).

**The config** (an ``ml_collections`` file: ``experiments/configs/<name>.py`` here) is the
only source of truth. Every config names the shared fields :data:`SHARED` the same way;
``methods`` holds one entry per compared method, keyed by the label every output uses,
with ``algorithm`` (a ``fedco.ALGORITHMS`` name) and that factory's own arguments; each
entry's ``learning_rate`` and ``local_steps`` are the shared values unless it sets them
(:func:`method_entries` declares them as placeholders, so
``--config.methods.<label>.learning_rate=`` always works).

**What every run reports** besides its ``metrics_fn``'s values: ``fedco.simulate``'s
(``objective``, the exact objective of the server model over every client's data, and
``client_losses``, unless ``Run(simulate={"evaluate": False})``; ``grad_norm`` with
``exact_grad_norm``; ``epsilon`` under privacy) after rounds 1, every ``eval_every`` and the
last (no row for the initial model), and in its final values ``seconds`` and ``bytes_up``
(the whole run's uploads).

**A run's identity** (its checkpoint folder) is derived here alone: the config without the
fields that only choose runs (:data:`CHOOSING`), the method's settings, the seed, the run's
schedule, a digest of its data and initial model, and of the source files of the experiment
module and the method's algorithm when they lie outside fedco (:func:`code_digest`); a
rerun with the same identity resumes, any change starts afresh.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import itertools
import pathlib
import sys
import time
import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import ml_collections
import numpy as np

import fedco
from fedco import extend
from fedco.experiment import outputs, protocol
from fedco.experiment.config_methods import (  # noqa: F401  (also runner.<name>, as before the split)
  CODECS,
  METHOD_KEYS,
  PARTICIPATION,
  UPLINK_KEYS,
  Method,
  ablated,
  ablation,
  check_batch_size,
  local_steps_ablation,
  method_entries,
  methods,
  same_iterations,
)
from fedco.experiment.identity import code_digest, digest, identity
from fedco.experiment.search import combine, grid_axes, search  # noqa: F401  (runner.<name>)
from fedco.experiment.tradeoff import TRADEOFF_AXES, tradeoff  # noqa: F401  (runner.<name>)
from fedco.runtime.checks import check_kinds

# Where a short ``config.experiment`` name is looked up: ``experiments.<name>``, this
# repository's experiments (or your own package of that name, first on the path).
PACKAGE = "experiments"


def experiments() -> tuple:
  """The modules of :data:`PACKAGE` with a ``build`` (no import: their sources are read)."""
  spec = importlib.util.find_spec(PACKAGE)
  folders = spec.submodule_search_locations if spec else None
  paths = [p for f in folders or () for p in pathlib.Path(f).glob("*.py")]
  return tuple(sorted(p.stem for p in paths if "\ndef build(" in p.read_text()))


# The fields every experiment config has (tests/test_configs.py checks each config).
SHARED = (
  "experiment",
  "seeds",
  "rounds",
  "local_steps",
  "learning_rate",
  "batch_size",
  "eval_every",
  "methods",
)


def simulate_kwargs(method: Method, run) -> Dict[str, Any]:
  """A run's ``fedco.simulate`` settings: the method's uplink (:meth:`Method.simulator_kwargs`),
  then the experiment's ``run.simulate``, then the method's own ``participation`` (a cohort
  or schedule the method chose wins over the experiment's)."""
  own = method.simulator_kwargs()
  participation = {k: own.pop(k) for k in PARTICIPATION if k in own}
  return {**own, **run.simulate, **participation}


# Config fields that choose which runs happen, not what a run is (left out of identities).
CHOOSING = (
  "experiment",
  "seeds",
  "methods",
  "ablation",
  "ablation_values",
  "grid",
  "select_seeds",
  "mode",
  "data_dir",
)


@dataclasses.dataclass(frozen=True)
class Options:
  """The driver's flags: how to run, never what (they are left out of run identities).

  Attributes:
    progress: a progress bar per run, and the table printed at the end; without it, notes
      that a run diverged or that the workdir's results are replaced still go to stderr.
    resume: resume runs from their checkpoints in the workdir (else start them over).
    checkpoint_every: rounds between a run's checkpoints.
    seeds_together: a method's seeds as one program where the module allows it
      (``SEEDS_IN_ONE_PROGRAM``).
    command: the command line that started the runs (the driver's own), recorded in
      ``summary.json`` as ``command`` so a merged result names what made it
      (``experiments/merge_workdirs`` collects them); empty: not recorded.

  Examples:
    >>> from fedco import experiment
    >>> experiment.Options(progress=False)
    Options(progress=False, resume=True, checkpoint_every=50, seeds_together=True, command='')
  """

  progress: bool = True
  resume: bool = True
  checkpoint_every: int = 50
  seeds_together: bool = True  # a method's seeds as one program (SEEDS_IN_ONE_PROGRAM)
  command: str = ""


@dataclasses.dataclass
class Run:
  """What an experiment's ``build`` returns: one (method, seed) run.

  Attributes:
    problem, algorithm, data, params: ``fedco.simulate``'s first four arguments.
    metrics_fn: evaluated on the server model every ``eval_every`` rounds.
    metrics_data: ``metrics_fn``'s second argument (held-out sets): passed into the compiled
      rounds, so the runs of all seeds compile to one program (the driver's compilation
      cache serves it), where data ``metrics_fn`` closes over is compiled into each run's.
    evaluate: a host evaluation ``fn(state) -> row`` that needs the whole state (personal
      models): run at round 0, every ``eval_every`` rounds and the last; then its rows are
      the run's metrics.
    rounds, eval_every: this run's own (default: the config's).
    simulate: ``fedco.simulate``'s other arguments (``exact_grad_norm=True``, ...).
    record_keys: the metrics kept for figures (default: every scalar or vector metric).

  Examples:
    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> import fedco
    >>> from fedco import experiment
    >>> x = np.arange(16.0, dtype=np.float32).reshape(2, 4, 2)
    >>> data = fedco.FederatedData.from_clients([{"x": c, "y": c.sum(1)} for c in x])
    >>> loss = lambda w, e: 0.5 * (e["x"] @ w - e["y"]) ** 2
    >>> run = experiment.Run(
    ...     fedco.plain(loss), fedco.fedavg(0.01, 2), data, jnp.zeros(2),
    ...     metrics_fn=lambda w, best: {"distance": jnp.linalg.norm(w - best)},
    ...     metrics_data=jnp.ones(2))
    >>> run.rounds is None  # the config's rounds
    True
  """

  problem: Any
  algorithm: Any
  data: Any
  params: Any
  metrics_fn: Optional[Callable] = None
  metrics_data: Any = None
  evaluate: Optional[Callable] = None
  rounds: Optional[int] = None
  eval_every: Optional[int] = None
  simulate: Dict[str, Any] = dataclasses.field(default_factory=dict)
  record_keys: Optional[Sequence[str]] = None


@dataclasses.dataclass
class Outcome:
  """Every run's results, for an experiment's ``summarize`` and ``plot``.

  Attributes:
    methods: the runs' methods, in order.
    seeds: the config's seeds.
    finals: ``{label: {seed: final values or a divergence note}}``.
    records: one dict per evaluated round of every run (``round``, ``method``, ``seed``,
      metrics), up to a divergence.
    results: ``{(label, seed): fedco.SimulationResult}`` of the runs that finished.
    per_method, table: :func:`outputs.seed_statistics` of ``finals`` over ``TABLE_KEYS``.
    setup: what the experiment's ``setup`` returned.

  Examples:
    >>> from fedco import experiment
    >>> outcome = experiment.Outcome([experiment.Method("fedavg", "fedavg", {}, 0.1, 5)], (0, 1))
    >>> outcome.labels, outcome.drawn()  # no evaluated rows yet
    (['fedavg'], [])
  """

  methods: List[Method]
  seeds: tuple
  finals: Dict[str, Dict[int, Dict[str, Any]]] = dataclasses.field(default_factory=dict)
  records: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  results: Dict[tuple, Any] = dataclasses.field(default_factory=dict)
  per_method: Dict[str, Any] = dataclasses.field(default_factory=dict)
  table: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
  setup: Any = None

  @property
  def labels(self) -> List[str]:
    """The methods' labels, in order."""
    return [m.label for m in self.methods]

  def drawn(self) -> List[str]:
    """The labels with at least one finite evaluation (a curve to draw)."""
    return [m.label for m in self.methods if any(r["method"] == m.label for r in self.records)]


def seeds(config, field: str = "seeds") -> tuple:
  """``config.<field>`` as distinct integers (``ValueError`` naming the field).

  Args:
    config: the experiment config.
    field: the field holding seeds (``"select_seeds"``: a grid search's).

  Returns:
    The seeds, in the config's order.

  Examples:
    >>> import ml_collections
    >>> from fedco import experiment
    >>> experiment.seeds(ml_collections.ConfigDict({"seeds": (0, 1, 2)}))
    (0, 1, 2)
  """
  given = config[field]
  try:
    values = tuple(int(s) for s in (given if not isinstance(given, int) else (given,)))
  except (TypeError, ValueError):
    raise ValueError(f"--config.{field} must be integers, got {given!r}") from None
  if any(v < 0 for v in values):  # a seed is a PRNG seed and names a run: >= 0
    raise ValueError(f"--config.{field} must be integers >= 0, got {given!r}")
  if not values:
    raise ValueError(f"--config.{field} must name at least one seed")
  if len(set(values)) != len(values):
    raise ValueError(f"--config.{field} must be distinct, got {values}")
  return values


def check_shared(config) -> None:
  """The shared fields, checked (``ValueError`` naming ``--config.<field>``)."""
  seeds(config)
  for name in ("rounds", "local_steps", "eval_every"):
    extend.positive_int(f"--config.{name}", config[name])
  extend.positive_int("--config.batch_size", config.batch_size, minimum=0)
  extend.positive("--config.learning_rate", config.learning_rate)
  if not isinstance(config.get("data_dir", ""), str):
    raise ValueError(
      f"--config.data_dir must be a folder path ('' for the default), got {config.data_dir!r}"
    )


def progress_chunk(rounds: int, eval_every: int, checkpoint_every: int) -> int:
  """Rounds per compiled chunk of an experiment's run: the progress bar moves once a chunk.

  The largest chunk of at most ``max(eval_every, rounds / 10)`` rounds (and 100) that
  divides the run into equal chunks between checkpoints, so the bar moves at least every
  tenth of the run and at every evaluation, and every chunk is the same compiled program
  (a scan's length is static). ``fedco.simulate``'s own default, one chunk of up to 100
  rounds, left a slow run (E4 on 2 cores: 30 minutes) at 0% until it ended.

  Args:
    rounds: the run's rounds.
    eval_every: rounds between its evaluations.
    checkpoint_every: rounds between its checkpoints.

  Returns:
    An int ``>= 1`` dividing ``rounds`` (and ``checkpoint_every`` when the run is longer).

  Examples:
    >>> from fedco.experiment.runner import progress_chunk
    >>> progress_chunk(12, 2, 50), progress_chunk(300, 10, 50), progress_chunk(7, 7, 50)
    (2, 25, 7)
  """
  target = min(100, max(eval_every, -(-rounds // 10)))
  span = np.gcd(rounds, checkpoint_every) if rounds > checkpoint_every else rounds
  return max(d for d in range(1, min(target, span) + 1) if span % d == 0)


# ---- the skeleton --------------------------------------------------------------------------


def experiment_module(name):
  """The module of experiment ``name`` (with a ``build``): a dotted name is your own module
  on ``sys.path``; a short one is ``experiments.<name>``, else a top-level module ``name``."""
  found = None
  given = (name,) if isinstance(name, str) and name else ()
  short = tuple(f"{PACKAGE}.{n}" for n in given if "." not in n)
  for candidate in short + given:
    try:
      spec = importlib.util.find_spec(candidate)
    except (ImportError, ValueError):  # a missing parent package
      continue
    if spec is not None:  # its own import errors are raised as they are
      found = importlib.import_module(candidate)
      if hasattr(found, "build"):
        return found
  if found is not None:
    raise ValueError(
      f"--config.experiment={name!r}: module {found.__name__} defines no build(config, "
      "method, seed, prepared) (see fedco.experiment.runner's hooks)"
    )
  ours = experiments()
  listed = f"; short names are the modules of {PACKAGE}/: {', '.join(ours)}" if ours else ""
  raise ValueError(
    f"--config.experiment must name a module with a build() on the Python path (a dotted "
    f"name such as my_package.my_module{listed}), got {name!r}"
  )


def check(config, module=None):
  """Checks ``config`` (the shared fields, then the experiment's ``check``); returns the
  experiment's module (``module``, else ``config.experiment``'s). ``ValueError`` naming the
  field."""
  if not isinstance(config, ml_collections.ConfigDict):
    raise ValueError(
      f"config must be an ml_collections.ConfigDict, got a {type(config).__name__}; wrap it: "
      "ml_collections.ConfigDict({...})"
    )
  experiment = protocol.of(module or experiment_module(config.get("experiment")))
  check_shared(config)
  experiment.check(config)
  return experiment


def train_and_evaluate(
  config, workdir, options: Options = Options(), *, module=None
) -> Dict[str, Any]:
  """Runs the experiment ``config.experiment`` and writes its outputs into ``workdir``.

  Every (seed, method) run goes through ``fedco.simulate``, or a method's seeds through one
  ``fedco.sweep`` (``SEEDS_IN_ONE_PROGRAM``), with streamed metrics and checkpoints (a
  rerun resumes finished and stopped runs); a run that diverges is reported with a note
  naming the field to change while the others go on. Bad config values raise a one-line
  ``ValueError`` before anything is written.

  Args:
    config: the experiment's ``ml_collections.ConfigDict`` (the shared fields
      :data:`fedco.experiment.runner.SHARED` and the experiment's own).
    workdir: the output directory (:class:`~fedco.experiment.outputs.Workdir`).
    options: how to run (progress, resume, checkpoints), never what.
    module: the experiment's module (the hooks this module's docstring lists); default: the
      module ``config.experiment`` names (``experiments.<name>``, or a dotted module).

  Returns:
    The summary (also written to ``summary.json``): ``table`` (the printed table: per
    method, ``TABLE_KEYS`` as ``"mean +- std"`` strings over the seeds that finished, and a
    divergence ``note``), ``methods`` (the numbers: ``methods[label][key]["mean"]`` /
    ``["std"]``, and ``per_seed`` final values or divergence notes), ``settings``,
    ``seeds``, ``wall_seconds``, ``machine`` and the module's own entries.

  Examples:
    An experiment defined in place (usually a module on the path, named by the config):

    >>> import tempfile, types
    >>> import jax.numpy as jnp
    >>> import ml_collections
    >>> import numpy as np
    >>> import fedco
    >>> from fedco import experiment
    >>> module = types.ModuleType("least_squares")
    >>> module.TABLE_KEYS, module.PROGRESS = ("objective",), "objective"
    >>> def build(config, method, seed, prepared):
    ...   x = np.random.default_rng(seed).normal(size=(2, 10, 3)).astype(np.float32)
    ...   data = fedco.FederatedData.from_clients([{"x": c, "y": c.sum(1)} for c in x])
    ...   loss = lambda w, e: 0.5 * (e["x"] @ w - e["y"]) ** 2
    ...   return experiment.Run(fedco.plain(loss), method.build(), data, jnp.zeros(3))
    >>> module.build = build
    >>> config = ml_collections.ConfigDict(dict(
    ...     experiment="least_squares", seeds=(0, 1), rounds=4, local_steps=2,
    ...     learning_rate=0.1, batch_size=0, eval_every=2,
    ...     methods=experiment.method_entries({"fedavg": {"algorithm": "fedavg"}})))
    >>> summary = experiment.train_and_evaluate(
    ...     config, tempfile.mkdtemp(), experiment.Options(progress=False), module=module)
    >>> summary["table"][0]["method"], sorted(summary["methods"]["fedavg"]["per_seed"])
    ('fedavg', [0, 1])
  """
  start, module = time.perf_counter(), check(config, module)
  setup = module.setup(config)
  runs = module.methods(config, setup)
  runs = methods(config) if runs is None else runs
  outcome = Outcome(runs, seeds(config), setup=setup)
  prepare = module.prepare
  seed0 = outcome.seeds[0]
  prepared = {seed0: prepare(config, seed0, setup)}
  first = [module.build(config, m, seed0, prepared[seed0]) for m in runs]  # before writing
  _check_first_runs(config, runs, first)
  build = lambda i, seed: (
    first[i] if seed == seed0 else module.build(config, runs[i], seed, prepared[seed])
  )
  wd, as_dict = outputs.Workdir(workdir), config.to_dict()
  _note_changed(workdir, outputs.changed_config(wd, as_dict), config)
  wd.write_config(as_dict)
  outputs.start_checkpoints(wd, {"resume": options.resume})
  writers = [
    fedco.runtime.JsonlWriter(wd.record(wd.file(outputs.METRICS))),
    fedco.runtime.CsvWriter(wd.record(wd.file(outputs.METRICS_CSV))),
  ]
  base = {k: v for k, v in as_dict.items() if k not in CHOOSING}
  source = code_digest(module.source)
  if source:  # your experiment's code: editing it starts its runs afresh
    base["module_sha256"] = source
  session = _Session(module, config, options, wd, writers, outcome, base)
  if options.seeds_together and module.SEEDS_IN_ONE_PROGRAM and len(outcome.seeds) > 1:
    prepared.update({s: prepare(config, s, setup) for s in outcome.seeds[1:]})
    for i, method in enumerate(runs):
      session.seeds(method, {s: build(i, s) for s in outcome.seeds})
  else:
    for seed in outcome.seeds:
      if seed not in prepared:  # one seed's data at a time
        prepared = {seed: prepare(config, seed, setup)}
        first.clear()  # the first seed's runs are done: their data go
        session.digests.clear()
      for i, method in enumerate(runs):
        session.one(method, seed, build(i, seed))
  outcome.per_method, outcome.table = outputs.seed_statistics(outcome.finals, module.TABLE_KEYS)
  _warn_unreported(module, outcome)
  name = config.get("experiment") or module.name
  summary = {"experiment": name, "seeds": list(outcome.seeds)}
  summary.update(module.summarize(config, outcome))
  summary.update(
    methods=outcome.per_method, table=outcome.table, settings={m.label: m.settings() for m in runs}
  )
  module.plot(wd, config, outcome)
  for x in ("epsilon", "bytes_up"):
    entry = tradeoff(wd, runs, outcome.finals, x, module.TRADEOFF.get(x, ()))
    if entry is not None:
      summary[f"{x}_tradeoff"] = entry
  summary["wall_seconds"] = time.perf_counter() - start
  if options.command:
    summary["command"] = options.command
  summary["machine"] = outputs.machine_info()
  wd.write_summary(summary)
  _print_summary(module, summary, options.progress)
  return summary


def _check_first_runs(config, runs, first) -> None:
  """Refuses, before any run, a method of the wrong kind for its problem and a batch
  larger than every client (decision 98), naming the flag to change."""
  for method, run in zip(runs, first):
    try:
      check_kinds(run.problem, run.algorithm)
    except ValueError as err:
      raise ValueError(f"--config.methods.{method.entry}.algorithm: {err}") from None
  for run in first:
    check_batch_size(config.batch_size, run.data)


def _note_changed(workdir, changed, config) -> None:
  """Says on stderr (also without ``--progress``) that ``workdir``'s results are about to
  be replaced: by a config that differs in ``changed``, or one that leaves methods out."""
  left_out = [  # "methods.<label>": a whole method only the previous run had
    c[8:]
    for c in changed
    if c.startswith("methods.") and "." not in c[8:] and c[8:] not in config.methods
  ]
  if changed and len(left_out) == len(changed):  # only methods this run does not run
    print(
      f"note: {workdir} holds the results of {', '.join(left_out)}, which this run leaves out "
      "(--methods); this run's results replace those when it completes, and their "
      "checkpoints stay: a run with them gives them back without running again",
      file=sys.stderr,
      flush=True,
    )
  elif changed:
    print(
      f"note: {workdir} holds the results of another config ({', '.join(changed[:5])}"
      f"{' ...' if len(changed) > 5 else ''} differ); runs whose settings changed start "
      "afresh, and this run's results replace those when it completes",
      file=sys.stderr,
      flush=True,
    )


def _print_summary(module, summary, progress: bool) -> None:
  """The table, the module's report lines and the wall time (with ``progress``); else only
  the notes of runs that diverged, on stderr."""
  if progress:
    print(outputs.format_table(summary["table"]))
    for line in module.report(summary):
      print(line)
    print(f"wall time {summary['wall_seconds']:.1f} s")
    return
  for row in summary["table"]:
    if "note" in row:
      print(f"note: {row['method']}: {row['note']}", file=sys.stderr, flush=True)


def _warn_unreported(module, outcome: Outcome) -> None:
  """A warning when ``TABLE_KEYS`` or ``PROGRESS`` name a value no finished run reports (a
  misspelled metric: an empty table column, a progress bar without it)."""
  finished = [f for by_seed in outcome.finals.values() for f in by_seed.values()]
  finished = [f for f in finished if "diverged" not in f]
  known = set().union(*finished) if finished else set()
  unknown = [k for k in dict.fromkeys((*module.TABLE_KEYS, module.PROGRESS)) if k not in known]
  if finished and unknown:
    warnings.warn(
      f"{module.name}'s TABLE_KEYS / PROGRESS name {unknown}, which no run reports; "
      f"the runs' final values are {sorted(known)}",
      stacklevel=3,
    )


@dataclasses.dataclass
class _Session:
  """What the runs of one :func:`train_and_evaluate` share: the experiment, where and how
  they write, and the :class:`Outcome` they fill."""

  module: Any
  config: Any
  options: Options
  wd: outputs.Workdir
  writers: List[Any]
  outcome: Outcome
  base: Dict[str, Any]  # the config's run-defining fields (CHOOSING left out)
  digests: Dict[tuple, tuple] = dataclasses.field(default_factory=dict)

  def schedule(self, run: Run) -> Dict[str, Any]:
    return {
      "rounds": run.rounds or self.config.rounds,
      "eval_every": run.eval_every or self.config.eval_every,
      "batch_size": self.config.batch_size or None,
    }

  def identity(self, method: Method, seed: int, run: Run) -> Dict[str, Any]:
    """:func:`identity` with the digest of the run's data and initial model, hashed once for
    the runs holding the same objects (kept here, so that their ids stay theirs)."""
    key = (id(run.data), id(run.params))
    if key not in self.digests:
      self.digests[key] = (digest((run.data, run.params)), run.data, run.params)
    based = {**self.base, "data_sha256": self.digests[key][0]}
    return identity(based, method, seed, self.schedule(run))

  def directory(self, name: str, settings) -> str:
    """A run's checkpoint folder, listed in the workdir's manifest."""
    return self.wd.record(outputs.run_checkpoint_dir(self.wd.path, name, settings))

  def seeds(self, method: Method, built: Dict[int, Run]) -> None:
    """One method's seeds (``built``: seed -> run) as one ``fedco.sweep`` program: per-seed
    data, initial models and held-out sets stacked, rows streamed per run, one checkpoint
    for them all. A run diverging in it is run again alone through :meth:`one`, so its
    note and rows are ``fedco.simulate``'s. Seeds that cannot share a program (a host
    evaluation, other schedules, other data shapes) run one by one."""
    seeds, runs = list(built), list(built.values())
    run, schedule = runs[0], self.schedule(runs[0])
    inputs = ("data", "params", "metrics_data")
    apart = (
      "a host evaluation"
      if run.evaluate is not None
      else "flipped labels"
      if method.flips_labels
      else "other schedules"
      if any(self.schedule(r) != schedule for r in runs)
      else "other data shapes"
      if not all(fedco.runtime.vmapped.stackable([getattr(r, n) for r in runs]) for n in inputs)
      else None
    )
    if apart:
      if self.options.progress and apart != "a host evaluation":
        print(f"{method.label}: its seeds run one by one ({apart})", flush=True)
      for seed, one in built.items():
        self.one(method, seed, one)
      return
    shared = lambda name: (
      getattr(run, name)
      if all(getattr(r, name) is getattr(run, name) for r in runs)
      else fedco.runtime.PerSeed([getattr(r, name) for r in runs])
    )
    directory = self.directory(
      f"{method.label}-seeds{'-'.join(map(str, seeds))}",
      {"runs": [self.identity(method, s, built[s]) for s in seeds]},
    )
    swept = fedco.sweep(
      run.problem,
      run.algorithm,
      shared("data"),
      shared("params"),
      seeds=seeds,
      metrics_fn=run.metrics_fn,
      metrics_data=shared("metrics_data"),
      metric_labels=[{"method": method.label, "seed": s} for s in seeds],
      **self.how(directory, schedule),
      **{**simulate_kwargs(method, run), **schedule},
    )
    for r, seed in enumerate(seeds):
      if swept.diverged[r] is None:
        self.finished(method, seed, built[seed], swept.simulation(r))
      else:
        self.one(method, seed, built[seed])

  def how(self, directory: str, schedule: Mapping[str, Any], writers=None) -> Dict[str, Any]:
    """``fedco.simulate``'s and ``fedco.sweep``'s arguments on how a run goes (its
    ``schedule``: rounds and ``eval_every``)."""
    every = self.options.checkpoint_every
    return {
      "chunk_rounds": progress_chunk(schedule["rounds"], schedule["eval_every"], every),
      "metric_writers": self.writers if writers is None else writers,
      "progress": self.options.progress,
      "progress_metric": self.module.PROGRESS,
      "checkpoint_dir": directory,
      "checkpoint_every": self.options.checkpoint_every,
    }

  def one(self, method: Method, seed: int, run: Run) -> None:
    """One run through ``fedco.simulate``: the outcome gets its final values (or its
    divergence note), its evaluated rounds and its result."""
    labels = {"method": method.label, "seed": seed}
    kwargs = {**simulate_kwargs(method, run), **self.schedule(run)}
    writers = self.writers
    if run.evaluate is not None:  # the host evaluation's rows are the run's metrics
      action = fedco.runtime.RoundAction(
        lambda state, _: run.evaluate(state), kwargs["eval_every"], at_start=True
      )
      kwargs.update(evaluate=False, actions=[action])
      writers = [_ActionRows(self.writers, labels)]
    else:
      kwargs.update(metrics_fn=run.metrics_fn, metrics_data=run.metrics_data)
    directory = self.directory(f"{method.label}-seed{seed}", self.identity(method, seed, run))
    try:
      result = fedco.simulate(
        run.problem,
        run.algorithm,
        method.training_data(run.data),
        run.params,
        seed=seed,
        metric_labels=labels,
        **self.how(directory, kwargs, writers),
        **kwargs,
      )
    except fedco.runtime.NonFiniteError as err:
      self.outcome.finals.setdefault(method.label, {})[seed] = diverged_note(method.entry, err)
      if run.evaluate is not None:
        self.outcome.records.extend(_finite_rows(err.host_metrics))
      else:
        self.outcome.records.extend(
          outputs.evaluated_records(err.metrics, labels, keys=run.record_keys, finite_only=True)
        )
      return
    self.finished(method, seed, run, result)

  def finished(self, method: Method, seed: int, run: Run, result) -> None:
    """A finished run's final values, evaluated rounds and result into the outcome."""
    labels = {"method": method.label, "seed": seed}
    if run.evaluate is not None:
      rows = _finite_rows(result.host_metrics)
      self.outcome.records.extend(rows)
      final = {k: v for k, v in rows[-1].items() if k not in labels}
    else:
      self.outcome.records.extend(
        outputs.evaluated_records(result.metrics, labels, keys=run.record_keys)
      )
      final = outputs.final_metrics(result.metrics)
    final["seconds"] = result.seconds
    final["bytes_up"] = result.ledger["total_bytes_up"]
    if "epsilon" in result.metrics:
      final["epsilon"] = float(result.metrics["epsilon"][-1])
    self.module.finish(self.config, method, seed, result, final)
    self.outcome.finals.setdefault(method.label, {})[seed] = final
    self.outcome.results[(method.label, seed)] = result


def _finite_rows(rows) -> List[Dict[str, Any]]:
  """A host evaluation's rows (``{"round", **labels, ...}``) up to the first with a
  non-finite number."""
  return list(itertools.takewhile(fedco.runtime.host.finite_row, rows))


class _ActionRows(fedco.runtime.RowWriter):
  """Forwards a host evaluation's rows to the workdir's writers, not the simulator's
  per-round rows, which hold no metric then (``evaluate=False``, no ``metrics_fn``)."""

  def __init__(self, writers, labels):
    self.writers, self.fields = writers, {"round", *labels}

  def write(self, rows):
    rows = [r for r in rows if set(r) - self.fields]
    for w in self.writers if rows else ():
      w.write(rows)

  def rewind(self, round_, labels):
    for w in self.writers:
      w.rewind(round_, labels)


def diverged_note(label: str, err) -> Dict[str, Any]:
  """A diverged run's final entry: the round, the quantity and the field to change."""
  return {
    "diverged": f"diverged at round {err.round} ({err.quantity}); try a lower "
    f"--config.methods.{label}.learning_rate",
    "diverged_round": err.round,
    "diverged_quantity": err.quantity,
  }
