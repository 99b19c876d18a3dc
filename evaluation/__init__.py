"""The evaluator's side: served models, families' formats, published protocols, run outputs."""
