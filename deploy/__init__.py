"""Deployment files: gunicorn settings and worker class, nginx, systemd units, local stacks.

A package so that ``deploy.gunicorn_worker`` (the production worker class) is found in the
repository root, never shadowed by an installed module of the same name."""
