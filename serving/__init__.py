"""HTTP serving of the relay engine (Flask app factory, gunicorn config, nginx template)."""
