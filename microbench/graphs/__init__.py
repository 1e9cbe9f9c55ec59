"""`ppscope graphs`: CUDA-graph replay against eager launch and SGLang's capture sizes (measure:
`probe.py`; CLI: `cli.py`)."""
