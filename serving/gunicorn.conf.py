"""gunicorn settings of one RelayGR instance (`relaygr serve` passes its flags in RELAYGR_* variables).

One worker process per instance: the KV cache lives in that process, and a second worker would
split it. Concurrency comes from gthread threads (serving/worker.py: gthread with read limits on
client sockets, so stalled clients cannot hold every thread); the engine serialises device work on
its own executor thread. The engine is built after fork (post_fork), never in the master.
"""

import logging
import math
import sys

from serving.settings import load_from_env, require_admin_token

_config, _settings = load_from_env()  # validated here, in the master, so a bad config fails fast
require_admin_token(_settings)

# ---------------------------------------------------------------- server socket
bind = [f"{_settings.host}:{_settings.port}"]  # 127.0.0.1 unless serving.host says otherwise
backlog = 256

# ---------------------------------------------------------------- worker processes
wsgi_app = "serving.wsgi:app"
workers = 1  # never more: each worker would hold its own, separate cache
worker_class = "serving.worker.RelayGRWorker"  # gthread, hardened against slow clients; JSON errors
threads = _settings.threads
preload_app = False  # the app and MindSpore are imported only in the worker, after fork
max_requests = 0  # never recycle the worker: that would drop every cached prefix
timeout = math.ceil(_settings.timeout_s)  # heartbeat timeout of the worker (the engine builds off-thread)
graceful_timeout = math.ceil(_settings.graceful_timeout_s)  # the drain (serving.drain_s) comes first
keepalive = math.ceil(_settings.keepalive_s)  # > nginx's upstream keepalive_timeout: nginx closes first

# ---------------------------------------------------------------- process naming and control
proc_name = f"relaygr-{_settings.instance_id}"
control_socket_disable = True  # gunicorn >= 25 would share ~/.gunicorn/gunicorn.ctl between instances
# pidfile and daemon come from the command line (`relaygr serve --pid-file ... --daemon`).

# ---------------------------------------------------------------- logging
loglevel = _settings.log_level
errorlog = "-"
accesslog = "-" if _settings.access_log else None
access_log_format = '%(h)s "%(r)s" %(s)s %(b)s %(M)sms cache=%({x-relaygr-cache}o)s'


# ---------------------------------------------------------------- server hooks
def when_ready(server):
    server.log.info("relaygr instance %s: master ready on %s (model version %s)", _settings.instance_id,
                    ", ".join(bind), _config.model.version)


def post_fork(server, worker):
    """In the new worker: its client read limits, library logging, then start building the engine in the
    background."""
    worker.client_timeout_s = _settings.client_timeout_s
    worker.request_timeout_s = _settings.request_timeout_s
    worker.max_content_length = _settings.max_content_length
    worker.drain_s = _settings.drain_s
    logging.basicConfig(level=_settings.log_level.upper(), stream=sys.stderr,
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    from serving import wsgi  # creates the app here, in the worker

    holder = wsgi.app.extensions["relaygr"].holder
    worker.on_drain = holder.drain  # SIGTERM: /readyz fails while the worker drains
    holder.start()
    server.log.info("worker %d: building the engine of instance %s", worker.pid, _settings.instance_id)


def worker_exit(server, worker):
    """Stop the engine's executor thread before the worker exits."""
    wsgi = sys.modules.get("serving.wsgi")
    if wsgi is not None:
        wsgi.app.extensions["relaygr"].holder.close()
