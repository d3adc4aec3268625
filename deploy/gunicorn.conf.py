"""gunicorn settings: threaded workers sized from the CPU count (override with env)."""
import multiprocessing
import os

bind = os.environ.get("GUNICORN_BIND", f"127.0.0.1:{os.environ.get('PORT', '8000')}")
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, multiprocessing.cpu_count())))
threads = int(os.environ.get("GUNICORN_THREADS", 4))
worker_class = "gthread"
timeout = int(os.environ.get("GUNICORN_TIMEOUT", 120))
graceful_timeout = 20
keepalive = 15
max_requests = int(os.environ.get("GUNICORN_MAX_REQUESTS", 0))
accesslog = os.environ.get("GUNICORN_ACCESSLOG")  # e.g. "-" for stdout
errorlog = "-"
