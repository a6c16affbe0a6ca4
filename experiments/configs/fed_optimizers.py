"""Federated optimizers on Shakespeare by role (Reddi et al. 2021's setting), the default.

``python -m experiments.main --config=experiments/configs/fed_optimizers.py
--workdir=runs/fed_optimizers`` reads TFF's Shakespeare from ``../shared/data/shakespeare_tff``
(``--config.data_dir=`` another folder holding ``shakespeare_{train,test}.h5``); FEMNIST
writers: ``fed_optimizers_emnist.py``.

**Source.** Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar, McMahan, "Adaptive
Federated Optimization", ICLR 2021 (arXiv 2003.00295). Their code's hyperparameter page,
google-research/federated ``optimization/docs/hyperparameters.md`` (commit 0f29cad), lists
the setting ("Cross-task hyperparameters": 10 clients a round, 1 client epoch, batch 4 for
``shakespeare_character`` and 20 for ``emnist_character``, 1,200 / 1,500 rounds, client
SGD) and, in base-10 logs, the best client and server learning rates and the adaptive
methods' epsilon (the paper's ``tau``) per task and optimizer ("Best hyperparameters",
the table the paper's appendix prints); FedAvgM is server SGD with momentum 0.9
(``--server_sgd_momentum=0.9``, same page). The appendix table's own number could not be
checked here (the paper's text was not readable in this session's sources), so the
citation is to that page.

**Published accuracies: not found.** The paper's Table 2 (test accuracy per task and
optimizer, SCAFFOLD in its appendix) could not be read in this session's sources, so every
``paper`` entry is ``None`` (the report says "paper: not found"); fill them from the paper,
never from memory.

**Differences from the paper, on purpose or not avoidable:** FedAdam / FedYogi take
``b2 = 0.99`` as the paper's Algorithm 2 experiments state (the code page says its Keras
optimizers kept ``beta2 = 0.999``); fedco starts ``v`` at ``tau^2`` (the paper's
``v_{-1} >= tau^2``; the code's accumulators start at 0); SCAFFOLD averages clients
uniformly (fedco's option II) and takes FedAvg's rates, since no tuned SCAFFOLD rates were
found; the client mean is weighted by examples (sequences) as TFF's ``tff.learning`` does.
"""

import ml_collections
from ml_collections import config_dict

from experiments import configs

# Shakespeare, "Best hyperparameters" of the code page (base-10 logs there): client rate
# 10^0 for every method; server rate Adagrad 10^-0.5, Adam 10^-2, Yogi 10^-2, AvgM
# 10^-0.5, Avg 10^0; epsilon (tau) Adagrad 10^-1, Adam 10^-3, Yogi 10^-3.
# ``server_sgd`` and ``paper`` are the experiment's own (``entries`` puts them in each
# method's ``problem``). ``server_sgd``: FedAvg's and FedAvgM's server step (``optax.sgd`` on the pseudo-gradient:
# rate 1 without momentum is plain averaging). ``paper``: the published test accuracy (%)
# beside each method in the report; None: not found (see the module docstring).
METHODS = {
  "fedavg": {
    "algorithm": "fedavg",
    "learning_rate": 1.0,
    "server_sgd": {"learning_rate": 1.0, "momentum": 0.0},
    "paper": None,
  },
  "fedavgm": {
    "algorithm": "fedavg",
    "learning_rate": 1.0,
    "server_sgd": {"learning_rate": 10**-0.5, "momentum": 0.9},
    "paper": None,
  },
  "fedadagrad": {
    "algorithm": "fedadagrad",
    "learning_rate": 1.0,
    "server_lr": 10**-0.5,
    "adaptivity": 10**-1.0,
    "weighting": "samples",
    "paper": None,
  },
  "fedadam": {
    "algorithm": "fedadam",
    "learning_rate": 1.0,
    "server_lr": 10**-2.0,
    "adaptivity": 10**-3.0,
    "b1": 0.9,
    "b2": 0.99,
    "weighting": "samples",
    "paper": None,
  },
  "fedyogi": {
    "algorithm": "fedyogi",
    "learning_rate": 1.0,
    "server_lr": 10**-2.0,
    "adaptivity": 10**-3.0,
    "b1": 0.9,
    "b2": 0.99,
    "weighting": "samples",
    "paper": None,
  },
  # Not in the code page's tables: FedAvg's client rate, the global rate 1 of SCAFFOLD's
  # paper (Karimireddy et al. 2020). Client means uniform (fedco's SCAFFOLD has no weighting).
  "scaffold": {"algorithm": "scaffold", "learning_rate": 1.0, "server_lr": 1.0, "paper": None},
}


def entries(methods):
  """``config.methods`` from ``methods``: each entry's ``server_sgd`` and ``paper`` go into
  its ``problem`` (the experiment's own settings of a method, which the runner passes to the
  module, not to the factory): ``--config.methods.fedavgm.problem.server_sgd.momentum=0.5``,
  ``--config.methods.fedadam.problem.paper=57.0``; an unset ``paper`` (None) is a typed
  placeholder of its own."""
  out = {}
  for label, entry in methods.items():
    entry = dict(entry)
    problem = {"paper": entry.pop("paper", None)}
    if problem["paper"] is None:
      problem["paper"] = config_dict.placeholder(float)
    if "server_sgd" in entry:
      problem["server_sgd"] = dict(entry.pop("server_sgd"))
    out[label] = {**entry, "problem": problem}
  return configs.methods(out)


def get_config():
  """Shakespeare by role at Reddi et al.'s setting: 10 clients a round, one local epoch of
  batches of 4, 1,200 rounds."""
  config = ml_collections.ConfigDict()
  config.experiment = "fed_optimizers"
  config.dataset = "shakespeare"  # or "emnist" (FEMNIST writers from LEAF's files)
  config.data_dir = ""  # '' : ../shared/data/shakespeare_tff (emnist: femnist_leaf_sf005)
  config.seeds = (0, 1, 2)
  config.rounds = 1200  # the paper's Shakespeare budget
  config.clients_per_round = 10
  config.batch_size = 4
  # One pass over each client's rows a round (ceil(n_k / batch) steps, in shuffled order);
  # 0: every client takes ``local_steps`` steps of batches drawn with replacement.
  config.local_epochs = 1
  # Under local_epochs: run the round's clients this many at a time, each for its own
  # steps (fedco.simulate's client_chunk; 1 is the fastest for the LSTM on a CPU); 0: all
  # clients vmapped over the longest client's steps.
  config.client_chunk = 1
  # Local steps when local_epochs = 0 (with local_epochs, every method's steps are the cap
  # the largest client needs, fedco.runtime.epoch_steps).
  config.local_steps = 10
  config.learning_rate = 1.0  # the shared client rate (each method sets its own)
  config.eval_every = 50
  config.eval_batch = 512  # test examples evaluated together (memory, not results)
  config.max_clients = 0  # keep only the first this many clients (0: all; tests, timing)
  config.hidden_size = 0  # LSTM units (0: the published 256); tests shrink the model
  config.methods = entries(METHODS)
  return config
