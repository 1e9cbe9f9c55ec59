"""The end of a probe command (`ppscope graphs`, `stage-cost`, `dispatch`, `topology`): where
the probe cannot measure here, a waived record (beside a good one, never over it) and one line
on stderr with exit status 2 (a `CliError`); otherwise the run under a progress bar and an exit
status from the record (0, or 1 for an `error` record)."""
from __future__ import annotations

from reports.base.errors import CliError


def save_waived(probe: str, reason: str, argv, dest) -> str:
    """Save a waived record of `probe` to `dest` (beside a good record, never over it); returns
    "waived record: PATH", with the save's note when it went beside one."""
    from reports.base.records import save_record, waived

    path, note = save_record(waived(probe, reason, argv=argv), dest)
    return f"waived record: {path}" + (f"; {note}" if note else "")


def run_measured(probe, cfg, plan: bool, plan_gives: str, total: int, desc: str, unit: str):
    """`probe.run(cfg)` for a command with a `--plan` mode: where `probe.available()` says it
    cannot measure here, the run writes its waived record and this raises the one-line
    `CliError` (exit 2); else it runs under a tqdm bar of `total` points (no bar for a plan).
    Returns the run's (record, note)."""
    if not plan and (reason := probe.available()):
        _, note = probe.run(cfg)
        raise CliError(f"measuring needs a GPU ({reason}); nothing measured ("
                       + (note or f"waived record: {cfg.out}") + f"); use --plan for "
                       f"{plan_gives}")
    bar = None
    if not plan:
        from tqdm import tqdm
        bar = tqdm(total=total, desc=desc, unit=unit, leave=False)
    try:
        return probe.run(cfg, progress=bar)
    finally:
        if bar:
            bar.close()


def exit_status(record) -> int:
    """0 for a record that is not an `error` (ok, partial, a plan), 1 for an error."""
    return 0 if record.status != "error" else 1
