"""Types and ranges of config values, read from the comments of ``configs/<stage>/default.yaml``.

Every key of a stage's defaults states its type in its comment, in one of these forms::

    steps: 150          # int: optimizer steps
    depth: null         # (int|null) blocks
    global_scale: [..]  # [float, float]
    ks: [1, 5, 8]       # list[int]: crops per query
    temperature: 0.05   # float > 0: ...
    engine: torch       # torch (DDP under torchrun) | deepspeed (ZeRO-3, CPU offload)
    format: beir        # str: beir | tevatron | dpr

A key whose comment states no type takes the kind of its default (a section stays a mapping, a
list stays a list, a number stays a number). Ranges come from the comment (``> 0``), else from the
key: sizes, steps, batch sizes, dimensions, temperatures and learning rates must be > 0 (0 only
where the comment gives 0 a meaning, e.g. ``0 = off``); shares, probabilities and momenta lie in
[0, 1]; no number may be negative unless its default is. Values are normalised on the way (an
``int`` given to a float key becomes a float, a number given to a str key its text).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_TYPES = {"int", "float", "str", "bool", "null", "dict", "list"}
_TOKEN = r"[A-Za-z0-9_.+\-]+(?::N)?"
_ALT = re.compile(rf"^\s*({_TOKEN})\s*(\([^)]*\))?\s*(:.*)?$")
_TYPE_UNION = r"(?:list\[\w+\]|\w+)(?:\s*\|\s*(?:list\[\w+\]|\w+))*"
_TYPE_PREFIX = re.compile(rf"^({_TYPE_UNION})\s*(?:(>=|>|<=|<)\s*(-?[\d.]+))?\s*(?=$|:|\()(.*)$")
_TUPLE_PREFIX = re.compile(r"^\[\s*(\w+(?:\s*,\s*\w+)+)\s*\]\s*:?(.*)$")
_POSITIVE = re.compile(r"^(steps|epochs|batch|nbs|imgsz|k|ks|lr|lr0|eps|depth|num_heads|n_global|n_gallery|"
                       r"sinkhorn_iters|dino_layers|candidates|run_depth|dpi|width|height|size|accumulation|"
                       r"stop_after|adapter_channels|.*_size|.*_dim|.*_every|.*_temp|.*temperature|"
                       r".*_pages|pages_per_.*|max_.*|.*_max_length|.*_width|.*_height|.*_iters)$")
_NOT_POSITIVE = re.compile(r"^(min_.*|warmup_.*|predict_pages)$")
_UNIT = re.compile(r"^(.*prob|.*fraction|.*momentum.*|.*_ratio|ratio|global_scale|local_scale|betas|drop_path_rate)$")
_UNIT_WORDS = re.compile(r"\b(share of|probability|fraction)\b")
_ZERO_MEANS = re.compile(r"(^|[^\w.>])0\s*(=|:)|\b0 (is|means)\b")
_ORDERED_PAIR = re.compile(r"^(.*_scale|mask_ratio)$")


@dataclass
class Spec:
    """What one key accepts: a type union, an enumeration, a tuple of types, plus a range."""
    types: set[str] = field(default_factory=set)   # {"int", "null", ...}; empty = unchecked
    choices: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # tuple element types ("[float, float]")
    element: str | None = None                      # list element type ("list[int]")
    bound: tuple[str, float] | None = None          # (">", 0.0) from the comment
    comment: str = ""


def _split_alternatives(text: str) -> list[str]:
    """``a | b (x | y) | c`` -> ``["a", "b (x | y)", "c"]``: ``|`` outside brackets only."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}" and depth > 0
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _enumeration(text: str) -> list[str] | None:
    alts = _split_alternatives(text)
    if len(alts) < 2:
        return None
    tokens = [m.group(1) if (m := _ALT.match(a)) else None for a in alts]
    return None if None in tokens else tokens


def _from_union(tokens: list[str], spec: Spec) -> Spec:
    for tok in tokens:
        m = re.fullmatch(r"list\[(\w+)\]", tok)
        if m:
            spec.types.add("list")
            spec.element = m.group(1)
        else:
            spec.types.add(tok)
    return spec


def parse_spec(comment: str) -> Spec | None:
    """The :class:`Spec` a default's comment states, or None when it states no type."""
    c = comment.strip()
    spec = Spec(comment=c)
    m = re.match(r"^\(([^()]*)\)\s*(.*)$", c)
    if m and (toks := [t.strip() for t in m.group(1).split("|")]) and all(re.fullmatch(_TOKEN, t) for t in toks):
        if all(t in _TYPES for t in toks):
            _from_union(toks, spec)
            if toks == ["str"] and (enum := _enumeration(m.group(2))):
                spec.choices = enum
            return spec
        spec.choices = toks
        return spec
    m = _TUPLE_PREFIX.match(c)
    if m:
        spec.types, spec.items = {"tuple"}, [t.strip() for t in m.group(1).split(",")]
        return spec
    m = _TYPE_PREFIX.match(c)
    if m:
        toks = [t.strip() for t in m.group(1).split("|")]
        if all(t in _TYPES or re.fullmatch(r"list\[\w+\]", t) for t in toks):
            _from_union(toks, spec)
            if m.group(2):
                spec.bound = (m.group(2), float(m.group(3)))
            rest = m.group(4).lstrip(":").strip()
            if spec.types == {"str"} and (enum := _enumeration(rest)):
                spec.choices = enum
            return spec
    enum = _enumeration(c)
    if enum is None:
        return None
    if all(t in _TYPES for t in enum):
        return _from_union(enum, spec)
    spec.choices = enum
    return spec


