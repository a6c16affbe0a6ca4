"""Experiments on fedco: a config file and a module of science; this package runs the rest.

An experiment is an ``ml_collections`` config (the only source of truth for its numbers) and
a module with ``build(config, method, seed, prepared) -> Run``; :func:`train_and_evaluate`
owns the workdir and its lock, checkpoints and resume, streamed ``metrics.jsonl`` /
``metrics.csv``, the seeds x methods loop (a method's seeds as one ``fedco.sweep`` program
where the module allows it), divergence notes, the table, ``summary.json`` and the privacy
and compression trade-off figures. :mod:`fedco.experiment.cli` is the command line
(``cli.run(config_dir=...)``: a whole experiment binary). This repository's experiments
(``experiments/``) are written with it; so is your own, in or outside it (the guide "Add an
experiment").

Modules: :mod:`~fedco.experiment.runner` (the skeleton: the workdir, the seeds x methods
loop, the summary), :mod:`~fedco.experiment.config_methods` (the compared methods, checked
against their factories; ablations), :mod:`~fedco.experiment.identity` (what makes two
runs the same), :mod:`~fedco.experiment.search` (grid searches),
:mod:`~fedco.experiment.tradeoff` (the privacy and compression figures),
:mod:`~fedco.experiment.protocol` (the hooks an experiment defines, :class:`Experiment`),
:mod:`~fedco.experiment.outputs` (the workdir's contract, tables and figures),
:mod:`~fedco.experiment.cli` (the driver; importing it defines absl flags).
"""

from fedco.experiment import config_methods, identity, outputs, protocol, runner, search, tradeoff
from fedco.experiment.config_methods import (
  Method,
  ablated,
  ablation,
  local_steps_ablation,
  method_entries,
  methods,
  same_iterations,
)
from fedco.experiment.outputs import Workdir, curves
from fedco.experiment.protocol import Experiment
from fedco.experiment.runner import Options, Outcome, Run, seeds, train_and_evaluate

__all__ = [
  "Experiment",
  "Method",
  "Options",
  "Outcome",
  "Run",
  "Workdir",
  "ablated",
  "ablation",
  "curves",
  "local_steps_ablation",
  "method_entries",
  "methods",
  "config_methods",
  "identity",
  "outputs",
  "protocol",
  "search",
  "tradeoff",
  "runner",
  "same_iterations",
  "seeds",
  "train_and_evaluate",
]
