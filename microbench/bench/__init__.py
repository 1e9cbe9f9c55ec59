"""Benchmarks that print figures (docs/BENCHMARKS.md): the log and trace readers against
generated inputs (`log_reader.py`, `trace_reader.py`, shared `common.py`) and the GPU watch's
sampler against known loads (`watch.py`)."""
