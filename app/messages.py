"""Error messages that fit the page: one short line, and a long list of problems in an expander.

A checkpoint whose config does not match its weights can have hundreds of problems (every tensor
missing or unexpected); `CheckpointError.problems` lists them all. The line names each kind of
problem with its count and first few tensors; the whole list is one click away.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import streamlit as st

SHOWN = 3  # names per kind of problem in the summary line
LONG = 300  # characters: a longer message without a problem list is cut, the whole text in an expander

# (kind shown in the summary, pattern whose group 1 is the name)
_KINDS = [("missing", re.compile(r"^missing tensor (\S+)")),
          ("unexpected", re.compile(r"^unexpected tensor (\S+)")),
          ("wrong shape", re.compile(r"^tensor (\S+) has shape")),
          ("wrong dtype", re.compile(r"^tensor (\S+) is stored as"))]


def _kind(problem: str) -> tuple[str, str]:
    for kind, pattern in _KINDS:
        if m := pattern.match(problem):
            return kind, m[1]
    return "other", problem


def problem_summary(message: str, problems: Sequence[str]) -> str:
    """The message's lead (up to its first listed problem), then per kind: the count and the first
    `SHOWN` names, e.g. "w.safetensors does not match its config: 58 missing (a, b, c, ...)"."""
    lead = message[:message.index(problems[0])].rstrip() if problems and problems[0] in message else message
    groups: dict[str, list[str]] = {}
    for p in problems:
        kind, name = _kind(p)
        groups.setdefault(kind, []).append(name)
    parts = [f"{len(names)} {kind} ({', '.join(names[:SHOWN])}{', ...' if len(names) > SHOWN else ''})"
             for kind, names in groups.items()]
    return f"{lead} {'; '.join(parts)}"


def without_dir(text: str, directory: str | os.PathLike, whole: str = "the checkpoint") -> str:
    """`text` with the server path of `directory` taken out: files in it by their own names, the
    directory itself as `whole`. A user knows the files they picked, not where the server keeps them."""
    d = Path(directory)
    for r in sorted({str(d), str(d.resolve())}, key=len, reverse=True):
        text = text.replace(r + os.sep, "").replace(r, whole)
    return text


def show_error(e: Exception, lead: str = "", *, hide: str | os.PathLike | None = None) -> None:
    """`lead` + the message in an error box; a message listing more than `SHOWN` problems (or longer
    than `LONG`) is summarised, with every problem (or the whole text) in an expander below it.
    `hide`: a server directory whose path is taken out of the text (`without_dir`)."""
    clean = (lambda t: without_dir(t, hide)) if hide is not None else (lambda t: t)
    message = clean(str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}")
    problems = [clean(p) for p in getattr(e, "problems", None) or []]
    if len(problems) > SHOWN:
        st.error(lead + problem_summary(message, problems))
        details = "\n".join(problems)
    elif len(message) > LONG:
        st.error(f"{lead}{message[:LONG].rstrip()} ...")
        details = message
    else:
        st.error(lead + message)
        return
    with st.expander(f"All {len(problems)} problems" if problems else "The whole message"):
        st.code(details, language=None, wrap_lines=True)
