"""What the lab's error records share: the model's error on a cause's size
(reports/model/model_error.py) and the layer split's error on its gain
(reports/model/observed/split_error.py) are both the central band of the lab's measured misses,
kept as a small JSON record that is checked on read."""
from __future__ import annotations

import json
from pathlib import Path

from reports.base.errors import CliError


def central(values: list[float], level: float) -> tuple[float, float, float]:
    """(low end, median, high end) of the central `level` of `values`, linear between order
    statistics (numpy's percentile)."""
    import numpy as np
    a = 100 * (1 - level) / 2
    lo, med, hi = np.percentile(values, [a, 50, 100 - a])
    return float(lo), float(med), float(hi)


def read_checked(path: Path, from_dict):
    """`from_dict` of the JSON at `path`; a one-line CliError naming the file where it cannot be
    read or is not the record (`from_dict` raises ValueError, KeyError or TypeError)."""
    try:
        return from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CliError(f"{path.name}: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                       ) from None