def _comment_of(rest: str) -> str:
    """The text after the first ``#`` outside quotes (a ``#`` inside a quoted value is no comment)."""
    quote = None
    for i, ch in enumerate(rest):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return rest[i + 1:].strip()
    return ""


def read_comments(default_yaml: Path) -> dict[str, str]:
    """Dotted key -> its comment, for every ``key: value  # comment`` line of a defaults file."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in Path(default_yaml).read_text().splitlines():
        m = re.match(r"^(\s*)([A-Za-z_][\w]*)\s*:(.*)$", line)
        if not m:
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        out[dotted] = _comment_of(rest)
    return out


# ---- checking ------------------------------------------------------------------------------------
def _kind(value) -> str:
    if value is None:
        return "null"
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("str", str), ("dict", dict),
                        ("list", (list, tuple))):
        if isinstance(value, types):
            return kind
    return type(value).__name__


def _inferred(default) -> Spec:
    """The spec of a key whose comment states no type: the kind of its default (null: anything)."""
    kind = _kind(default)
    return Spec(types=set() if kind == "null" else {kind})


def _as_type(value, types: set[str]):
    """``(True, normalised value)`` when ``value`` is one of ``types`` (int -> float, integral float ->
    int and number -> text are accepted), else ``(False, value)``."""
    kind = _kind(value)
    if kind in types or not types:
        return True, value
    if kind == "int" and "float" in types:
        return True, float(value)
    if kind == "float" and "int" in types and value.is_integer():
        return True, int(value)
    if kind in ("int", "float") and "str" in types:
        return True, str(value)
    return False, value


def _range(leaf: str, spec: Spec, default) -> tuple[float, bool, float, bool] | None:
    """``(low, low_open, high, high_open)`` allowed for a number (or each element), or None."""
    if spec.bound is not None:
        op, x = spec.bound
        inf = float("inf")
        return {">": (x, True, inf, False), ">=": (x, False, inf, False),
                "<": (-inf, False, x, True), "<=": (-inf, False, x, False)}[op]
    defaults = default if isinstance(default, (list, tuple)) else [default]
    if any(isinstance(d, (int, float)) and not isinstance(d, bool) and d < 0 for d in defaults):
        return None  # a negative default (save_period: -1) has its own meaning
    if _UNIT.match(leaf) or _UNIT_WORDS.search(spec.comment):
        return (0.0, False, 1.0, leaf == "betas")
    if _POSITIVE.match(leaf) and not _NOT_POSITIVE.match(leaf) and not _ZERO_MEANS.search(spec.comment):
        return (0.0, True, float("inf"), False)
    return (0.0, False, float("inf"), False)


def _range_text(r: tuple[float, bool, float, bool]) -> str:
    lo, lo_open, hi, hi_open = r
    if hi == float("inf"):
        return f"{'>' if lo_open else '>='} {lo:g}"
    if lo == float("-inf"):
        return f"{'<' if hi_open else '<='} {hi:g}"
    return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"


def _in_range(x, r) -> bool:
    lo, lo_open, hi, hi_open = r
    return (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)


def _matches_choice(value: str, choices: list[str]) -> bool:
    return any(value == c or (c.endswith(":N") and re.fullmatch(re.escape(c[:-2]) + r":\d+", value))
               for c in choices)


def check_value(key: str, value, default, spec: Spec | None):
    """The normalised value of ``key``; raises ``ValueError`` with a one-line reason when it is bad."""
    spec = spec or _inferred(default)
    if value is None:
        if "null" in spec.types or default is None or not (spec.types or spec.choices):
            return None
        raise ValueError("must not be null")
    if spec.choices:
        if isinstance(value, bool) and str(value).lower() in spec.choices:
            return value  # `auto | true | false`: the booleans stay booleans
        ok, text = _as_type(value, {"str"})
        if not ok or not _matches_choice(text, spec.choices):
            raise ValueError(f"{value!r} is not one of {' | '.join(spec.choices)}")
        return text
    if not spec.types:  # a null default with no stated type: anything goes
        return value
    if "tuple" in spec.types:
        if not isinstance(value, (list, tuple)) or len(value) != len(spec.items):
            raise ValueError(f"{value!r} is not a list of {len(spec.items)} values [{', '.join(spec.items)}]")
        items = [_element(key, v, {t}, default, spec) for v, t in zip(value, spec.items)]
        if _ORDERED_PAIR.match(key.rsplit(".", 1)[-1]) and len(items) == 2 and items[0] > items[1]:
            raise ValueError(f"{value!r}: the first value must not exceed the second")
        return items
    ok, out = _as_type(value, spec.types - {"null"})
    if not ok:
        want = " or ".join(sorted(spec.types))
        raise ValueError(f"{value!r} is not of type {want}" + (" (empty value)" if value == "" else ""))
    if isinstance(out, list) and spec.element:
        return [_element(key, v, {spec.element}, default, spec) for v in out]
    if _kind(out) in ("int", "float"):
        _check_range(key, out, spec, default)
    return out


def _element(key: str, value, types: set[str], default, spec: Spec):
    ok, out = _as_type(value, types)
    if not ok:
        raise ValueError(f"element {value!r} is not of type {' or '.join(sorted(types))}")
    if _kind(out) in ("int", "float"):
        _check_range(key, out, spec, default)
    return out


def _check_range(key: str, x, spec: Spec, default) -> None:
    r = _range(key.rsplit(".", 1)[-1], spec, default)
    if x != x:  # NaN
        raise ValueError("must be a number, got nan")
    if r is not None and not _in_range(x, r):
        raise ValueError(f"{x!r} is out of range (must be {_range_text(r)})")
