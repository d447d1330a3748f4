"""Example IO-processor plugins (the default repository serves zero_shot around minilm)."""
