"""The lab's analysis tables: predicted against measured what-ifs, the cases' summary, a traced
window's round per slot pattern against the model (`rounds.py`)."""
