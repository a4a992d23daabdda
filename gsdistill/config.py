"""One config tree: YAML defaults per stage + experiment files + ``key=value`` overrides.

``configs/<stage>/default.yaml`` holds every key of a stage with its type/meaning in a comment.
An experiment file (e.g. ``configs/pretrain/mpcl_dual.yaml``) overrides a handful of those keys and
may name another experiment file it builds on with ``_base_: other.yaml``. Command-line overrides
``a.b=1`` come last. Every key of an experiment file or override must already exist in the defaults:
a misspelled key is an error with a did-you-mean hint (as Ultralytics does). Values are parsed as
YAML scalars/lists (``yaml.safe_load``), never evaluated, then checked against the type and range
each key's comment in the defaults states (:mod:`gsdistill.config_schema`), for every stage.

A section whose comment starts with ``keys of configs/<other>/default.yaml`` embeds another stage's
config (the ablation runner's ``pretrain``, ``detect`` and ``eval`` sections): it holds only the keys
it sets, and each is checked, key and value, against that stage's defaults, with the same
did-you-mean hint. ``load_config(other, ..., layers=[section])`` applies it to the other stage.
"""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Iterable, Mapping

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
            raise _unknown(full, all_keys, source)
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


def experiment_files(stage: str, experiment: str | os.PathLike | None) -> list[Path]:
    """The files an experiment config is read from (the file and its ``_base_`` chain), found as
    :func:`load_config` finds them; [] for none. They are inputs of the command: never an output."""
    if experiment is None:
        return []
    exp = Path(experiment)
    if not exp.is_file():
        cand = configs_dir() / stage / (exp.name if exp.suffix else exp.name + ".yaml")
        exp = cand if cand.is_file() else exp
    if not exp.is_file():
        return []
    try:
        return [path for path, _ in _resolve_experiment(exp)]
    except Exception:  # noqa: BLE001 -- load_config reports a broken chain; the check needs what exists
        return [exp.resolve()]


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


_EMBEDS = re.compile(r"^keys of configs/(\w+)/default\.yaml\b")


def embedded_stages(default_path: Path) -> dict[str, str]:
    """Dotted section key -> the stage whose keys it holds (comment ``keys of configs/<stage>/default.yaml``)."""
    return {key: m.group(1) for key, comment in read_comments(default_path).items()
            if (m := _EMBEDS.match(comment))}


def _unknown(key: str, all_keys: list[str], source: str) -> ConfigError:
    hint = difflib.get_close_matches(key, all_keys, n=3, cutoff=0.5)
    msg = f"{source}: unknown config key '{key}'"
    if hint:
        msg += f"; did you mean {' or '.join(repr(h) for h in hint)}?"
    return ConfigError(msg)


