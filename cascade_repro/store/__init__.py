"""Where records live: MLflow (runs, params, metrics, tags, artifacts) and, later, DVC (content)."""
