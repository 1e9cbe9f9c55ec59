"""The scenario's side: the deployment a user describes (inputs, file), its loop built for the
simulator (loop_builder), its what-ifs, arrival, implied efficiency, a short run visit by visit
(bench_transient) and the twin's costs. It never imports the observed side."""
