"""The lab: SGLang's own pipeline-parallel server as the system under test.

An imitation of SGLang proves nothing about SGLang, so ppscope's readers, diagnosis and what-ifs
are checked on artefacts that SGLang's real server wrote. `ppscope sglang-lab` (`make sglang-lab`):

1. `venv.py`   a venv of the lab's own (`.lab/venv`, never the user's environment) with SGLang
               0.5.23 for CPU (`requirements-cpu.txt`, `--no-deps`), the two import shims
               (`boot/`), and a tiny Llama made locally (`boot/..._make_model.py`).
               `--sglang-python PATH` uses an existing SGLang installation instead (a GPU machine:
               no install step, CUDA graphs on), checked and driven as it is: nothing is
               written into it. The fault module reaches every lab server through its
               `PYTHONPATH` (`boot/inject/`). The lab folder holds only what the lab makes.
2. `server.py` starts `sglang.launch_server --pp-size N` on 127.0.0.1, waits for "fired up",
               stops it by its PID (SIGTERM, then the process group), never leaves a process.
3. `cases.py`  the plan: clean runs at C = 1, 8, 16, one injected fault at a time (host delay,
               slow stage, hop delay, an external CPU hog), the herd against the spread through
               SGLang's own settings (`pp_max_micro_batch_size`, burst or staggered arrivals).
4. `drive.py`  per case: bench_serving runs (distinct seeds), a profiled window
               (`with_stack: false, record_shapes: false`, and one with SGLang's defaults), the
               server's `/metrics`, its log for the case, ppscope's own live probe.
5. `lab.py`    runs the plan on one server (faults switched live through a control file), then
               reads every case with `ppscope sglang` and `ppscope report` and prints, per case,
               tok/s, the slowdown against clean and the diagnosis's first cause.

Artefacts land in `results/lab/<case>/` (server.log, traces/, metrics.txt, bench.jsonl,
case.json; then sglang.json and report.*), where `ppscope sglang` reads them.
"""
