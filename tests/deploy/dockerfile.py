"""A small Dockerfile reader: instructions per build stage, enough to check the recipe
without a container engine (none can build here).

``parse`` expands build arguments the way ``docker build --build-arg`` does where the checks
need them: in ``FROM`` (the global ``ARG`` defaults, overridden by ``build_args``) and, through
``Stage.expand``, in a stage's own instructions (its ``ARG`` declarations). ``needs`` follows a
target to the stages it is built from (its base, ``COPY --from``, ``RUN --mount=from=``), the
ones BuildKit builds for ``--target``. ``commands`` reads the programs a ``RUN`` invokes.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_SHELL_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}


def expand(text: str, values: Mapping[str, str]) -> str:
    """``${NAME}`` and ``$NAME`` replaced from ``values`` (empty when not set, as Docker
    does); the ``${NAME:-word}`` forms are not used by the recipe and refused."""

    def one(match: re.Match[str]) -> str:
        name = match[1] or match[3]
        assert not match[2], f"unsupported substitution {match[0]!r}"
        return values.get(name, "")

    return _VARIABLE.sub(one, text)


@dataclass(frozen=True)
class Instruction:
    keyword: str
    """Upper-case, e.g. ``COPY``."""
    arguments: str
    """Everything after the keyword, continuation lines joined."""
    line: int

    def exec_form(self) -> list[str] | None:
        """The JSON array form (``["a", "b"]``) of the arguments, if they use it."""
        text = self.arguments.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        assert isinstance(value, list), f"line {self.line}: not a JSON array"
        return [str(item) for item in value]

    def words(self) -> list[str]:
        return shlex.split(self.arguments)

    def flags(self) -> list[str]:
        """The leading ``--name=value`` flags (``RUN --mount=…``, ``COPY --from=…``)."""
        out = []
        for word in self.arguments.split():
            if not word.startswith("--"):
                break
            out.append(word)
        return out

    def mounts(self) -> list[dict[str, str]]:
        """Each ``--mount=k=v,…`` flag as a mapping."""
        return [dict(part.split("=", 1) for part in flag[len("--mount="):].split(","))
                for flag in self.flags() if flag.startswith("--mount=")]

    def shell(self) -> str:
        """A shell-form ``RUN``'s command, without its flags."""
        assert self.exec_form() is None, f"line {self.line}: exec form"
        text = self.arguments
        for flag in self.flags():
            text = text.split(flag, 1)[1]
        return text.strip()


@dataclass
class Stage:
    base: str
    """The image or stage it starts from, build arguments expanded."""
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)
    base_text: str = ""
    """``FROM``'s image as written (``${BASE_IMAGE}``)."""
    args: dict[str, str] = field(default_factory=dict)
    """The build arguments in scope in this stage (its ``ARG``s), with their values."""

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    def expand(self, text: str) -> str:
        """``text`` with this stage's build arguments substituted."""
        return expand(text, self.args)


def _declare(words: list[str], into: dict[str, str], scope: Mapping[str, str],
             build_args: Mapping[str, str], outer: Mapping[str, str]) -> None:
    for word in words:
        name, has_default, default = word.partition("=")
        if name in build_args:
            into[name] = build_args[name]
        elif has_default:
            into[name] = expand(default, scope)
        elif name in outer:
            into[name] = outer[name]


def parse(path: Path, build_args: Mapping[str, str] | None = None) -> list[Stage]:
    """The build stages of the Dockerfile at ``path``, in order, as ``docker build`` with
    ``--build-arg`` ``build_args`` would see them."""
    given = dict(build_args or {})
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.rstrip()
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        keyword, _, arguments = text.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip(), start)
        if instruction.keyword == "FROM":
            words = instruction.words()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=expand(words[0], global_args), name=name,
                                base_text=words[0]))
        elif instruction.keyword == "ARG" and not stages:
            _declare(instruction.words(), global_args, global_args, given, {})
        else:
            assert stages, f"line {start}: {keyword} before FROM"
            stage = stages[-1]
            if instruction.keyword == "ARG":
                _declare(instruction.words(), stage.args, stage.args, given, global_args)
            stage.instructions.append(instruction)
    assert not pending, "the Dockerfile ends in a line continuation"
    return stages


def stage(stages: list[Stage], name: str) -> Stage:
    """The stage called ``name``."""
    found = [s for s in stages if s.name == name]
    assert len(found) == 1, f"{len(found)} stages named {name!r}"
    return found[0]


def needs(stages: list[Stage], target: Stage) -> list[Stage]:
    """``target`` and every stage it is built from, in the file's order."""
    by_name = {s.name: s for s in stages if s.name}
    wanted: set[int] = set()
    todo = [target]
    while todo:
        current = todo.pop()
        if id(current) in wanted:
            continue
        wanted.add(id(current))
        sources = [current.base]
        for instruction in current.instructions:
            sources += [flag.split("=", 1)[1] for flag in instruction.flags()
                        if flag.startswith("--from=")]
            sources += [m["from"] for m in instruction.mounts() if "from" in m]
        todo += [by_name[s] for s in sources if s in by_name]
    return [s for s in stages if id(s) in wanted]


def commands(script: str) -> list[list[str]]:
    """The simple commands of a shell command line, each as its words without the leading
    ``NAME=value`` assignments: ``a=1 sh x && python3 -m pip y`` → ``[sh, x]``,
    ``[python3, -m, pip, y]``. Enough for the recipe's ``RUN`` lines, not a shell parser."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    for token in lexer:
        if token in _SHELL_OPERATORS:
            out.append([])
        elif out[-1] or not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", token):
            out[-1].append(token)
    return [c for c in out if c]
