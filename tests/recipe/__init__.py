"""Tests of autotune.recipe."""
