"""Tests of autotune.model."""
