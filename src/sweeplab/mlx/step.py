"""One compiled MLX training step: loss and gradients, one global-norm clip, the optimizer update.

`mx.compile` with captured state (the model's arrays, the optimizer's state, the random state) traces the step
once per batch shape and then runs it as one graph; nothing in it reads a value back to the host, so a step costs
one `mx.eval` where the caller asks for one. The optimizer is initialised before compiling: the captured state must
exist when the step is traced. On Linux the first trace of each shape calls the C++ compiler (cached under
$TMPDIR/mlx/).

Non-finite loss or gradient norm: the step returns a flag (a 0-d bool array, no host sync); with
`skip_nonfinite=True` such a step leaves the weights and the optimizer's state (moments, step count) as they were,
as the PyTorch guard's "skip" does by dropping the gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_map, tree_reduce


def global_norm(grads) -> mx.array:
    return mx.sqrt(tree_reduce(lambda acc, g: acc + mx.square(g.astype(mx.float32)).sum(), grads, mx.array(0.0)))


def _keep_where(finite: mx.array, live, before) -> None:
    """live[...] = where(finite, live, before) leaf by leaf, in the live containers (the compiled step's captured
    state refers to them, so they are updated, never replaced)."""
    items = live.items() if isinstance(live, dict) else enumerate(live)
    for key, value in list(items):
        if isinstance(value, (dict, list)):
            _keep_where(finite, value, before[key])
        elif isinstance(value, mx.array):
            live[key] = mx.where(finite, value, before[key])


def _put_back(live, saved) -> None:
    items = live.items() if isinstance(live, dict) else enumerate(live)
    for key, value in list(items):
        if isinstance(value, (dict, list)):
            _put_back(value, saved[key])
        else:
            live[key] = saved[key]


class CompiledStep:
    """step(*batch) -> (loss, metrics, grad_norm, finite), all lazy MLX arrays; the model and optimizer updated.

    loss_fn(*batch) -> (loss, {name: value}) calls the model (closed over); gradients are taken with respect to the
    model's trainable parameters only (frozen layers get none).
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: Callable,
        optimizer: optim.Optimizer,
        grad_clip: float | None = None,
        skip_nonfinite: bool = False,
        compile: bool = True,
    ):
        self.model = model
        self.optimizer = optimizer
        optimizer.init(model.trainable_parameters())
        self.state = [model.state, optimizer.state, mx.random.state]
        loss_and_grad = nn.value_and_grad(model, loss_fn)

        def step(*batch):
            (loss, metrics), grads = loss_and_grad(*batch)
            if grad_clip:
                grads, norm = optim.clip_grad_norm(grads, grad_clip)
            else:
                norm = global_norm(grads)
            finite = mx.isfinite(loss) & mx.isfinite(norm)
            if skip_nonfinite:
                params_before = model.trainable_parameters()
                state_before = tree_map(lambda a: a, optimizer.state)  # same arrays, a copy of the containers
                optimizer.update(model, grads)
                model.update(tree_map(lambda a, b: mx.where(finite, a, b), model.trainable_parameters(), params_before))
                _keep_where(finite, optimizer.state, state_before)
            else:
                optimizer.update(model, grads)
            return loss, metrics, norm, finite

        self._step = mx.compile(step, inputs=self.state, outputs=self.state) if compile else step

    def __call__(self, *batch):
        return self._step(*batch)

    def warm_up(self, batches: list, passes: int = 1) -> None:
        """Run the step on each batch `passes` times and put every captured array back: each batch shape is traced
        and compiled before the timed steps, and training is unchanged (SweepTask.warm_up_shapes' promise)."""
        saved = tree_map(lambda a: a, self.state)  # arrays are immutable: holding them is a snapshot
        for batch in batches:
            for _ in range(passes):
                mx.eval(self(batch))
        _put_back(self.state, saved)
        mx.eval(self.state)


__all__ = ["CompiledStep", "global_norm"]
