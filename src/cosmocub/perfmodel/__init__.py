"""A performance model of the training step: α–β collective costs fitted from a micro-benchmark,
per-layer compute from measured rates (or an accelerator's peak × efficiency), and a prediction of
the step's breakdown for any model, mesh, optimizer and network."""
