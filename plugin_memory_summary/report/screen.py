"""What ``replay`` and ``demo`` show while they run: progress and one line per compression."""

from __future__ import annotations

import sys
from typing import Any

import click

__all__ = ["Screen"]


class Screen:
    """Progress and one line per compression on a terminal (rich); plain lines otherwise;
    nothing but the final JSON with ``--json``."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console

        self.quiet = quiet
        self.console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Screen:
        if not self.quiet and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("turns"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            click.echo(text)

    def start(self, run: str, turns: int) -> None:
        if self.progress is not None:
            label = "with the plugin" if run == "with" else "without it (baseline)"
            self.tasks[run] = self.progress.add_task(label, total=turns)

    def turn(self, run: str, done: int) -> None:
        if self.progress is not None and run in self.tasks:
            self.progress.update(self.tasks[run], completed=done)
