"""Text from the code made safe for a Markdown table cell."""

from __future__ import annotations

import re


def cell(text: str) -> str:
    """One line; `<name>` outside code spans kept as text, not swallowed as an HTML tag (help
    texts say `synth_<seed>.hdf5`); a pipe escaped, which would otherwise end the cell."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    safe = [p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts]
    return "".join(safe).replace("|", "\\|")