def load_config(stage: str, experiment: str | os.PathLike | None = None,
                overrides: Iterable[str] = (), base: str | os.PathLike | None = None,
                layers: Iterable[Mapping] = ()) -> DictConfig:
    """Defaults of ``stage`` <- ``base`` <- experiment file chain <- ``layers`` <- ``key=value``
    overrides; every value checked against its commented type and range; struct-locked result.

    ``experiment`` may be a path, or a name looked up in ``configs/<stage>/`` (``.yaml`` optional).
    ``base``: a resolved config file (e.g. a checkpoint's ``config.yaml``) applied before it.
    ``layers``: mappings of keys (e.g. an embedded section of another stage's config) applied after
    the experiment chain, with the same key checks as an experiment file.
    """
    default_path = configs_dir() / stage / "default.yaml"
    defaults = _read_yaml(default_path)
    embeds = embedded_stages(default_path)
    schema = defaults.copy()  # every key that may be set: an embedded section knows its stage's keys
    for key, other in embeds.items():
        other_defaults = _read_yaml(configs_dir() / other / "default.yaml")
        section = OmegaConf.select(defaults, key)
        if not isinstance(section, DictConfig):
            raise ConfigError(f"{default_path}: '{key}' must be a section (keys of configs/{other}/default.yaml)")
        _check_keys(other_defaults, section, f"{default_path}, section '{key}'")
        OmegaConf.update(schema, key, _merge(other_defaults, section, str(default_path)), merge=False)
    cfg = defaults.copy()  # overrides update cfg in place; the checks need the untouched defaults
    chain = [(Path(base), _read_yaml(Path(base)))] if base is not None else []
    if experiment is not None:
        exp = Path(experiment)
        if not exp.is_file():
            cand = configs_dir() / stage / (exp.name if exp.suffix else exp.name + ".yaml")
            exp = cand if cand.is_file() else exp
        chain += _resolve_experiment(exp)
    chain += [("settings", layer if isinstance(layer, DictConfig) else OmegaConf.create(dict(layer)))
              for layer in layers]
    for path, part in chain:
        _check_keys(schema, part, str(path))
        cfg, schema = _merge(cfg, part, str(path)), _merge(schema, part, str(path))
    OmegaConf.set_struct(cfg, True)
    for key in embeds:  # an embedded section holds only the keys it sets: overrides may add any other
        OmegaConf.set_struct(OmegaConf.select(cfg, key), False)
    all_keys = _dotted_keys(schema)
    for key, value in parse_overrides(overrides):
        if key not in all_keys:
            raise _unknown(key, all_keys, "command line")
        node = OmegaConf.select(schema, key)
        if isinstance(value, dict) and isinstance(node, DictConfig):
            if len(node):
                _check_keys(node, OmegaConf.create(value), "command line", key + ".", all_keys)
            elif isinstance(OmegaConf.select(cfg, key), DictConfig):  # a default of {} is a free-form mapping
                OmegaConf.set_struct(OmegaConf.select(cfg, key), False)  # (e.g. loss keyword arguments)
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as e:
            raise ConfigError(f"command line: cannot set '{key}' to {value!r} ({str(e).splitlines()[0]})") from None
    check_config(cfg, defaults, default_path, skip=set(embeds))
    for key, other in embeds.items():
        section = OmegaConf.select(cfg, key)
        other_path = configs_dir() / other / "default.yaml"
        check_config(section, _read_yaml(other_path), other_path, prefix=key + ".")
        OmegaConf.set_struct(section, None)  # struct again, as the rest of the tree
    return cfg


def _merge(cfg: DictConfig, part: DictConfig, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, part)
    except OmegaConfBaseException as e:
        raise ConfigError(f"{source}: {str(e).splitlines()[0]}") from None


def check_config(cfg: DictConfig, defaults: DictConfig, default_path: Path, skip: set[str] = frozenset(),
                 prefix: str = "") -> None:
    """Check (and normalise in place) every value against the type and range its comment in
    ``default_path`` states; the first bad one raises a ConfigError naming the key.

    ``skip``: dotted sections left out (embedded stages, checked on their own). ``prefix``: ``cfg``
    is an embedded section at this key, holding only some of the keys of ``defaults``.
    """
    comments = read_comments(default_path)
    values = OmegaConf.to_container(cfg, resolve=False)
    plain_defaults = OmegaConf.to_container(defaults, resolve=False)
    fixes: list[tuple[str, object]] = []

    def walk(node: dict, dnode: dict, path: str) -> None:
        for k, default in dnode.items():
            key, value = path + k, node.get(k)
            if key in skip or (prefix and k not in node):
                continue
            comment = comments.get(key, "")
            if isinstance(default, dict) and (bool(default) or parse_spec(comment) is None):  # a section
                if not isinstance(value, dict):
                    raise ConfigError(f"config key '{prefix}{key}' is a section (a mapping of keys), got {value!r}")
                walk(value, default, key + ".")
                continue
            try:
                new = check_value(key, value, default, parse_spec(comment))
            except ValueError as e:
                where = f"configs/{default_path.parent.name}/default.yaml"
                hint = f" ({where}: '{comment[:70]}')" if comment else ""
                raise ConfigError(f"config key '{prefix}{key}': {e}{hint}") from None
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
