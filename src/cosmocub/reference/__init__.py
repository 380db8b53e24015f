"""Reference pages drawn from what the code declares, never written by hand: the config keys from
the schema (`config_page`), the `cosmocub` stages and flags from the CLI's parser (`cli_page`),
the Snakemake targets from the workflow (`targets_page`).

The documentation site builds them each time (docs/hooks.py), so a key, flag or target added
anywhere appears there with no edit to a page; tests/test_docs.py checks that each one does.
"""
