"""The observed server's side: the model of its own loop from its traces and log (deployment),
bench_serving's whole run over it (bench_run), its diagnosis, settings, log figures, what-ifs and
bursts, the GPU watch. It never imports the scenario's side."""
