"""Vocabulary, the bottom layer: tasks, pooling and activation, tokenization rules, scoring math,
configuration resolution, encoder runtimes and CPU capabilities. Imports nothing else of pooltriton."""
