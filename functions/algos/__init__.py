"""Pure RL math of Stellaris: GAE, V-trace, PPO and IMPACT losses, truncation (paper Eq. 2), staleness
(paper Eq. 3–4) and the hyperparameter presets. No I/O here: tensors and plain values in and out."""
