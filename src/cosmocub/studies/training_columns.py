"""The columns of a point's row that several studies' tables share, written once: the timing
studies' step parts in seconds and the bytes a rank sent per step (engine.training_row), and the
accuracy studies' learning-rate selection (accuracy.py).
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
# The accuracy studies' learning rate, its grid and which one was kept by what
# (accuracy.select_lr_per_group), the budget they had and what they were chosen by
# (accuracy.evaluated_point_rows).
LR_SELECTION_COLUMNS = (
    "lr",
    "lr_grid",
    "selected",
    "selected_by",
    "steps",
    "final_val_loss",
    "val_universe_mae",
)
