"""One typed, frozen config tree, loaded from YAML plus ``--set a.b=value`` overrides.

Validation names the field path and what was expected (``algorithm.beta: expected a number >= 0, got -1``);
unknown fields get a "did you mean". ``algorithm.preset`` expands into explicit fields (presets.py) before the
user's own algorithm fields are applied on top, so the resolved config is always fully explicit.

- ``schema``: the sections as frozen dataclasses, every default defined once;
- ``build``: YAML / mappings / ``--set`` overrides to a Config and back (from_dict, load_config, to_dict);
- ``checks``: the range checks (validate, get_path).

May import: algo, presets, errors. Imported by everything above it.
"""

from .build import (
    CliText,
    from_dict,
    load_config,
    move_speed_fields,
    number_map,
    parse_option,
    parse_override,
    recorded_config,
    set_path,
    to_dict,
)
from .checks import TRACKERS, get_path, validate
from .schema import (
    SPEED_FIELDS_MOVED,
    AlgorithmConfig,
    Config,
    CriticConfig,
    DistillConfig,
    EvalConfig,
    JudgeConfig,
    LoraConfig,
    ModelConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutConfig,
    RunConfig,
    SpeedConfig,
    TaskConfig,
    TrainConfig,
)

__all__ = [
    "SPEED_FIELDS_MOVED",
    "TRACKERS",
    "AlgorithmConfig",
    "CliText",
    "Config",
    "CriticConfig",
    "DistillConfig",
    "EvalConfig",
    "JudgeConfig",
    "LoraConfig",
    "ModelConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RunConfig",
    "SpeedConfig",
    "TaskConfig",
    "TrainConfig",
    "from_dict",
    "get_path",
    "load_config",
    "move_speed_fields",
    "number_map",
    "parse_option",
    "parse_override",
    "recorded_config",
    "set_path",
    "to_dict",
    "validate",
]
