"""WSGI entry of the benchmark server: ``gunicorn bench.passthrough.wsgi:app``."""
from bench.passthrough import create_bench_app

app = create_bench_app()
