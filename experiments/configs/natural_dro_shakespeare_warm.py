"""E8 on Shakespeare's roles from a trained model: ``natural_dro_shakespeare.py``'s 7 methods
and 10 rounds, every method of a seed starting from the model FedAvg reaches first.

``python -m experiments.main --config=experiments/configs/natural_dro_shakespeare_warm.py
--workdir=runs/e8_shakespeare_warm``. From the initial model every method of
``natural_dro_shakespeare.py`` stays on the first plateau (the most frequent character
everywhere: mean held-out accuracy 0.19), so that run cannot tell what reweighting the roles
does to the held-out accuracy of the hardest ones. Here each seed's model is first trained
by FedAvg in Reddi et al.'s sampling (``natural_dro.warm_start``: 500 rounds of 10 sampled
roles, 10 local steps of 4 sequences at rate 1.0; about 40 s on 2 cores; seed 0's reaches a
mean held-out accuracy over roles of 0.416, 10th percentile 0.345), and then every method
runs the same 10 rounds of every role as in ``natural_dro_shakespeare.py``. The warm-up is
the same for every method of a seed (its seed draws the clients and batches), so the paired
differences compare the methods' own 10 rounds.
"""

from experiments.configs import natural_dro_shakespeare


def get_config():
  config = natural_dro_shakespeare.get_config()
  config.warm_start.rounds = 500
  return config
