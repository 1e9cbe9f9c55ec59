"""The lab's analysis tables: predicted against measured what-ifs, the cases' summary."""
