"""ddpwatch: names the culprit when a distributed PyTorch run stops making progress.

`import ddpwatch` never imports torch: the daemon and CLI stay light. Training
scripts call `ddpwatch.instrument()`, which imports the torch side lazily.
"""
__version__ = "0.1.0"


def instrument(model=None, **identity):
    """Write heartbeats at every torch.distributed collective of this process.

    One line in a training script: `ddpwatch.instrument()`. Idempotent. Pass a
    DDP `model` to hook its gradient buckets now (otherwise any DDP model is hooked
    at its first forward). `identity` fields (compute_dtype, data_fingerprint,
    data_batches, data_shards, run_id...) go into the record.
    """
    from .rank import instrumentation
    return instrumentation.instrument(model=model, **identity)


def step(tokens: int = 0) -> None:
    """Mark the end of a training step that processed `tokens` tokens."""
    from .rank import instrumentation
    instrumentation.step(tokens)


def set_identity(**fields) -> None:
    """Update identity fields of this process's heartbeat record."""
    from .rank import instrumentation
    instrumentation.set_identity(**fields)
