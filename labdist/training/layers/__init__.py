"""Layers (`ld.layers`): Keras' names and settings, each a small object with a pure forward and
backward over parameters kept outside it (base.py declares the seam a model uses)."""

from labdist import shipping
from labdist.training.layers.base import Layer
from labdist.training.layers.conv import Conv2D
from labdist.training.layers.core import Dense, Dropout, Flatten, Input, InputLayer, Reshape
from labdist.training.layers.embedding import Embedding
from labdist.training.layers.normalization import BatchNormalization
from labdist.training.layers.pooling import (
    AveragePooling2D,
    GlobalAveragePooling1D,
    MaxPooling2D,
)

__all__ = ["AveragePooling2D", "BatchNormalization", "Conv2D", "Dense", "Dropout", "Embedding",
           "Flatten", "GlobalAveragePooling1D", "Input", "InputLayer", "Layer", "MaxPooling2D",
           "Reshape"]

# a step holding its layers is pickled again only when one of them changes
for _cls in (AveragePooling2D, BatchNormalization, Conv2D, Dense, Dropout, Embedding,
             Flatten, GlobalAveragePooling1D, MaxPooling2D, Reshape):
    shipping.register_state(_cls)
