"""Tests of the benchmark scripts in benchmarks/."""
