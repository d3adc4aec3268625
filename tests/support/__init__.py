"""Test infrastructure shared by the tests, the benchmark and the fault and fuzz harnesses:
``procs`` (the one process helper), ``standin`` (the one JSON stand-in server base) and
``apps`` (the gateway's own processes built on them)."""
