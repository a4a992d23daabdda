"""One config tree: YAML defaults per stage + experiment files + ``key=value`` overrides.

``configs/<stage>/default.yaml`` holds every key of a stage with its type/meaning in a comment.
An experiment file (e.g. ``configs/pretrain/mpcl_dual.yaml``) overrides a handful of those keys and
may name another experiment file it builds on with ``_base_: other.yaml``. Command-line overrides
``a.b=1`` come last. Every key of an experiment file or override must already exist in the defaults:
a misspelled key is an error with a did-you-mean hint (as Ultralytics does). Values are parsed as
YAML scalars/lists (``yaml.safe_load``), never evaluated, then checked against the type and range
each key's comment in the defaults states (:mod:`gsdistill.config_schema`), for every stage.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Iterable

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gsdistill.config_schema import check_value, parse_spec, read_comments
from gsdistill.errors import GsdistillError


class ConfigError(GsdistillError, ValueError):
    """A config file or override that cannot be applied (unknown key, bad syntax, missing file,
    a value of the wrong type or out of range)."""


def configs_dir() -> Path:
    """The ``configs/`` tree: ``$GSDISTILL_CONFIGS`` or the one beside the package (editable install)."""
    env = os.environ.get("GSDISTILL_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "configs"


def _dotted_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for k, v in cfg.items():
        full = f"{prefix}{k}"
        keys.append(full)
        if isinstance(v, DictConfig):
            keys.extend(_dotted_keys(v, full + "."))
    return keys


def _check_keys(base: DictConfig, extra: DictConfig, source: str, prefix: str = "",
                all_keys: list[str] | None = None) -> None:
    """Raise ConfigError for any key in ``extra`` that ``base`` does not have."""
    all_keys = _dotted_keys(base) if all_keys is None else all_keys
    for k, v in extra.items():
        full = f"{prefix}{k}"
        if k not in base:
            hint = difflib.get_close_matches(full, all_keys, n=3, cutoff=0.5)
            msg = f"{source}: unknown config key '{full}'"
            if hint:
                msg += f"; did you mean {' or '.join(repr(h) for h in hint)}?"
            raise ConfigError(msg)
        sub = base[k]
        if isinstance(v, DictConfig) and isinstance(sub, DictConfig):
            _check_keys(sub, v, source, full + ".", all_keys)
        elif isinstance(v, DictConfig) and sub is not None and not isinstance(sub, DictConfig):
            raise ConfigError(f"{source}: '{full}' is a value in the defaults, not a section")


_FLOAT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _coerce(value):
    """YAML 1.1 reads ``1e-4`` (no dot) as a string; every config means the number."""
    if isinstance(value, str) and _FLOAT.match(value.strip()):
        return float(value)
    if isinstance(value, dict):
        return {k: _coerce(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_coerce(v) for v in value]
    return value


def _read_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = _coerce(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return OmegaConf.create(data)


def _resolve_experiment(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, DictConfig]]:
    """The chain of experiment files, base first (``_base_`` is relative to the file naming it)."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{path}: _base_ cycle")
    cfg = _read_yaml(path)
    chain = []
    if "_base_" in cfg:
        base = path.parent / str(cfg.pop("_base_"))
        chain = _resolve_experiment(base, seen + (path,))
    return chain + [(path, cfg)]


def parse_overrides(overrides: Iterable[str]) -> list[tuple[str, object]]:
    out = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        try:
            value = _coerce(yaml.safe_load(raw)) if raw != "" else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override '{item}': value is not valid YAML ({e})") from None
        out.append((key, value))
    return out


def load_config(stage: str, experiment: str | os.PathLike | None = None,
                overrides: Iterable[str] = (), base: str | os.PathLike | None = None) -> DictConfig:
    """Defaults of ``stage`` <- ``base`` <- experiment file chain <- ``key=value`` overrides; every
    value checked against its commented type and range; struct-locked result.

    ``experiment`` may be a path, or a name looked up in ``configs/<stage>/`` (``.yaml`` optional).
    ``base``: a resolved config file (e.g. a checkpoint's ``config.yaml``) applied before it.
    """
    default_path = configs_dir() / stage / "default.yaml"
    defaults = _read_yaml(default_path)
    cfg = defaults.copy()  # overrides update cfg in place; the checks need the untouched defaults
    chain = [(Path(base), _read_yaml(Path(base)))] if base is not None else []
    if experiment is not None:
        exp = Path(experiment)
        if not exp.is_file():
            cand = configs_dir() / stage / (exp.name if exp.suffix else exp.name + ".yaml")
            exp = cand if cand.is_file() else exp
        chain += _resolve_experiment(exp)
    for path, part in chain:
        _check_keys(cfg, part, str(path))
        cfg = _merge(cfg, part, str(path))
    OmegaConf.set_struct(cfg, True)
    all_keys = _dotted_keys(cfg)
    for key, value in parse_overrides(overrides):
        if key not in all_keys:
            hint = difflib.get_close_matches(key, all_keys, n=3, cutoff=0.5)
            msg = f"command line: unknown config key '{key}'"
            if hint:
                msg += f"; did you mean {' or '.join(repr(h) for h in hint)}?"
            raise ConfigError(msg)
        node = OmegaConf.select(cfg, key)
        if isinstance(value, dict) and isinstance(node, DictConfig):
            if len(node):
                _check_keys(node, OmegaConf.create(value), "command line", key + ".", all_keys)
            else:  # a default of {} is a free-form mapping (e.g. loss keyword arguments)
                OmegaConf.set_struct(node, False)
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"command line: cannot set '{key}' to {value!r} ({str(e).splitlines()[0]})") from None
    check_config(cfg, defaults, default_path)
    return cfg


def _merge(cfg: DictConfig, part: DictConfig, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, part)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{source}: {str(e).splitlines()[0]}") from None


def check_config(cfg: DictConfig, defaults: DictConfig, default_path: Path) -> None:
    """Check (and normalise in place) every value against the type and range its comment in
    ``default_path`` states; the first bad one raises a ConfigError naming the key."""
    comments = read_comments(default_path)
    values = OmegaConf.to_container(cfg, resolve=False)
    plain_defaults = OmegaConf.to_container(defaults, resolve=False)
    fixes: list[tuple[str, object]] = []

    def walk(node: dict, dnode: dict, prefix: str) -> None:
        for k, default in dnode.items():
            key, value = prefix + k, node.get(k)
            comment = comments.get(key, "")
            if isinstance(default, dict) and (bool(default) or parse_spec(comment) is None):  # a section
                if not isinstance(value, dict):
                    raise ConfigError(f"config key '{key}' is a section (a mapping of keys), got {value!r}")
                walk(value, default, key + ".")
                continue
            try:
                new = check_value(key, value, default, parse_spec(comment))
            except ValueError as e:
                where = f"configs/{default_path.parent.name}/default.yaml"
                hint = f" ({where}: '{comment[:70]}')" if comment else ""
                raise ConfigError(f"config key '{key}': {e}{hint}") from None
            if repr(new) != repr(value):  # normalised (1 -> 1.0 for a float key, ...)
                fixes.append((key, new))

    walk(values, plain_defaults, "")
    for key, new in fixes:
        OmegaConf.update(cfg, key, new, merge=False)


def save_config(cfg: DictConfig, run_dir: str | os.PathLike, name: str = "config.yaml") -> Path:
    """Write the resolved config into ``run_dir`` (created) and return its path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / name
    path.write_text(OmegaConf.to_yaml(cfg, resolve=True))
    return path


def to_dict(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
