"""The GPU watch: every visible GPU sampled through NVML (and DCGM where present) beside the
user's load (measure: `sampler.py`, `dcgm.py`; command side: `cli.py`, used by
`ppscope sglang --watch`)."""
