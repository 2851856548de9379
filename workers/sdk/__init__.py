"""The Cosched training SDK (importable without Django; standard library only).

    from workers.sdk import report, split_batch

    sizes = split_batch(256, [0, 7, 3, 0])     # [0, 180, 76, 0]: adds up to 256
    reply = report(iteration=i, epoch_end=True) # at an epoch end: SD out, ratio and workers in

See ``workers.sdk.client`` and docs/slowdown.md (with a PyTorch example).
"""

from workers.sdk.client import (
    Reply,
    SdkError,
    TrainingClient,
    default_client,
    report,
    split_batch,
    split_tensor,
)

__all__ = [
    "Reply",
    "SdkError",
    "TrainingClient",
    "default_client",
    "report",
    "split_batch",
    "split_tensor",
]
