"""Write a probe's record as the run goes, under the one status rule (`reports.base.records`).

A sweep saves a `partial` record after every finished point, so Ctrl-C or a crash keeps what was
measured; its last save is `ok` or `error`. `save_record` decides where each save goes: only
`ok` replaces a good (`ok`/`partial`) record, anything else goes beside it as NAME.STATUS.json.
What `save_record` cannot know is that the good record it finds may be this run's own interim
`partial`: a final `error` would then land beside it and leave the interim one in charge.
`RunWriter` remembers where its own last save went and supersedes it: in place when that is
the record path itself (nothing older was there to protect), else by removing it once the new
record is written.

`ToolWriter` is the same for a side tool (a tuner, the SGLang anchor): a result dict of its own
shape as the record's `data` (no payload class), `waive` when it cannot run here.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

from reports.base.records import Record, Status, make_record, save_record, waived, write_json_atomic


class RunWriter:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._last: Path | None = None   # where this run's previous save went

    def save(self, rec: Record, plan: bool = False) -> tuple[Path, str | None]:
        """Write `rec` (`plan`: it measured nothing); returns where it went and `save_record`'s
        note (kept an older record)."""
        if self._last == self.path and rec.status != "ok":
            write_json_atomic(self.path, rec)   # our own interim record: superseded in place
            return self.path, None
        dest, note = save_record(rec, self.path, plan=plan)
        if self._last is not None and self._last != dest and self._last.exists():
            self._last.unlink()                 # our own interim record beside a good one
        self._last = dest
        return dest, note


class ToolWriter(RunWriter):
    """The record of a side tool, written as it goes: `probe` names the tool, `argv` its command
    line (the record's provenance)."""

    def __init__(self, path: str | os.PathLike, probe: str, argv: list[str]):
        super().__init__(path)
        self.probe, self.argv = probe, list(argv)

    def record(self, res: dict[str, Any], status: Status = "ok",
               reason: str | None = None) -> tuple[Path, str | None]:
        """Save the result dict so far as a record of `status`; values JSON cannot hold (a
        torch dtype, a config object) are written as their text, as the tools always did."""
        data = json.loads(json.dumps(res, default=str))
        return self.save(make_record(self.probe, data, status=status, reason=reason,
                                     argv=self.argv))

    def run(self, body: Callable[[dict[str, Any]], int]) -> int:
        """`body(res)` fills the result dict `res`, saving it as it goes, and returns the exit
        status; when it fails, an `error` record keeps what `res` holds and one line on stderr
        says why (exit status 1)."""
        res: dict[str, Any] = {}
        try:
            return body(res)
        except Exception as e:  # noqa: BLE001 - what was measured stays, with the reason
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
            dest, _ = self.record(res, "error", why)
            print(f"{self.probe}: {why}; error record: {dest}", file=sys.stderr)
            return 1

    def waive(self, why: str) -> int:
        """Cannot run here: a waived record (beside a good one, never over it), the reason in one
        line on stderr; returns exit status 2."""
        dest, _ = self.save(waived(self.probe, why, argv=self.argv))
        print(f"{self.probe}: {why}; nothing timed (waived record: {dest})", file=sys.stderr)
        return 2
