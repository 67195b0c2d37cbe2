"""Built-in workloads. Importing this package registers every model (see :mod:`..registry`)."""

from . import bert, gpt2, mixes, mobilenet, resnet, vgg, vit  # noqa: F401  (registration side effects)
