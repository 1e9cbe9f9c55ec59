"""Loaded at start-up by every Python process of a lab server: the lab puts this folder first on
the server's `PYTHONPATH` (never in an installation's site-packages, so an SGLang you installed is
driven as it is and nothing of it is touched). Four jobs:

1. `PPSCOPE_LAB_FAULT` or `PPSCOPE_LAB_FAULT_FILE` set: install the fault module
   (`ppscope_lab_faults.py`, beside this file) into this process. Unset: nothing happens.
2. `PPSCOPE_TWIN_COSTS` set: install the twin's emulated device time (`ppscope_twin_hold.py`).
3. `PPSCOPE_LAB_RANK_CORES` set: pin each scheduler process to its rank's core
   (`ppscope_lab_pin.py`).
4. Python imports one `sitecustomize`; this one shadows the environment's own. That one, if any,
   is found on the rest of `sys.path` and run too, so the environment behaves as it did.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def _faults() -> None:
    if os.environ.get("PPSCOPE_LAB_FAULT") or os.environ.get("PPSCOPE_LAB_FAULT_FILE"):
        import ppscope_lab_faults
        ppscope_lab_faults.install()


def _twin() -> None:
    if os.environ.get("PPSCOPE_TWIN_COSTS"):
        import ppscope_twin_hold
        ppscope_twin_hold.install()


def _pin() -> None:
    if os.environ.get("PPSCOPE_LAB_RANK_CORES"):
        import ppscope_lab_pin
        ppscope_lab_pin.install()


_chain()
_faults()
_twin()
_pin()
