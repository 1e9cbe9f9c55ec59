"""`ppscope dispatch`: SGLang's PP event loop run as a probe (measure: `probe.py` over the loop in
`pp_loop.py`, its stages `pp_stage.py`, messages `pp_comm.py`, device stand-ins `pp_device.py`,
what every rank reads `rank_config.py`; CLI: `cli.py`; the loop behind an OpenAI-style HTTP
front: `serve.py`, `serve_http.py`)."""
