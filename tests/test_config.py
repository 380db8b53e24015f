"""Config: schema defaults, typed checks with numbers in the messages, the shipped configs."""

from pathlib import Path

import pytest
import yaml

from cosmocub.config import ConfigError, config_hash, flatten, load_config, resolve

REPO = Path(__file__).resolve().parents[1]


def write_yaml(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def test_defaults_come_from_the_schema():
    cfg = load_config(None)
    assert cfg.preprocess.sample_size == 32
    assert cfg.model.dense_sizes == (128, 64)
    assert cfg.optimizer.resolved_betas == (0.9, 0.999)
    assert cfg.values["preprocess"]["splits"] == {"train": 0.7, "val": 0.15, "test": 0.15}


def test_lion_betas_default_differs_from_adamw():
    cfg = load_config(None, overrides={"optimizer": {"name": "lion"}})
    assert cfg.optimizer.resolved_betas == (0.9, 0.99)


@pytest.mark.parametrize(
    "name", ["config.yaml", "test.yaml", "cosmoflow-mlperf.yaml", "science.yaml"]
)
def test_shipped_configs_load(name):
    cfg = load_config(REPO / "config" / name)
    assert cfg.model.input_size == cfg.preprocess.sample_size


def test_mlperf_config_is_the_reference_model():
    cfg = load_config(REPO / "config" / "cosmoflow-mlperf.yaml")
    m = cfg.model
    assert (m.input_size, m.base_filters, m.num_conv_blocks, m.kernel_size) == (128, 32, 5, 3)
    assert m.dense_sizes == (128, 64) and m.dropout == 0.5 and m.output_scale == 1.2
    assert cfg.optimizer.decay_factors == (0.25, 0.125)
    assert cfg.optimizer.name == "sgd" and not m.batch_norm
    assert not cfg.train.augment and cfg.evaluate.symmetries == 1
    assert m.head == "point" and load_config(None).model.head == "point"
    assert not cfg.preprocess.standardize and cfg.preprocess.log1p


def test_defaults_are_the_default_recipe():
    """A stage run by hand without --config trains what `snakemake --cores all` trains."""
    by_hand = load_config(None)
    workflow = load_config(REPO / "config" / "config.yaml")
    assert by_hand.values == workflow.values
    assert by_hand.model.batch_norm and by_hand.model.dropout == 0.0
    assert by_hand.optimizer.name == "adamw" and by_hand.train.augment
    assert by_hand.evaluate.symmetries == 8 and by_hand.preprocess.standardize


def test_mlperf_config_states_every_reference_value():
    """The reference recipe must not lean on defaults (they are the laptop recipe)."""
    raw = yaml.safe_load((REPO / "config" / "cosmoflow-mlperf.yaml").read_text())
    schema_props = load_config(None).values
    missing = [f"model.{k}" for k in schema_props["model"] if k not in raw["model"]]
    missing += [f"optimizer.{k}" for k in schema_props["optimizer"] if k not in raw["optimizer"]]
    missing.remove("optimizer.betas")  # SGD has none
    missing.remove("optimizer.lion_cub")  # options of another optimizer
    # model.name came after the file (kept as it was): its default is the reference's CosmoFlow,
    # and model.unet holds options of the other model.
    missing.remove("model.name")
    missing.remove("model.unet")
    recipe = {
        "preprocess": ["sample_size", "log1p", "standardize", "dtype"],
        "train": ["epochs", "local_batch_size", "augment"],
        "evaluate": ["symmetries"],
    }
    missing += [f"{sec}.{k}" for sec, keys in recipe.items() for k in keys if k not in raw[sec]]
    assert missing == []


def test_unknown_key_names_file_and_key(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"model": {"filters": 3}})
    with pytest.raises(
        ConfigError, match=r"c\.yaml: key 'model': Additional properties.*'filters'"
    ):
        load_config(path)


def test_wrong_type_names_key(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"train": {"epochs": "many"}})
    with pytest.raises(ConfigError, match=r"key 'train.epochs': 'many' is not of type 'integer'"):
        load_config(path)


def test_input_size_must_match_sample_size(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"model": {"input_size": 64}})
    with pytest.raises(ConfigError, match=r"'model.input_size': 64 differs from .*sample_size 32"):
        load_config(path)


def test_sample_size_must_divide_universe(tmp_path):
    values = {"universes": {"size": 48}, "preprocess": {"sample_size": 32}}
    with pytest.raises(ConfigError, match=r"32 does not divide universes.size 48"):
        load_config(write_yaml(tmp_path / "c.yaml", values))


def test_model_depth_must_fit_input(tmp_path):
    values = {"preprocess": {"sample_size": 16}, "model": {"input_size": 16, "num_conv_blocks": 5}}
    with pytest.raises(ConfigError, match=r"16 is not divisible by 2\*\*num_conv_blocks = 32"):
        load_config(write_yaml(tmp_path / "c.yaml", values))


def test_decay_lists_must_pair(tmp_path):
    values = {"optimizer": {"decay_epochs": [10], "decay_factors": [0.5, 0.1]}}
    with pytest.raises(ConfigError, match=r"1 epochs but 2 decay_factors"):
        load_config(write_yaml(tmp_path / "c.yaml", values))


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: top level must be a mapping, got list"):
        load_config(bad)


def test_hash_ignores_key_order_and_sees_values():
    a = resolve({"seed": 1, "train": {"epochs": 3}})
    b = resolve({"train": {"epochs": 3}, "seed": 1})
    c = resolve({"train": {"epochs": 4}, "seed": 1})
    assert config_hash(a) == config_hash(b) != config_hash(c)


