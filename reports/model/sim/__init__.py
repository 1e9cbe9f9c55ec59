"""The simulator every pipeline stands on: SGLang's PP loop as events (pipeline_model) and its
closed form. It imports nothing else of the model (tests/test_layering.py)."""
