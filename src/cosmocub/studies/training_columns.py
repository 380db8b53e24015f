"""The columns of a point's training row (engine.training_row) that the timing studies' tables
share, written once: the step's parts in seconds and the bytes a rank sent, per step.
"""

# Per-step means after the first epoch; step_s is compute + exchange + momentum sync (+ halo).
STEP_TIME_COLUMNS = (
    "step_s",
    "compute_s",
    "exchange_s",
    "exchange_busy_s",
    "exchange_exposed_s",
    "momentum_sync_s",
)
# What a rank sent per step for its exchange and momentum sync, and the part of it that stayed
# inside its node or crossed to another.
COMM_BYTES_COLUMNS = (
    "comm_bytes_per_step",
    "comm_bytes_intra_per_step",
    "comm_bytes_inter_per_step",
)
