"""A small Dockerfile reader: instructions per build stage, enough to check the recipe
without a container engine (none can build here)."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse(path: Path) -> list[Stage]:
    """The build stages of the Dockerfile at ``path``, in order."""
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
            stages.append(Stage(base=words[0], name=name))
        elif instruction.keyword == "ARG" and not stages:
            continue
        else:
            assert stages, f"line {start}: {keyword} before FROM"
            stages[-1].instructions.append(instruction)
    assert not pending, "the Dockerfile ends in a line continuation"
    return stages
