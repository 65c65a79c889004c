"""From YAML, a mapping or ``--set a.b=value`` overrides to a Config: types coerced with the field path in every error,
unknown fields with a "did you mean", the preset expanded before the user's own fields, speed switches read at
their old places; and back to a plain mapping (to_dict)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import logging
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from ..errors import ConfigError
from ..presets import PRESETS
from .checks import validate
from .schema import FIELDS_RENAMED, SPEED_FIELDS_MOVED, AlgorithmConfig, Config

log = logging.getLogger("grpolab.config")


def _expected(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, str) and tp is not str:
        return "one of " + ", ".join(repr(m.value) for m in tp)  # StrEnum
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", dict: "a mapping"}.get(
        tp, str(tp)
    )


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 reads 1e-5 (no dot) as a string; accept it as the number every user means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _coerce(path: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and {True: "on", False: "off"}[value] in choices:
            value = {True: "on", False: "off"}[value]  # YAML 1.1 reads an unquoted off / on as a boolean
        ok = value in choices
    elif isinstance(tp, type) and issubclass(tp, str) and tp is not str:
        ok = isinstance(value, str) and value in {m.value for m in tp}
        value = tp(value) if ok else value
    elif tp is float:  # a finite number: inf / nan (YAML .inf, --set x=inf) would train on NaN weights
        value = _yaml_float(value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        value = float(value) if ok else value
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp in (bool, str, dict):
        ok = isinstance(value, tp)
        if ok and path in NUMBER_MAPS:
            value = number_map(path, value)
    elif origin in (typing.Union, types.UnionType):
        ok = True
    else:
        ok = True
    if not ok:
        removed = REMOVED_CHOICES.get((path, value), "") if isinstance(value, str) else ""
        raise ConfigError(f"{path}: expected {_expected(tp)}, got {value!r}{removed and f' ({removed})'}")
    return value


REMOVED_CHOICES = {  # (field, value) of a choice grpolab no longer has -> why, named in the error
    ("rollout.decoder", value): f"the {value!r} decoder was removed: it sampled the same tokens as 'grpolab' and was "
    "no faster in a GRPO step (docs/performance.md keeps its measurement); use 'grpolab'"
    for value in ("static", "static_compiled")
}


NUMBER_MAPS = ("reward.weights",)  # mapping fields whose values are numbers (names -> weight)


def number_map(path: str, value: dict, sep: str = ".") -> dict:
    """{name: finite number} with YAML 1.1's string numbers ('1e-3') read as numbers; else a ConfigError naming the
    entry: ``reward.weights.correct: expected a finite number, got 'high'``."""
    out = {}
    for name, w in value.items():
        number = _yaml_float(w)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{path}: expected names as keys, got {name!r}")
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise ConfigError(f"{path}{sep}{name}: expected a finite number, got {w!r}")
        out[name] = float(number) if isinstance(w, str) else number
    return out


def _build(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping of fields, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = (
                f"; did you mean '{path + '.' if path else ''}{close[0]}'?"
                if close
                else f"; known fields: {', '.join(names)}"
            )
            raise ConfigError(f"unknown field '{where}'{hint}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, where)
        else:
            kwargs[key] = _coerce(where, tp, _from_cli(value, tp))
    return cls(**kwargs)


def _expand_preset(raw: dict) -> dict:
    """raw with its algorithm mapping = the preset's differences from the defaults, then the user's own fields."""
    algo = raw.get("algorithm") or {}
    if not isinstance(algo, dict):
        raise ConfigError(f"algorithm: expected a mapping of fields, got {algo!r}")
    preset = algo.get("preset", AlgorithmConfig.preset)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"algorithm.preset: expected one of {', '.join(map(repr, PRESETS))}, got {preset!r}")
    return {**raw, "algorithm": {"preset": preset, **PRESETS[preset], **algo}}


def set_path(raw: dict, dotted: str, value: Any) -> None:
    """raw[a][b][c] = value for dotted = 'a.b.c' (intermediate mappings created as needed)."""
    parts = dotted.split(".")
    node = raw
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: '{p}' is not a mapping")
    node[parts[-1]] = value


class CliText(str):
    """The raw text of a --set value: kept verbatim for string fields, parsed as YAML for all others."""


def _from_cli(value: Any, tp: Any = None) -> Any:
    if isinstance(value, dict):
        return {k: _from_cli(v) for k, v in value.items()}
    if isinstance(value, CliText):
        return str(value) if tp is str else _yaml_or_text(str(value))
    return value


def _yaml_or_text(text: str) -> Any:
    """A --set / --task-option value read as YAML (numbers, booleans, lists), or kept as the text it is when it is
    not valid YAML on its own (e.g. `operators=*`, which YAML would read as an alias).

    >>> _yaml_or_text("12"), _yaml_or_text("*"), _yaml_or_text("[1, 2]"), _yaml_or_text("")
    (12, '*', [1, 2], '')
    """
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_override(text: str) -> tuple[str, Any]:
    """'train.steps=50' -> ('train.steps', CliText('50')); the value becomes 50 for an int field, '50' for a
    string field, and is otherwise read as YAML (numbers, booleans, lists)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. train.steps=50")
    key, value = text.split("=", 1)
    return key.strip(), CliText(value)


