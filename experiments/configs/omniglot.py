"""E4: federated few-shot Omniglot (paper 003 Sec. 5.2).

``python -m experiments.main --config=experiments/configs/omniglot.py --workdir=runs/e4
--config.data_dir=../shared/data/omniglot`` (the upstream zips) or a TFDS data_dir holding
``omniglot`` prepared as array_record;
5-way 5-shot: ``--config.shots=5``; 20-way 1-shot: ``--config.ways=20`` (on a 24 GB machine
with ``--config.client_chunk=11``: about 20 GB with every client at once).
"""

import ml_collections

from experiments import configs


def get_config():
  """E4 at paper 003's 5-way 1-shot settings (1000 rounds of 5 local steps)."""
  config = ml_collections.ConfigDict()
  config.experiment = "omniglot"
  # The upstream images_{background,evaluation}.zip, or a TFDS data_dir holding omniglot as
  # array_record ("": TFDS's default)
  config.data_dir = ""
  config.seeds = (0, 1, 2)
  # Communication rounds at the shared local_steps; a method with its own local_steps runs
  # rounds * local_steps / its local_steps rounds (the same meta-iterations).
  config.rounds = 1000
  config.local_steps = 5  # p: local steps between communications (paper 003: not given)
  config.learning_rate = 0.1  # the meta step (Local-SCGDM's eta is its own learning_rate)
  # Episodes per client per local step: 1 (an episode's support sets feed the inner map and
  # its own query sets the outer; the meta-batch is tasks_per_episode).
  config.batch_size = 1
  config.eval_every = 10  # rounds at the shared local_steps between evaluations
  # The tasks and the MAML problem.
  config.ways = 5  # N: classes per task
  config.shots = 1  # K: support images per class
  config.query = 15  # query images per class (shots + query <= 20 drawings)
  config.tasks_per_episode = 1  # tasks per client per step (33 clients: ~MAML's 32 tasks)
  config.inner_lr = 0.4  # MAML inner (adaptation) learning rate
  config.inner_steps = 1  # MAML inner steps in training
  config.eval_inner_steps = 1  # adaptation steps at evaluation
  config.first_order = False  # the first-order MAML inner map (the problem's)
  config.filters = 64  # channels of each of the CNN's four convolutions
  config.alphabet_split = "vinyals"  # 33/5/12 named alphabets, or "random" (split_sizes)
  config.split_sizes = (33, 5, 12)  # train, val, test alphabets ("random" split only)
  config.rotations = True  # rotations by multiples of 90 degrees are new classes
  config.episodes_per_client = 256  # pre-drawn training episodes per client
  config.val_tasks = 100  # validation tasks evaluated every eval_every rounds
  config.test_tasks = 600  # test tasks evaluated on each final model (0: none)
  config.eval_chunk = 25  # tasks per vectorised evaluation chunk (memory)
  # Training clients run this many at a time (memory: 20-way's 33 second-order clients
  # together peak at about 20 GB); 0: all together (vmapped). Results equal up to round-off.
  config.client_chunk = 0
  config.methods = configs.methods(
    {
      # eta = 1 (its learning_rate), beta: the meta step coefficient, alpha: momentum rate,
      # gamma: tracker rate (alpha * eta and gamma * eta in (0, 1)).
      "local_scgdm": {
        "algorithm": "local_scgdm",
        "learning_rate": 1.0,
        "beta": 0.1,
        "alpha": 0.9,
        "gamma": 0.99,
      },
      "comfedl": {"algorithm": "comfedl"},  # Local-BSGD = ComFedL-MAML
      "local_scgd": {"algorithm": "local_scgd", "gamma": 0.99},
    }
  )
  return config
