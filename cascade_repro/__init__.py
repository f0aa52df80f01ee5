"""cascade: experiment tracking and reproducibility for PyTorch training.

What a training script uses (importing this package loads no mlflow, dvc, git, docker or torch):

    import cascade_repro
    hp = cascade_repro.params()                       # resolved hyperparameters of this run
    cascade_repro.log_metrics({"loss": 0.3}, step=s)  # microseconds; batched into MLflow
    cascade_repro.checkpoint(state, step=s, metrics={"val_loss": v}, monitor="val_loss")  # top-k, DVC
    state = cascade_repro.load_checkpoint("v1.2.3", "best", map_location="cpu")
"""

from typing import Any

from cascade_repro.child.runtime import checkpoint, flush, log_metric, log_metrics, params

__version__ = "0.1.0"

__all__ = ["__version__", "checkpoint", "flush", "load_checkpoint", "log_metric", "log_metrics", "params"]


def load_checkpoint(ref: str, which: str = "best", map_location: Any = None, **kwargs: Any) -> Any:
    """`torch.load` of a recorded run's checkpoint, fetched from the DVC cache or remote, md5-verified.

    >>> state = cascade_repro.load_checkpoint("v1.2.3", "best", map_location="cpu")
    `which`: best | last | a step number | a path. Run it inside the project's git repository.
    """
    import torch

    from cascade_repro.api.data import checkpoint_path  # mlflow and dvc: only when asked

    return torch.load(checkpoint_path(ref, which), map_location=map_location, **kwargs)
