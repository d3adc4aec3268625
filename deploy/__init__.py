"""Deployment files: gunicorn settings, nginx, systemd units, local stacks (a package, so
that scripts import them from the repository root)."""
