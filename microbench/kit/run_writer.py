"""Write a probe's record as the run goes, under the one status rule (`reports.base.records`).

A sweep saves a `partial` record after every finished point, so Ctrl-C or a crash keeps what was
measured; its last save is `ok` or `error`. `save_record` decides where each save goes: only
`ok` replaces a good (`ok`/`partial`) record, anything else goes beside it as NAME.STATUS.json.
What `save_record` cannot know is that the good record it finds may be this run's own interim
`partial`: a final `error` would then land beside it and leave the interim one in charge.
`RunWriter` remembers where its own last save went and supersedes it: in place when that is
the record path itself (nothing older was there to protect), else by removing it once the new
record is written.
"""
from __future__ import annotations

import os
from pathlib import Path

from reports.base.records import Record, save_record, write_json_atomic


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
