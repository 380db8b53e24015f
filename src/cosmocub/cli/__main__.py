"""`python -m cosmocub.cli`: what `cosmocub launch` starts every rank with; its exit status is
the stage's (2 for a user error), which the launcher reads to decide on a restart."""

import sys

from cosmocub.cli import main

sys.exit(main())
