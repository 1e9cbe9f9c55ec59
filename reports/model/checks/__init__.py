"""The model against measurement: the dispatch probe's loop (validate_dispatch) and the twin's
runs (twin_check). Above both pipelines, below the report's top files."""
