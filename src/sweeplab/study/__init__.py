"""A replicated study: the record of a sweep read from MLflow, replicates, the verdict and how far a speed can be trusted."""
