"""Whether a position tower is built for some data: the ``when`` key of its config.

``always`` builds it (and the model refuses data without a position column, or with the position
as a feature); ``position_known`` (``position_bias=auto``, the default) builds it only where the
data maps a display position that is not a feature.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TOWER_WHEN", "position_obstacle", "resolve_tower"]

#: the values of a tower config's ``when`` key
TOWER_WHEN = ("always", "position_known")


def position_obstacle(schema: Any) -> str | None:
    """Why a tower cannot train on data with this schema, or None: no position column mapped, or
    the position column also a numeric feature (the scorer would learn the effect the tower is
    for).

    Args:
        schema: a :class:`~hybridrank.data.schema.Schema` or its dict form.

    Returns:
        The reason in plain words, or None when the tower can train.

    >>> position_obstacle({"columns": {"position": "pos"}, "numeric": ["x", "pos"]})
    "the position column 'pos' is also a numeric feature"
    >>> position_obstacle({"columns": {"position": "pos"}, "numeric": ["x"]}) is None
    True
    """
    if hasattr(schema, "to_dict"):
        schema = schema.to_dict()
    pos = (schema.get("columns") or {}).get("position")
    if pos is None:
        return "a position-bias tower needs the display position: no position column is mapped"
    if pos in (schema.get("numeric") or ()):
        return f"the position column {pos!r} is also a numeric feature"
    return None


def resolve_tower(node: Any, schema: Any) -> tuple[Any, str | None]:
    """Decide whether a tower config is built: ``(node without its when key or None, why not)``.

    With ``when: position_known`` the tower stands aside (None, and the reason from
    :func:`position_obstacle`) where the data cannot give it a position; with ``always`` (or no
    ``when``) it is built and the model refuses such data. Without a schema (a model built from
    Python objects, no data given) the tower is built, as with ``always``.

    Args:
        node: a tower config mapping (``_target_`` ... with an optional ``when``), or anything
            else (None, a built module), which passes through.
        schema: the data schema (or its dict form) or None.

    Returns:
        ``(config to build or None, the reason it is not built or None)``.

    >>> cfg = {"_target_": "hybridrank.models.position.PositionBias", "when": "position_known"}
    >>> resolve_tower(cfg, {"columns": {"position": "pos"}, "numeric": ["x", "pos"]})[1]
    "the position column 'pos' is also a numeric feature"
    >>> resolve_tower(cfg, {"columns": {"position": "pos"}, "numeric": ["x"]})[0]
    {'_target_': 'hybridrank.models.position.PositionBias'}
    """
    if not isinstance(node, Mapping) or "when" not in node:
        return node, None
    when = node["when"]
    if when not in TOWER_WHEN:
        raise ValueError(f"position_bias.when must be one of {list(TOWER_WHEN)}, got {when!r}")
    rest = {k: v for k, v in node.items() if k != "when"}
    obstacle = position_obstacle(schema) if when == "position_known" and schema is not None else None
    return (None, obstacle) if obstacle else (rest, None)
