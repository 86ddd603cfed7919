"""One compiled MLX training step: loss and gradients, one global-norm clip, the optimizer update.

`mx.compile` with captured state (the model's arrays, the optimizer's state, the random state) traces the step
once per batch shape and then runs it as one graph; nothing in it reads a value back to the host, so a step costs
one `mx.eval` where the caller asks for one. The optimizer is initialised before compiling: the captured state must
exist when the step is traced. On Linux the first trace of each shape calls the C++ compiler (cached under
$TMPDIR/mlx/).

Non-finite loss or gradient norm: the step returns a flag (a 0-d bool array, no host sync); with
`skip_nonfinite=True` such a step leaves the weights and the optimizer's state (moments, step count) as they were,
as the PyTorch guard's "skip" does by dropping the gradients.

`compute_dtype=mx.bfloat16` (trainer.precision=bf16-mixed): the weights and the optimizer's state stay float32 (the
master copy); the forward and backward passes run on a bfloat16 copy of every floating array, and the gradients
come back float32 through the cast. The losses are computed in float32 from the bfloat16 outputs (the families'
loss functions cast), as under torch autocast. MLX has no autocast: everything between the casts runs in
bfloat16 here, where torch's autocast runs only its listed ops (matmuls, convolutions) in bfloat16 and keeps the
rest (the residual stream, for one) in float32; tests/test_mlx_parity.py states what that costs (BF16_CURVE_TOLERANCE).

`accumulate=k` (trainer.accumulate_grad_batches): one optimizer step per k batches; each batch's gradients are
computed and evaluated batch by batch (not as one graph of k batches, which would hold all their activations) and
summed, and their mean is clipped and applied: the gradient of the mean of the k batches' losses, as Lightning's
accumulation.
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


def _floating(array: mx.array) -> bool:
    return mx.issubdtype(array.dtype, mx.floating)


def value_and_grad(model: nn.Module, loss_fn: Callable, compute_dtype=None) -> Callable:
    """nn.value_and_grad, with the forward and backward passes on a `compute_dtype` copy of the model's floating
    arrays (trainable and frozen) where one is given; the gradients have the dtype of the (float32) weights."""
    if compute_dtype is None:
        return nn.value_and_grad(model, loss_fn)

    def cast(tree):
        return tree_map(lambda a: a.astype(compute_dtype) if _floating(a) else a, tree)

    def inner(params, *args):
        model.update(cast(params))
        return loss_fn(*args)

    grad_fn = mx.value_and_grad(inner)

    def wrapped(*args):
        weights = model.parameters()  # float32, all of them: put back once the gradients are taken
        trainable = model.trainable_parameters()
        model.update(cast(weights))  # the frozen arrays, for the forward pass
        value, grads = grad_fn(trainable, *args)
        model.update(weights)
        return value, grads

    return wrapped


class CompiledStep:
    """step(*batch) -> (loss, metrics, grad_norm, finite), all lazy MLX arrays; the model and optimizer updated.
    With accumulate=k, step(batch_1, ..., batch_k): the mean loss and metrics of the k batches, one update.

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
        compute_dtype=None,
        accumulate: int = 1,
    ):
        self.model = model
        self.optimizer = optimizer
        self.accumulate = accumulate
        optimizer.init(model.trainable_parameters())  # keeps a state loaded before (a resumed run's)
        self.state = [model.state, optimizer.state, mx.random.state]
        loss_and_grad = value_and_grad(model, loss_fn, compute_dtype)

        def step(*batch):
            (loss, metrics), grads = loss_and_grad(*batch)
            return apply(loss, metrics, grads)

        def apply(loss, metrics, grads):
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

        def maybe_compiled(fn):
            return mx.compile(fn, inputs=self.state, outputs=self.state) if compile else fn

        self._step = maybe_compiled(step)
        if accumulate > 1:
            self._grads = maybe_compiled(loss_and_grad)
            self._apply = maybe_compiled(apply)

    def __call__(self, *batch):
        return self._step(*batch) if self.accumulate == 1 else self._accumulated(batch)

    def _accumulated(self, batches):
        if len(batches) != self.accumulate:
            raise ValueError(f"{len(batches)} batches for one step of accumulate={self.accumulate}")
        total = None
        for batch in batches:
            (loss, metrics), grads = self._grads(batch)
            part = (loss, metrics, grads)
            total = part if total is None else tree_map(lambda a, b: a + b, total, part)
            mx.async_eval(total)  # batch by batch: the next batch's graph is built while this one runs
        loss, metrics, grads = tree_map(lambda a: a / self.accumulate, total)
        return self._apply(loss, metrics, grads)

    def warm_up(self, batches: list, passes: int = 1) -> None:
        """Run the step on each batch `passes` times and put every captured array back: each batch shape is traced
        and compiled before the timed steps, and training is unchanged (SweepTask.warm_up_shapes' promise)."""
        saved = tree_map(lambda a: a, self.state)  # arrays are immutable: holding them is a snapshot
        for batch in batches:
            for _ in range(passes):
                mx.eval(self(*[batch] * self.accumulate))
        _put_back(self.state, saved)
        mx.eval(self.state)


__all__ = ["CompiledStep", "global_norm"]
