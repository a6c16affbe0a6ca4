"""Adult DRO-FL trained to convergence: 3,000 rounds of 10 full-batch steps at rate 1.0, a
method counting as converged when its worst training loss moved by less than
``converge_tol`` between the last two evaluations (100 rounds apart; every method but DRFL,
whose randomly timed weight step keeps it moving, settles within it): ``python -m
experiments.main --config=experiments/configs/adult_dro_converged.py --workdir=runs/adult_c``.
"""

from experiments.configs import adult_dro


def get_config():
  config = adult_dro.get_config()
  config.budget = "converged"
  config.rounds, config.learning_rate, config.batch_size = 3000, 1.0, 0
  config.eval_every = 100
  return config
