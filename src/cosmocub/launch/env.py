"""The environment variables the launcher and its torchrun agent set for the ranks they start.

One set of names for launcher.py, agent.py, multirank.py and netemu/runner.py; the ranks read them.
"""

from __future__ import annotations

# The agent's pid, for the ranks it starts: a rank whose parent is not this pid any more (the
# agent died before the rank armed its death signal) ends at once. Ranks started by srun have
# slurmstepd as their parent and no such variable: the step ends them (see
# cosmocub.launch.launcher).
AGENT_PID_ENV = "COSMOCUB_AGENT_PID"
# Where a rank records that it stopped on a user error (in the working directory, which a
# cluster's nodes share), and which attempt the ranks run in (0 = first).
USER_ERROR_ENV = "COSMOCUB_USER_ERROR_FILE"
# Where a rank records that a peer's connection dropped (a lost node, a cut link): inside an
# allocation the launcher then starts no ranks again (see cosmocub.launch.launcher).
PEER_LOST_ENV = "COSMOCUB_PEER_LOST_FILE"
ATTEMPT_ENV = "COSMOCUB_LAUNCH_ATTEMPT"
# The cores each rank was granted; read on the ranks' side by cosmocub.parallel.parallel_dims.
CPUS_PER_RANK_ENV = "COSMOCUB_CPUS_PER_RANK"
# Variables of an enclosing `cosmocub launch` that must not leak into a nested one.
LAUNCH_VARS = (USER_ERROR_ENV, PEER_LOST_ENV, ATTEMPT_ENV, AGENT_PID_ENV)
