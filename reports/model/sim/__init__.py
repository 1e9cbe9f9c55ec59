"""The simulator: SGLang's PP loop as events (pipeline_model), its closed form, the
scenario's loop builder and bench_serving's whole run over a loop (bench_run)."""
