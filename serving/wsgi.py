"""WSGI entry point of gunicorn workers: `serving.wsgi:app`.

Imported only inside a worker (gunicorn.conf.py sets preload_app = False), i.e. after fork.
"""

from __future__ import annotations

from serving.app import create_app_from_env

app = create_app_from_env()
