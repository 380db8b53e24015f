"""LionCub's checkpoint state: each data rank saves and loads its own momentum, and no rank ever
holds another's (all of them together are D × the model: 18 GB for CosmoFlow at 512 ranks).

The layout before this one, every data rank's rows gathered by data rank 0, still loads.
"""

from __future__ import annotations

from typing import Any

import torch


def own_state(
    base: dict[str, Any], *, step_count: int, data_group_size: int, data_rank: int
) -> dict[str, Any]:
    """This data rank's state from `base` (torch's Optimizer.state_dict, whose exp_avg are views
    of LionCub's bucket buffers): {"state": {i: {"exp_avg": (*shape of parameter i)}},
    "param_groups", "step_count", "data_group_size": D, "data_rank": r}, on the CPU.

    No communication and no copy on a CPU (the views themselves; one row to the host from a
    GPU): each data rank writes what it returns to a file of its own."""
    state = {i: {"exp_avg": entry["exp_avg"].cpu()} for i, entry in base["state"].items()}
    return {
        "state": state,
        "param_groups": base["param_groups"],
        "step_count": step_count,
        "data_group_size": data_group_size,
        "data_rank": data_rank,
    }


def own_rows(
    state_dict: dict[str, Any], *, data_group_size: int, data_rank: int
) -> dict[int, torch.Tensor]:
    """{parameter index: this data rank's momentum} from a saved state; ValueError for another
    group size, another rank's own state, or rows that are not every data rank's."""
    saved, rank = state_dict["data_group_size"], data_rank
    if saved != data_group_size:
        raise ValueError(
            f"LionCub checkpoint holds {saved} data ranks' momenta, this run has {data_group_size}"
        )
    if "data_rank" in state_dict:  # one data rank's own (own_state)
        if state_dict["data_rank"] != rank:
            raise ValueError(
                f"LionCub state of data rank {state_dict['data_rank']} loaded on data rank "
                f"{rank} of {saved}: each data rank loads the state it saved (its own momentum)"
            )
        return {int(i): e["exp_avg"] for i, e in state_dict["state"].items()}
    # Written before: data rank 0's gather of every rank's momentum, (D, *shape), rank order.
    rows = {e["exp_avg_per_data_rank"].shape[0] for e in state_dict["state"].values()}
    if rows - {saved}:
        raise ValueError(
            f"LionCub state holds {sorted(rows)} rows of momenta for {saved} data ranks: "
            "load the state_dict that data rank 0 returned (the others hold their own row)"
        )
    return {int(i): e["exp_avg_per_data_rank"][rank] for i, e in state_dict["state"].items()}
