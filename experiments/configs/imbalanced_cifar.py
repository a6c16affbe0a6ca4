"""E5: imbalanced image classification, CIFAR10-ST / CIFAR100-ST (paper 004 Sec. 6).

``python -m experiments.main --config=experiments/configs/imbalanced_cifar.py
--workdir=runs/e5 --config.data_dir=~/tensorflow_datasets``; CIFAR100-ST:
``--config.dataset=cifar100``; the paper's ablation over FedDRO/DS-FedDRO's local steps:
``--config.ablation=local_steps``; offline (no TFDS data): ``--config.dataset=digits
--config.model=linear``.
"""

import ml_collections

from experiments import configs


def get_config():
  """E5 at the paper's settings."""
  config = ml_collections.ConfigDict()
  config.experiment = "imbalanced_cifar"
  config.dataset = "cifar10"  # "cifar10", "cifar100" (TFDS, -ST version) or "digits" (offline)
  config.data_dir = ""  # TFDS data directory (array_record format); "": TFDS's default
  config.model = "resnet20"  # "resnet20" (the paper's), "cnn4" or "linear"
  config.width = 16  # ResNet20's base width (16: the CIFAR ResNet20)
  # ResNet20/CNN4 convolutions: "matmul" (im2col matrix products: fast inside the
  # simulator's loops on a CPU or GPU, slower to compile), "xla" (lax.conv_general_dilated)
  # or "auto" (matmul on a CPU or GPU, xla elsewhere).
  config.conv_impl = "auto"
  config.num_clients = 8  # clients; an equal random split of the training rows
  config.keep_fraction = 0.02  # fraction of each minority class (the first half) kept
  config.seeds = (0, 1, 2)
  config.rounds = 120
  # FedDRO's and DS-FedDRO's local steps I (the other methods set their own below).
  config.local_steps = 1
  # Every method's SGD rate (the paper picks one of 0.001, 0.01, 0.05, 0.1), divided by 10
  # after lr_drop_round rounds (an optax schedule counted in local steps).
  config.learning_rate = 0.01
  config.lr_drop_round = 90
  config.batch_size = 16  # per client and local step; 0: each client's whole data
  config.eval_every = 10  # evaluate at round 1 and every eval_every rounds
  config.eval_examples = 0  # evaluate on this many rows of each split (fixed subset); 0: all
  config.lam = 1.0  # the KL-DRO temperature lambda of the sample-level problem
  config.shift = 0.0  # a constant shift of the loss inside exp (numerics only)
  # The compared methods (paper 004's "centralised baselines in parallel form": every method
  # uses num_clients x batch_size examples per step). FastDRO and primal-dual SGD solve the
  # DRO problem over their own example weights (on the plain cross-entropy); the others get
  # the KL-DRO problem. primal_dual_dro's num_examples is the training split's size (set by
  # the experiment).
  config.methods = configs.methods(
    {
      "feddro": {"algorithm": "feddro", "beta": 0.5},
      "ds_feddro": {"algorithm": "ds_feddro", "beta": 0.5, "server_lr_x": 1.3, "server_lr_y": 1.4},
      "fastdro": {"algorithm": "fastdro", "geometry": "chi2", "size": 1.0, "local_steps": 1},
      "primal_dual_dro": {"algorithm": "primal_dual_dro", "weights_lr": 1e-4, "local_steps": 1},
      "mbsgd": {"algorithm": "mbsgd"},  # one step per round
      # FedAvg for CO, Case II: the failing baseline of Theorem 4.1.
      "fedavg_co": {"algorithm": "fedavg_co", "case": "II", "local_steps": 5},
    }
  )
  # The paper's ablation: "local_steps" runs the feddro / ds_feddro methods (only) once per
  # value of ablation_values.
  config.ablation = "none"
  config.ablation_values = ()  # default: 1, 2, 4, 8, 16, 32
  return config
