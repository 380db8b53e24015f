"""Synthetic N-body universes: linear power spectrum and growth, 2LPT initial conditions,
particle-mesh gravity and per-voxel particle counts in the cosmoUniverse layout."""
