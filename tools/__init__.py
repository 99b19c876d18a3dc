"""Tools around the stages: evaluation reports and floors, scoring recorded responses, curves,
data writers and converters, the tiny tokenizer build. Each is also a script (python tools/NAME.py)."""
