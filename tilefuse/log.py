"""Log topics through Python :mod:`logging`, under the ``tilefuse`` logger namespace.

``TILEFUSE_LOG=guards,recompiles,passes`` (or ``all``) turns those topics on at DEBUG level with
one stderr handler; :func:`configure_from_env` does that and may be called any number of times.
Code logs through ``get_logger("passes").debug(...)``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

from tilefuse.errors import TilefuseError

ROOT = "tilefuse"
ENV_VAR = "TILEFUSE_LOG"
TOPICS: tuple[str, ...] = ("guards", "recompiles", "passes", "fusion", "cache", "tune",
                           "fallback", "graph_breaks", "distributed")


class _EnvHandler(logging.StreamHandler):
    """The stderr handler :func:`configure_from_env` installs (its class marks it as ours)."""


def get_logger(topic: str) -> logging.Logger:
    """The logger of one topic, ``tilefuse.<topic>``; TilefuseError for an unknown topic."""
    if topic not in TOPICS:
        raise TilefuseError(f"unknown log topic {topic!r} (known: {', '.join(TOPICS)})")
    return logging.getLogger(f"{ROOT}.{topic}")


def parse_topics(spec: str) -> tuple[frozenset[str], list[str]]:
    """The known topics named in a TILEFUSE_LOG value, and the unknown names in it."""
    names = [n.strip().lower() for n in spec.split(",") if n.strip()]
    if "all" in names:
        return frozenset(TOPICS), [n for n in names if n != "all" and n not in TOPICS]
    return frozenset(n for n in names if n in TOPICS), [n for n in names if n not in TOPICS]


def configure_from_env(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """Enables the topics named in ``env["TILEFUSE_LOG"]`` (default: the process environment)
    at DEBUG level and makes sure exactly one stderr handler serves them. Unknown names produce
    one warning. Returns the enabled topics."""
    env = os.environ if env is None else env
    enabled, unknown = parse_topics(env.get(ENV_VAR, ""))
    root = logging.getLogger(ROOT)
    if unknown:
        root.warning("%s names unknown log topics %s (known: %s, or all)", ENV_VAR,
                     ", ".join(unknown), ", ".join(TOPICS))
    if not enabled:
        return enabled
    if not any(isinstance(h, _EnvHandler) for h in root.handlers):
        handler = _EnvHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        handler.setLevel(logging.DEBUG)
        root.addHandler(handler)
    for topic in enabled:
        get_logger(topic).setLevel(logging.DEBUG)
    return enabled
