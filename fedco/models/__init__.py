"""Flax models and the per-example classification losses the problems are built from."""

from fedco.models import layers
from fedco.models.cnn import CNN4, OmniglotCNN, TaskBatchNorm, init_cnn
from fedco.models.linear import LogisticRegression, accuracy, cross_entropy, init_params
from fedco.models.mlp import MLP, init_mlp
from fedco.models.resnet import ResNet20

__all__ = [
  "layers",
  "CNN4",
  "OmniglotCNN",
  "TaskBatchNorm",
  "ResNet20",
  "init_cnn",
  "MLP",
  "init_mlp",
  "LogisticRegression",
  "accuracy",
  "cross_entropy",
  "init_params",
]
