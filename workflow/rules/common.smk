# Config validation (the schema fills defaults), derived paths, and every input function.
import os

from snakemake.utils import validate

from cosmocub import workflow_support as ws
from cosmocub.config import coerce_cli_strings, from_values

coerce_cli_strings(config)  # nested --config values arrive as strings
validate(config, "../schemas/config.schema.yaml")
CFG = from_values(config, source="snakemake config")
# Which config is in effect, in every invocation's output (dry runs too): the files given, or the
# embedded default, plus the schema's defaults; the hash names the resolved file jobs read.
logger.info(
    f"cosmocub config {CFG.hash}: "
    f"{' + '.join(map(str, workflow.configfiles)) or 'no config file'} + schema defaults"
)
RESULTS = str(CFG.results)
UNIVERSE_IDS = ws.universe_ids(CFG)
# The resolved config is content-addressed: jobs read it by path, and a config change that
# does not touch a rule's own sections (its params) does not rerun that rule.
RESOLVED_CONFIG = ws.resolved_config_path(CFG)
# Jobs find it through the environment rather than an input file or param, so that changing one
# section reruns only the rules whose `params: settings=section(...)` hold that section.
os.environ[ws.CONFIG_ENV] = RESOLVED_CONFIG
RUN = CFG.train.run_name


def section(*names):
    """Config sections that a job depends on, for its params (a change there reruns it)."""
    return {name: config[name] for name in names}


def universe_files(wildcards=None):
    return expand(f"{RESULTS}/universes/{{universe}}.hdf5", universe=UNIVERSE_IDS)


def tracking_env(rule_name):
    """Environment that tags a job's MLflow child run with its rule and wildcards."""

    def env(wildcards):
        pairs = ",".join(f"{k}={v}" for k, v in wildcards.items())
        return f"COSMOCUB_RULE={rule_name} COSMOCUB_WILDCARDS='{pairs}'"

    return env


def study_ranks(wildcards):
    """Ranks of the sample-size study's run at one crop size ({size}), all on one node."""
    spatial = dict(zip(CFG.sample_size_study.sizes, CFG.sample_size_study.spatial))
    return spatial[int(wildcards.size)] * CFG.train.nproc_per_node
