"""Benchmarks: ``bench/run.py`` measures the service layer against raw psycopg."""

from __future__ import annotations
