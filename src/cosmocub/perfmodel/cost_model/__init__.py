"""The step's cost model: the mesh and network a prediction runs on, collectives and layers priced
on them, DDP's overlap, and the machines (accelerators, this CPU)."""
