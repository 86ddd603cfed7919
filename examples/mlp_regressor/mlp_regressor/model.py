"""A plain torch MLP (no Lightning, no Hydra: sweeplab's models stay framework-free, and so can yours)."""

from dataclasses import dataclass

from torch import nn

SIZES = {"tiny": {"hidden": 16, "n_layers": 1}, "small": {"hidden": 128, "n_layers": 2}}  # tiny: for debug=smoke


@dataclass
class MLPConfig:
    in_dim: int = 32
    hidden: int = 128
    n_layers: int = 2
    sleep_ms: float = 0.0  # a known cost per training step (sweeplab's tests of the verdict); 0: none

    def __post_init__(self) -> None:
        if min(self.in_dim, self.hidden, self.n_layers) < 1 or self.sleep_ms < 0:
            raise ValueError(f"in_dim, hidden and n_layers must be >= 1 and sleep_ms >= 0, got {self}")


class MLPRegressor(nn.Module):
    def __init__(self, config: MLPConfig):
        super().__init__()
        self.config = config
        layers, width = [], config.in_dim
        for _ in range(config.n_layers):
            layers += [nn.Linear(width, config.hidden), nn.GELU()]
            width = config.hidden
        self.net = nn.Sequential(*layers, nn.Linear(width, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)
