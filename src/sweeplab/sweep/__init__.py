"""The sweep's control: the Hydra callback that opens and closes the sweep's MLflow run and writes its report."""
