"""E2's offline stand-in: the same methods on scikit-learn's digits (16x16 by pixel
repetition, 120 images per client by ``per_client = 0``), 30 rounds (ComFedL-MAML passes 0.95
mean validation accuracy by round 15): ``python -m experiments.main
--config=experiments/configs/personalized_cifar_digits.py --workdir=runs/e2``."""

from experiments.configs import personalized_cifar


def get_config():
  config = personalized_cifar.get_config()
  config.dataset = "digits"
  config.rounds = 30
  return config
