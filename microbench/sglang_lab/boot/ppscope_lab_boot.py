"""Loaded by a `.pth` file in the ppscope lab's own venv (only there: never an installation the lab
did not make), in every Python process started there (the SGLang server, its scheduler
processes, bench_serving). Two jobs, nothing else:

1. torchvision's only wheel for this torch is CUDA-linked: `import torchvision` fails with
   "operator torchvision::nms does not exist". SGLang imports `torchvision.transforms` while it
   imports its configs. Declaring the two operator schemas (no kernels) lets the pure-Python
   parts import; calling them still fails. Where torchvision's own library loads (a torchvision
   built for this torch), it registers the operators itself and nothing is declared: declaring
   them first would make its registration abort the process.
2. The `sgl_kernel` stand-in beside this file (see its docstring) comes first on the path.
The fault module is not loaded here: it reaches every lab server, this venv's or yours, through
`inject/` on the server's `PYTHONPATH`.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _torchvision_loads(torch) -> bool:
    """Whether torchvision's compiled operators load here (loading them is what its own import
    does first; a second load of the same library is a no-op)."""
    import glob
    import importlib.util
    spec = importlib.util.find_spec("torchvision")
    folder = os.path.dirname(spec.origin) if spec and spec.origin else None
    libs = glob.glob(os.path.join(folder, "_C*.so")) if folder else []
    if not libs:
        return False
    try:
        torch.ops.load_library(libs[0])
        return True
    except Exception:
        return False


def _torchvision_schemas():
    try:
        import torch
        if _torchvision_loads(torch):
            return
        lib = torch.library.Library("torchvision", "DEF")   # noqa: F841 (kept alive below)
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        globals()["_tv_lib"] = lib
    except Exception:          # already defined (a real torchvision build) or no torch
        pass


class _Finder:
    """Runs the schema definition just before torchvision is first imported (not at start-up:
    most processes here never import torch at all)."""

    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            _torchvision_schemas()
        return None


def install():
    sys.meta_path.insert(0, _Finder())
