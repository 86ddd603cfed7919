"""The MLX backend's shared, family-free machinery: weight conversion, optimizer and schedule, the compiled step.

Needs the optional `mlx` package (`pip install 'sweeplab[mlx]'`); nothing outside this package and the families'
`mlx_model.py` imports it.
"""
