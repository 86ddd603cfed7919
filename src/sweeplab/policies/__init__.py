"""The decisions both fit loops (engine/lightning_fit.py, engine/mlx_fit.py) ask and only act on, in plain Python (a
contract in pyproject.toml: no Lightning, torch or MLX): when to checkpoint and which validation is a best
(checkpoints.py), when to stop (stopping.py). Lightning's adapters are among the callbacks (callbacks/checkpoints.py,
callbacks/stop_rules.py)."""
