"""`ppscope stage-cost`: one decode forward per pipeline stage against its roofline floor
(measure: `probe.py`, with the kernels in microbench/kernels/; CLI: `cli.py`; tuners:
`tune_moe_quant.py`, `tune_moe_triton.py`; SGLang's own kernels timed beside ppscope's:
`sglang_anchor.py`)."""
