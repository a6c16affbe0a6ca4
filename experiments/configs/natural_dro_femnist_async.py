"""Buffered asynchronous aggregation on FEMNIST's 105 writers (issue 49): FedBuff against
synchronous FedAvg by accuracy against simulated time, with stragglers.

``python -m experiments.main --config=experiments/configs/natural_dro_femnist_async.py
--workdir=runs/e8_femnist_async``. E8's FEMNIST settings (20 local steps of batch 10 at rate
0.01, the MLP 784-128-62), 10 writers a round. Every client's 20 steps take a simulated time
(:class:`fedco.runtime.Delays`): speeds log-normal across writers (``spread`` 0.5) and per
dispatch (``jitter`` 0.25), and one writer in ten a straggler ten times slower. Synchronous
FedAvg waits for its round's slowest writer (100 rounds); FedBuff keeps ``concurrency``
writers training and applies every 10 reports (1,500 server steps, about the same simulated
time), weighting a report ``tau`` steps stale by ``1/sqrt(1 + tau)`` (or alike), and
discarding reports staler than ``max_staleness`` (the last variant keeps the default ring of
``4 * concurrency / 10`` models, so the stragglers' reports are discarded).
"""

from experiments import configs
from experiments.configs import natural_dro_femnist

TEN = {"clients_per_round": 10}


def get_config():
  config = natural_dro_femnist.get_config()
  config.model = "mlp"
  config.hidden_size = 128
  config.seeds = (0, 1, 2, 3, 4)
  config.rounds = 100
  config.async_rounds = 1500
  config.eval_every = 10
  config.delays.step_time = 1.0
  config.delays.spread = 0.5
  config.delays.jitter = 0.25
  config.delays.straggler_fraction = 0.1
  config.delays.straggler_slowdown = 10.0
  buffered = lambda c, **kw: {"concurrency": c, **kw}
  config.methods = configs.methods(
    {
      "fedavg": {"algorithm": "fedavg", "participation": TEN},
      "fedbuff": {
        "algorithm": "fedavg",
        "participation": TEN,
        "asynchronous": buffered(30, max_staleness=60),
      },
      "fedbuff_unweighted": {
        "algorithm": "fedavg",
        "participation": TEN,
        "asynchronous": buffered(30, max_staleness=60, staleness_exponent=0.0),
      },
      "fedbuff_drop_stale": {
        "algorithm": "fedavg",
        "participation": TEN,
        "asynchronous": buffered(30),
      },
    }
  )
  return config
