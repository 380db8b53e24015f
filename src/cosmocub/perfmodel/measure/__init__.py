"""What the performance model measures on this machine: collective micro-benchmarks and their
α–β fits per link, and the CPU's compute rates per layer kind (calibration)."""
