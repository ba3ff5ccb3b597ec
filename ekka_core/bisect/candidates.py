"""What ``ekka bisect`` bisects: an ordered list of engine releases to build (``--releases``) or of interpreters the
user already has (``--env [LABEL=]PATH``), checked before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ekka_core.contracts.errors import BadInput


@dataclass
class Candidate:
    """One point of the ordered list: a release to build (``release``) or an interpreter (``python``)."""
    label: str
    release: str | None = None
    python: str | None = None


def parse_env_arg(text: str) -> Candidate:
    """``--env [LABEL=]PATH``: the label defaults to the engine version installed there."""
    label, sep, path = text.partition("=")
    if not sep:
        label, path = "", text
    return Candidate(label=label.strip(), python=os.path.abspath(path.strip()))


def candidates_from(releases: list[str] | None, envs: list[str] | None) -> list[Candidate]:
    from ekka_core.bisect.envs import check_release

    if releases and envs:
        raise BadInput("--releases and --env both given", fix="bisect either releases Ekka builds (--releases) or "
                                                               "environments you have (--env, repeated)")
    if releases:
        out = [Candidate(label=r, release=r) for r in (check_release(x) for x in releases)]
    elif envs:
        out = [parse_env_arg(e) for e in envs]
    else:
        raise BadInput("no releases to bisect", fix="pass --releases 0.11.2,0.12.0,… or --env PATH (repeated)")
    if len(out) < 2:
        raise BadInput("bisecting needs at least two releases", fix="list an older (good) and a newer (bad) release")
    return out
