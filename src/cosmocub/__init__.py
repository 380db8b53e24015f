"""cosmocub: CosmoFlow with hybrid parallelism, Lion Cub, MLflow and Snakemake."""

__version__ = "0.1.0"
