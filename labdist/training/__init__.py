"""Keras-shaped training: `Sequential` models (model.py) of layers (layers/, activations.py)
with losses, metrics and optimizers written once against an array module `xp` (numpy or
cupy); callbacks, progress, checkpoints and saving; `apply_gradients` inside a custom loop
(custom_loop.py). The distributed trainer that runs them is trainer/."""
