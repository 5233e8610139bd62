"""Benchmarks: they measure and print ratios side by side; tests never assert on time."""