def test_flatten():
    assert flatten({"a": {"b": 1, "c": {"d": [1, 2]}}, "e": None}) == {
        "a.b": 1,
        "a.c.d": [1, 2],
        "e": None,
    }


def test_cli_reports_bad_config_in_one_line(tmp_path, capsys):
    from cosmocub.cli import main

    path = write_yaml(tmp_path / "c.yaml", {"train": {"epochs": 0}})
    assert main(["model-summary", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "c.yaml: key 'train.epochs': 0 is less than the minimum of 1" in err


def test_strings_from_snakemake_command_line_become_typed_values():
    from cosmocub.config import coerce_cli_strings

    raw = {
        "universes": {"count": "64", "cosmoflow_dir": "null"},
        "train": {"amp": "off", "deterministic": "true", "epochs": "3"},
        "model": {"dense_sizes": "[32, 16]", "dropout": "0.25"},
        "results": "123",
    }
    cfg = load_config(None, overrides=coerce_cli_strings(raw))
    assert cfg.universes.count == 64 and cfg.universes.cosmoflow_dir is None
    assert cfg.train.amp == "off" and cfg.train.deterministic is True and cfg.train.epochs == 3
    assert cfg.model.dense_sizes == (32, 16) and cfg.model.dropout == 0.25
    assert str(cfg.results) == "123"  # a string where the schema wants one stays a string


def test_num_outputs_must_match_the_four_targets(tmp_path):
    path = write_yaml(tmp_path / "c.yaml", {"model": {"num_outputs": 1}})
    with pytest.raises(ConfigError, match=r"'model.num_outputs': 1, but the targets are the 4"):
        load_config(path)


def test_pooled_branch_is_off_unless_asked_and_checked(tmp_path):
    assert not load_config(None).model.pooled.enabled
    assert not load_config(REPO / "config" / "cosmoflow-mlperf.yaml").model.pooled.enabled
    cfg = load_config(None, overrides={"model": {"pooled": {"stats": "mean_std"}}})
    assert cfg.model.pooled.taps == ("input", "blocks") and cfg.model.pooled.join == "head_input"
    with pytest.raises(ConfigError, match=r"key 'model.pooled.stats': 'max' is not one of"):
        load_config(write_yaml(tmp_path / "c.yaml", {"model": {"pooled": {"stats": "max"}}}))
    values = {"model": {"pooled": {"stats": "mean", "taps": ["input", "input"]}}}
    with pytest.raises(ConfigError, match=r"key 'model.pooled.taps'.*non-unique"):
        load_config(write_yaml(tmp_path / "c.yaml", values))
    values = {"model": {"name": "unet", "in_channels": 1, "pooled": {"stats": "mean"}}}
    with pytest.raises(ConfigError, match=r"'model.pooled.stats': 'mean' is a CosmoFlow branch"):
        load_config(write_yaml(tmp_path / "c.yaml", values))


@pytest.mark.parametrize(
    ("values", "old", "new"),
    [
        ({"train": {"nproc_per_node": 4}}, "train.nproc_per_node", "train.ranks_per_node"),
        (
            {"parallel": {"ranks_per_node": 2}},
            "parallel.ranks_per_node",
            "parallel.assumed_ranks_per_node",
        ),
        (
            {"unet": {"train": {"nproc_per_node": 2}}},
            "unet.train.nproc_per_node",
            "unet.train.ranks_per_node",
        ),
        (
            {"step_time_study": {"points": [{"name": "a"}, {"name": "b", "nproc_per_node": 2}]}},
            "step_time_study.points.1.nproc_per_node",
            "step_time_study.points.1.ranks_per_node",
        ),
        (
            {"network_study": {"nproc_per_node": 1}},
            "network_study.nproc_per_node",
            "network_study.ranks_per_node",
        ),
        (
            {"scaling_study": {"nproc_per_node": 1}},
            "scaling_study.nproc_per_node",
            "scaling_study.ranks_per_node",
        ),
        (
            {"network_study": {"bandwidths_mbit": [0, 100]}},
            "network_study.bandwidths_mbit",
            "network_study.rates_mbit",
        ),
        (
            {"scaling_study": {"bandwidth_mbit": 100}},
            "scaling_study.bandwidth_mbit",
            "scaling_study.rate_mbit",
        ),
    ],
)
def test_a_renamed_key_is_refused_in_one_line_naming_file_old_and_new(tmp_path, values, old, new):
    path = write_yaml(tmp_path / "old.yaml", values)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: key '{old}' was renamed: write '{new}' instead (")


def test_the_config_derives_world_size_data_ranks_and_global_batch():
    values = {
        "train": {"ranks_per_node": 4, "local_batch_size": 5},
        "parallel": {"spatial": 2},
        "cluster": {"train": {"nodes": 3}},
    }
    cfg = load_config(None, overrides=values)
    # 3 nodes × 4 ranks = 12, in pairs on one sample: 6 data ranks × 5 samples = 30 a step.
    assert (cfg.world_size, cfg.data_ranks, cfg.global_batch) == (12, 6, 30)
    one = load_config(None)
    assert (one.world_size, one.data_ranks, one.global_batch) == (1, 1, 8)
    odd = load_config(None, overrides={"train": {"ranks_per_node": 3}, "parallel": {"spatial": 2}})
    assert odd.world_size == 3
    match = (
        r"key 'train.ranks_per_node': 3 ranks \(cluster.train.nodes 1 × train.ranks_per_node 3\) "
        r"do not divide into groups of parallel.spatial 2"
    )
    with pytest.raises(ConfigError, match=match):
        _ = odd.global_batch
