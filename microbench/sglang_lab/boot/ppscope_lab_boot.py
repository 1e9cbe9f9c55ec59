"""Loaded by a `.pth` file in the ppscope lab's own venv (only there: never an installation the lab
did not make), in every Python process started there (the SGLang server, its scheduler
processes, bench_serving). Two jobs, nothing else:

1. torchvision's only wheel for this torch is CUDA-linked: `import torchvision` fails with
   "operator torchvision::nms does not exist". SGLang imports `torchvision.transforms` while it
   imports its configs. Declaring the two operator schemas (no kernels) lets the pure-Python
   parts import; calling them still fails.
2. The `sgl_kernel` stand-in beside this file (see its docstring) comes first on the path.
The fault module is not loaded here: it reaches every lab server, this venv's or yours, through
`inject/` on the server's `PYTHONPATH`.
"""
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))


def _torchvision_schemas():
    try:
        import torch
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
