"""Flax models and the per-example classification losses the problems are built from.

fedco's problems are per-example functions (``inner(params, example) -> pytree`` and the
like), so every model here takes ONE example and ``jax.vmap`` makes the batch; the
convolutional ones also take a batch ``[n, H, W, C]``:

* :class:`LogisticRegression` (with :func:`init_params`): multinomial logistic regression;
* :class:`MLP` (with :func:`init_mlp`): the sinusoid regression network of paper 003;
* :class:`CNN4` (with :func:`init_cnn`): MAML's Conv-4 with per-example GroupNorm, for
  CIFAR-10 (paper 001);
* :class:`OmniglotCNN`: MAML's Omniglot network, with :class:`TaskBatchNorm` (the batch
  statistics of one task);
* :class:`ResNet20`: the CIFAR ResNet-20 with GroupNorm or no normalization;
* :class:`EmnistCNN`: the EMNIST CNN of Reddi et al. 2021 (dropout off unless asked for);
* :class:`ShakespeareLSTM`: the Shakespeare next-character LSTM of McMahan et al. 2017 and
  Reddi et al. 2021, one token sequence ``[T]`` -> logits ``[T, vocab_size]``.

:func:`cross_entropy` and :func:`accuracy` are the per-example loss and metric on a
model's logits; :func:`masked_cross_entropy` and :func:`masked_accuracy` those of one
token sequence, over the positions a mask keeps (padding left out). :mod:`fedco.models.layers` holds the convolution, pooling and GroupNorm
the networks are built from, fast inside fedco's compiled loops on the CPU.

Examples:
  A per-example loss, batched with ``jax.vmap``:

  >>> import jax
  >>> import jax.numpy as jnp
  >>> import fedco
  >>> model = fedco.models.LogisticRegression(num_classes=3)
  >>> params = fedco.models.init_params(model, jnp.zeros(4))
  >>> loss = lambda params, x, y: fedco.models.cross_entropy(model.apply(params, x), y)
  >>> losses = jax.vmap(loss, (None, 0, 0))(params, jnp.ones((2, 4)), jnp.array([0, 2]))
  >>> [round(float(l), 4) for l in losses]  # log 3: zero weights, every class equally likely
  [1.0986, 1.0986]
"""

from fedco.models import layers
from fedco.models.cnn import CNN4, EmnistCNN, OmniglotCNN, TaskBatchNorm, init_cnn
from fedco.models.linear import LogisticRegression, accuracy, cross_entropy, init_params
from fedco.models.mlp import MLP, init_mlp
from fedco.models.resnet import ResNet20
from fedco.models.sequence import (
  SHAKESPEARE_VOCAB_SIZE,
  ShakespeareLSTM,
  masked_accuracy,
  masked_cross_entropy,
)

__all__ = [
  "layers",
  "CNN4",
  "EmnistCNN",
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
  "ShakespeareLSTM",
  "SHAKESPEARE_VOCAB_SIZE",
  "masked_cross_entropy",
  "masked_accuracy",
]
