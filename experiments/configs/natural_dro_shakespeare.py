"""E8 on Shakespeare's speaking roles: all 715 roles of TFF's Shakespeare, each a client
with its own held-out sequences, every role in every round.

``python -m experiments.main --config=experiments/configs/natural_dro_shakespeare.py
--workdir=runs/e8_shakespeare`` reads TFF's HDF5 files from
``<repository>/../shared/data/shakespeare_tff`` (``--config.data_dir=<folder>`` for another
copy), preprocessed as TFF does it (:func:`fedco.data.load_shakespeare_tff`:
37,784 training and 5,490 held-out sequences of 80 characters).

Sized for a 2-core CPU, not the papers' setting: the published LSTM (two layers of 256,
820K parameters) on 715 clients every round is far beyond it for 5 seeds x 7 methods. Here
the model is ``ShakespeareLSTM(hidden_size=32, num_layers=1)`` (8,938 parameters), each role
takes 2 local steps of one sequence a round (AFL: twice the rounds, one step each), at the
published client rate for FedAvg on Shakespeare (1.0, Reddi et al. 2021), for 10 rounds,
evaluated after rounds 1 and 10 (the training loss of every sequence is most of an
evaluation's cost): early training, 20 local steps in all, not a converged model. q-FedAvg
and AFL also compute every role's loss on all its training sequences every round, so they
cost the most (on 2 cores under a load of 8: about 3.4 s a round for FedAvg, 4.2 FedDRO,
2.6-2.9 DRFA and ComFedL, 12 AFL (one step), 18 q-FedAvg, 10 s an evaluation, 30-90 s to
compile; about 15 minutes a seed, less with ``--compilation_cache``).

Clients are not sampled: FedDRO's log form tracks every client's loss in one vector, and
with a sample of the roles its entries would be those of the sampled roles only, scaled by
``K / m``, so it would weigh the sampled roles at a temperature ``gamma m / K`` instead of
``gamma``. Normalised ComFedL (client weights ``K softmax(f / gamma)``) gets a tenth of the
shared rate (E8's 0.001 would leave it where it starts in 20 steps); nothing is tuned. 26 roles have no scored held-out target and are left
out of the held-out mean, worst and 10th percentile (``summary["heldout_clients"]``: 689).
"""

from experiments.configs import natural_dro
from fedco.data import tff


def get_config():
  config = natural_dro.get_config()
  config.dataset = "shakespeare"
  config.data_dir = tff.DEFAULT_DATA_DIR
  config.model = "lstm"
  config.hidden_size, config.num_layers = 32, 1
  config.rounds, config.eval_every = 10, 10
  config.local_steps, config.batch_size = 2, 1
  config.learning_rate = 1.0
  config.methods.comfedl_normalized.learning_rate = 0.1
  return config
