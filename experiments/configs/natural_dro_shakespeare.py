"""E8 on Shakespeare's speaking roles: 715 roles, each its own held-out sequences (DRAFT)."""

from experiments.configs import natural_dro
from fedco.data import tff


def get_config():
  config = natural_dro.get_config()
  config.dataset = "shakespeare"
  config.data_dir = tff.DEFAULT_DATA_DIR
  config.model = "lstm"
  config.batch_size = 4
  config.local_steps = 5
  config.learning_rate = 1.0
  return config
