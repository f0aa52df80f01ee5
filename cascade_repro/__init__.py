"""cascade: experiment tracking and reproducibility for PyTorch training.

What a training script uses (importing this package loads no mlflow, dvc, git, docker or torch):

    import cascade_repro
    hp = cascade_repro.params()                       # resolved hyperparameters of this run
    cascade_repro.log_metrics({"loss": 0.3}, step=s)  # microseconds; batched into MLflow
"""

from cascade_repro.child.runtime import flush, log_metric, log_metrics, params

__version__ = "0.1.0"

__all__ = ["__version__", "flush", "log_metric", "log_metrics", "params"]
