"""E3: federated sinusoid meta-regression (paper 003 Sec. 5.1), fully offline.

``python -m experiments.main --config=experiments/configs/sinusoid.py --workdir=runs/e3``;
Local-SCGDM's ablations (paper Figs. 3-5): ``--config.ablation=gamma`` (or ``local_steps``,
``alpha``), values from ``--config.ablation_values=0.5,0.9``.
"""

import ml_collections

from experiments import configs


def get_config():
  """E3 at paper 003's settings (3000 meta-iterations: 600 rounds of 5 local steps)."""
  config = ml_collections.ConfigDict()
  config.experiment = "sinusoid"
  config.seeds = (0, 1, 2)
  # Communication rounds at the shared local_steps; a method (or the local_steps ablation)
  # with other local_steps runs rounds * local_steps / its own local_steps rounds, so every
  # run has the same rounds * local_steps meta-iterations.
  config.rounds = 600
  config.local_steps = 5
  config.learning_rate = 0.01  # the meta step (Local-SCGDM's eta is its own learning_rate)
  config.batch_size = 1  # episodes per local step (an episode: tasks_per_step tasks); 0: all
  config.eval_every = 25  # rounds at the shared local_steps (scaled like rounds)
  # The MAML problem and the tasks.
  config.inner_lr = 0.001  # MAML inner (adaptation) learning rate
  config.inner_steps = 1  # MAML inner steps, in training and evaluation
  config.first_order = False  # the first-order MAML inner map (the problem's, not a method's)
  config.hidden = (40, 40)  # hidden widths of the ReLU MLP
  config.num_clients = 5  # must divide the 25 training tasks
  config.tasks_per_step = 3  # tasks of a client in one episode (the meta-batch)
  config.shots = 10  # support points per task
  config.query_shots = 10  # query points per task
  config.test_tasks = 600  # unseen test tasks (one set for every seed and method)
  config.episodes_per_client = 1000  # pre-drawn training episodes per client
  config.methods = configs.methods(
    {
      # eta = 1 (its learning_rate), beta: the meta step coefficient, alpha: momentum rate,
      # gamma: tracker rate (alpha * eta and gamma * eta in (0, 1)).
      "local_scgdm": {
        "algorithm": "local_scgdm",
        "learning_rate": 1.0,
        "beta": 0.01,
        "alpha": 0.8,
        "gamma": 0.7,
      },
      "comfedl": {"algorithm": "comfedl"},  # Local-BSGD = ComFedL-MAML
      "local_scgd": {"algorithm": "local_scgd", "gamma": 0.9},
      "local_moml": {"algorithm": "local_moml", "beta": 0.7},
    }
  )
  # Local-SCGDM's ablations: "gamma", "alpha" or "local_steps" over ablation_values (the
  # config's local_scgdm method with one setting changed; local_steps keeps the
  # meta-iterations).
  config.ablation = "none"
  config.ablation_values = ()  # default: gamma 0.3, 0.5, 0.7, 0.9; alpha 0.5, 0.7, 0.8, 0.9;
  #                              local_steps 1, 2, 5, 10
  return config
