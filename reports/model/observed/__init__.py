"""The observed server's side: the model of its own loop from its traces and log
(deployment), its diagnosis, settings, log figures, what-ifs and bursts, the GPU watch."""
