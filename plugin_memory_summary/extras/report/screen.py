"""What ``replay`` and ``demo`` show while they run: progress and one line per compression."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

__all__ = ["Screen"]


#: Settings with which rich takes any output for a terminal (or for none).
TERMINAL_SETTINGS = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def may_be_terminal() -> bool:
    """Whether rich might take stdout for a terminal: a tty, or a setting that overrides that.
    Otherwise rich is not imported at all (a piped ``replay`` or ``demo`` starts faster)."""
    isatty = getattr(sys.stdout, "isatty", None)
    try:
        tty = bool(isatty()) if isatty is not None else False
    except ValueError:
        tty = False
    return tty or any(name in os.environ for name in TERMINAL_SETTINGS)


class Screen:
    """Progress and one line per compression on a terminal (rich); plain lines otherwise;
    nothing but the final JSON with ``--json``."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> Screen:
        if self.quiet or not may_be_terminal():
            return self
        from rich.console import Console

        console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        if console.is_terminal:
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
                console=console,
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
