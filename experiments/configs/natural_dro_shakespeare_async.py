"""Buffered asynchronous aggregation on Shakespeare's 715 roles (issue 49): FedBuff against
synchronous FedAvg by accuracy against simulated time, with stragglers.

``python -m experiments.main --config=experiments/configs/natural_dro_shakespeare_async.py
--workdir=runs/e8_shakespeare_async``. E8's Shakespeare data and model
(``ShakespeareLSTM(32, 1)``, every role kept), 10 roles a round of 10 local steps of 4
sequences at the published client rate 1.0; the delays of ``natural_dro_femnist_async.py``
(speeds log-normal across roles and per dispatch, one role in ten a straggler ten times
slower). Synchronous FedAvg runs 50 rounds; FedBuff (30 roles training, a buffer of 10,
``1/sqrt(1 + tau)``, and its unweighted variant) 600 server steps, about the same simulated
time; evaluated every 5 rounds and every 30 server steps. Sized for a 2-core CPU: early training, not the paper's
1,200 rounds of the two-layer LSTM of 256.
"""

from experiments import configs
from experiments.configs import natural_dro_femnist_async, natural_dro_shakespeare


def get_config():
  config = natural_dro_shakespeare.get_config()
  timed = natural_dro_femnist_async.get_config()
  config.delays = timed.delays
  config.seeds = (0, 1, 2)
  config.rounds, config.async_rounds, config.eval_every = 50, 600, 5
  config.async_eval_every = 30
  config.local_steps, config.batch_size = 10, 4
  config.methods = configs.methods(
    {label: timed.methods[label].to_dict() for label in ("fedavg", "fedbuff", "fedbuff_unweighted")}
  )
  return config
