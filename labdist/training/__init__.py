"""Training building blocks written once against an array module `xp` (numpy or cupy):
activations, layers, losses and optimizers as small pure functions with hand-written
gradients. Models, `fit` and the strategy integration build on these (issue 3)."""
