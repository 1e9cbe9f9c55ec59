"""The scenario's side: the deployment a user describes (inputs, file), its what-ifs,
arrival, implied efficiency, the checks against the probe and the twin."""