def parse_option(text: str) -> tuple[str, Any]:
    """'digits=2' -> ('digits', 2): a KEY=VALUE option outside the typed tree (task options), read as YAML."""
    key, value = parse_override(text)
    return key, _from_cli(value)


def move_speed_fields(raw: dict, warn: bool = True) -> dict:
    """raw with every speed switch still set at its old place (SPEED_FIELDS_MOVED) moved to ``speed:``; both
    places set is an error. raw itself is left as it is.

    >>> move_speed_fields({"train": {"share_prompt": False, "steps": 3}}, warn=False)
    {'train': {'steps': 3}, 'speed': {'share_prompt': False}}
    """
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for name, section in SPEED_FIELDS_MOVED.items():
        old = out.get(section)
        if not isinstance(old, dict) or name not in old:
            continue
        speed = out.setdefault("speed", {})
        if not isinstance(speed, dict):
            raise ConfigError(f"speed: expected a mapping of fields, got {speed!r}")
        if name in speed:
            raise ConfigError(f"{section}.{name} and speed.{name} are both set; {section}.{name} moved to speed.{name}")
        speed[name] = old.pop(name)
        if warn:
            log.warning("%s.%s moved to speed.%s; read as that (set speed.%s instead)", section, name, name, name)
    for (section, old_name), name in FIELDS_RENAMED.items():  # a field renamed in place: read under its name now
        part = out.get(section)
        if isinstance(part, dict) and old_name in part:
            if name in part:
                raise ConfigError(f"{section}.{old_name} and {section}.{name} are both set; it was renamed {name}")
            part[name] = part.pop(old_name)
    return out


# Fields added after runs were recorded whose default today is not what the earlier versions did: a recorded config
# that lacks one (written before the field existed) is read with the value that continues the run as it began.
EARLIER_BEHAVIOUR = {
    ("algorithm", "clip_cov_select"): "largest",  # the covariance selection before the random draw became the default
    ("algorithm", "ref_reset_optimizer"): False,  # the reference reset before it cleared the optimizer by default
    ("algorithm", "pi_old"): "trainer",  # the DPPO presets before they anchored on the sampler
}


def recorded_config(raw: dict) -> dict:
    """A config as a run's manifest recorded it, with each field of EARLIER_BEHAVIOUR it lacks set to the earlier
    behaviour (every other missing field takes today's default when built: those reproduce what earlier versions did).
    raw itself is left as it is.

    >>> recorded_config({"algorithm": {"surrogate": "clip_cov"}})["algorithm"]["clip_cov_select"]
    'largest'
    >>> recorded_config({"algorithm": {"clip_cov_select": "random"}})["algorithm"]["clip_cov_select"]
    'random'
    """
    out = copy.deepcopy(raw)
    for (section, name), value in EARLIER_BEHAVIOUR.items():
        part = out.setdefault(section, {})
        if isinstance(part, dict) and name not in part:
            part[name] = value
    return out


def from_dict(raw: dict) -> Config:
    cfg = _build(Config, _expand_preset(move_speed_fields(raw)), "")
    validate(cfg)
    return cfg


def load_config(path: str | Path | None, overrides: list[str] = ()) -> Config:
    """Read YAML (None = defaults), apply --set overrides, expand the preset, validate."""
    raw: dict = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML ({e})") from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{p}: not a UTF-8 text file (byte {e.start}: {e.reason}); expected a YAML config"
            ) from None
        except OSError as e:
            raise ConfigError(f"{p}: cannot read the config file ({e.strerror or e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: expected a mapping at the top level")
    for text in overrides:
        set_path(raw, *parse_override(text))
    return from_dict(raw)


def to_dict(cfg: Config) -> dict:
    """Plain, JSON-serialisable dict of the resolved config (enums as their string values)."""
    return _plain(dataclasses.asdict(cfg))


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.value if isinstance(x, enum.Enum) else x
