"""The peers: other libraries' PPO, run from their own released code on the same machine, envs and budgets as the
campaign's own cells (docs/experiments.md).

Each peer runs in the peers' virtual environment (`experiments/peers/venv.py`: Stable-Baselines3 and CleanRL pin
a Gymnasium other than the project's), as a script that imports only that venv's packages and
`experiments/peers/protocol.py`. The protocol is the campaign's: a row per 2048-step iteration with the training
clock and the mean return of the episodes that ended in it, and a deterministic evaluation (mean action, an env of its
own on a fixed seed) every 41 iterations and after the last. The campaign costs the rows by the project's cost model.
"""
