"""Pure RL math of Stellaris: GAE, V-trace, PPO, IMPACT and APPO losses, truncation (paper Eq. 2), staleness
(paper Eq. 3–4) and the hyperparameter presets; and the algorithm seam (``algorithm``, ``registry``, one
``<name>_algo`` module per algorithm) that the handlers call. No I/O here: tensors and plain values in and out."""
