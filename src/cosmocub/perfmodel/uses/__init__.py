"""What the performance model is used for: predict a config's run, validate against a study's
measurements, extrapolate to clusters, and the `perf-model` stages."""
