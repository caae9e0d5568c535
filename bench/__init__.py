"""Benchmarks: each writes its results under bench/results/ (JSON + a Markdown table)."""
