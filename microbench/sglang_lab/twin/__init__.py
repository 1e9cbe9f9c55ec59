"""The twin: a deployment's PP loop on SGLang's own scheduler, with only the device time emulated.

- `run.py`       `ppscope twin`'s runs: the calibration of the dilation k, then one bench_serving
                 run per setting and concurrency, the model of each run beside it;
- `observed.py`  the held-out check: the twin of an observed SGLang CPU server at k = 1 against
                 that server (`ppscope twin --observed`);
- `steady.py`    the steady decode round read from SGLang's own log;
- `table.py`     the tables `ppscope twin` prints from its record;
- `cli.py`       the `ppscope twin` sub-command.

The hold that emulates the device time runs inside SGLang's processes and stays where their
`PYTHONPATH` reaches it: `microbench/sglang_lab/boot/inject/ppscope_twin_hold.py`. Its cost file
is written from the model's figures (reports/model/scenario/twin_costs.py; for the held-out
check reports/model/observed/twin_costs.py).
"""
