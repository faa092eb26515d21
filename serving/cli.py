"""The `relaygr` command: the library's commands plus `relaygr serve` (one instance: gunicorn, one
worker process), `relaygr cluster` (N instances + nginx), `relaygr bench cluster`, `relaygr bench overload`,
`relaygr bench retry` and `relaygr bench soak`.

The console script `relaygr` runs `main` here (`python -m serving.cli ...` is the same), because the
library (`mindspore_relaygr.cli`) never imports `serving`: these commands reach its parser through
`build_parser(extend=register)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

from mindspore_relaygr.config import RelayGRConfig, ServingConfig, load_config
from mindspore_relaygr.errors import RelayGRError
from mindspore_relaygr.shipped_configs import config_arg, config_help

logger = logging.getLogger(__name__)


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=config_arg, default="tiny", help=config_help())
    parser.add_argument("--bundle", default=None, help="serve a bundle from `relaygr export` (its config and "
                                                        "weights; replaces --config)")
    parser.add_argument("-o", "--override", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a config value (repeatable), e.g. -o cache.num_slots=8")
    parser.add_argument("--engine-factory", default=None, metavar="MODULE:CALLABLE",
                        help="build the engine with this (config, instance_id=...) callable instead of "
                             "RelayEngine.from_config (load tests of the HTTP layer, tests)")


def register(subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction) -> None:
    """Add `serve`, `cluster`, `bench cluster`, `bench overload`, `bench retry` and `bench soak` to the
    `relaygr` parser."""
    from serving.cluster_bench import register as register_cluster_bench
    from serving.overload_bench import register as register_overload_bench
    from serving.retry_bench import register as register_retry_bench
    from serving.soak_bench import register as register_soak_bench

    register_cluster_bench(bench_subparsers)
    register_overload_bench(bench_subparsers)
    register_retry_bench(bench_subparsers)
    register_soak_bench(bench_subparsers)
    serve = subparsers.add_parser("serve", help="run one serving instance (gunicorn, 1 worker, gthread threads)")
    _add_config_args(serve)
    serve.add_argument("--host", default=None, help="bind address (default serving.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default serving.port, 8080)")
    serve.add_argument("--instance-id", default=None, help="X-RelayGR-Instance value (default serving.instance_id)")
    serve.add_argument("--threads", type=int, default=None, help="gthread threads (default serving.threads)")
    serve.add_argument("--pid-file", default=None, help="write the gunicorn master's PID here")
    serve.add_argument("--daemon", action="store_true", help="detach (needs --pid-file); stop: kill $(cat PIDFILE)")
    serve.add_argument("--log-file", default=None, help="gunicorn log file (default stderr)")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(func=cmd_serve)

    cluster = subparsers.add_parser("cluster", help="N instances on port+1..port+N behind nginx on port")
    _add_config_args(cluster)
    cluster.add_argument("--instances", type=int, default=2)
    cluster.add_argument("--port", type=int, default=8080, help="nginx port; instances use the next N ports")
    cluster.add_argument("--host", default="127.0.0.1", help="bind address of nginx and the instances")
    cluster.add_argument("--run-dir", default=None, help="configs, PIDs and logs (default outputs/cluster-PORT)")
    cluster.add_argument("--stop", action="store_true",
                         help="stop the cluster on --port (or the one recorded in --run-dir) and exit")
    cluster.add_argument("--detach", action="store_true", help="return once ready; stop later with --stop")
    _add_nginx_args(cluster)
    cluster.add_argument("--ready-timeout", type=float, default=900.0, help="max wait for the instances (s)")
    cluster.add_argument("--device-ids", type=_device_ids, default=None, metavar="ID,ID,...",
                         help="context.device_id of each instance, one per instance (default: instance k on device "
                              "context.device_id + k on Ascend or GPU; on CPU every instance shares the host)")
    cluster.add_argument("--pin-cpus", action="store_true",
                         help="one core per instance (instance k on core k mod cores, one MindSpore thread), as "
                              "one device per instance: a saturated instance cannot slow the others")
    cluster.set_defaults(func=cmd_cluster)

    ngx = subparsers.add_parser("nginx-config", help="write the nginx configuration of `relaygr cluster` for "
                                                     "instances on other machines, and what each must be told")
    ngx.add_argument("--upstream", nargs="+", required=True, metavar="HOST:PORT",
                     help="every instance, as nginx reaches it (and as it binds: --host HOST --port PORT)")
    ngx.add_argument("--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="where nginx listens")
    ngx.add_argument("--run-dir", default=None,
                     help="nginx's prefix: the config, pid file, logs and temp dirs (default outputs/nginx-PORT)")
    ngx.add_argument("--max-conns", type=int, default=ServingConfig.threads,
                     help="connections nginx opens to one instance at most: the instances' serving.threads")
    ngx.add_argument("--max-body", type=int, default=ServingConfig.max_content_length,
                     help="client_max_body_size: the instances' serving.max_content_length (bytes)")
    ngx.add_argument("--serve-args", default="--bundle BUNDLE",
                     help="what the printed instance commands serve (e.g. '--bundle /srv/relaygr/bundle')")
    _add_nginx_args(ngx)
    ngx.set_defaults(func=cmd_nginx_config)


def _add_nginx_args(parser: argparse.ArgumentParser) -> None:
    """nginx's options, the same for `relaygr cluster` and `relaygr nginx-config`."""
    parser.add_argument("--max-fails", type=int, default=0,
                        help="nginx max_fails of every server (0: never eject; an overload 503 counts as a failure)")
    parser.add_argument("--fail-timeout", type=float, default=5.0, help="nginx fail_timeout (s)")
    parser.add_argument("--read-timeout", type=float, default=30.0, help="nginx proxy_read_timeout (s)")
    parser.add_argument("--client-conns", type=int, default=4096,
                        help="client connections nginx is sized for (worker_connections and its open-file limit "
                             "add the connections to the instances)")
    parser.add_argument("--conns-per-client", type=int, default=1024,
                        help="requests one client address may have in progress through nginx (429 past it)")
    parser.add_argument("--client-timeout", type=float, default=10.0,
                        help="nginx client header, body and send timeout (s): a client silent this long is dropped")
    parser.add_argument("--nginx", default=None, help="nginx binary (default PATH, then /usr/sbin/nginx)")
    parser.add_argument("--balance", choices=("affinity", "random"), default="affinity",
                        help="affinity: consistent hash on the X-RelayGR-Affinity header (a user's pre-infer and "
                             "rank meet on one instance); random: a random instance per request (no-affinity "
                             "ablation)")


def _device_ids(text: str) -> tuple[int, ...]:
    """"0,1,2" -> (0, 1, 2)."""
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated device ids, e.g. 0,1") from None
    if min(ids) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a device id is >= 0")
    return ids


def _load(args: argparse.Namespace) -> RelayGRConfig:
    """The config of --bundle (verified) or of --config, with the -o overrides; a config whose vocabulary sizes
    are still null (from the data: train first, then serve its bundle) is refused here, not in the worker."""
    if args.bundle:
        from mindspore_relaygr.export import load_bundle_config

        return load_bundle_config(args.bundle, args.override)
    config = load_config(args.config, args.override)
    config.model.require_sizes()
    return config


def cmd_serve(args: argparse.Namespace) -> int:
    """Validate the config, then exec gunicorn: this process becomes the gunicorn master (same PID)."""
    from serving.settings import require_admin_token, resolve_cli_settings, to_env

    if args.daemon and not args.pid_file:
        raise RelayGRError("--daemon needs --pid-file (that is how the instance is stopped)")
    config = _load(args)
    settings = resolve_cli_settings(config, os.environ, host=args.host, port=args.port, instance_id=args.instance_id,
                                    threads=args.threads, access_log=True if args.access_log else None)
    require_admin_token(settings)
    if args.engine_factory:
        from serving.app import import_factory

        import_factory(args.engine_factory)  # fail here, not in the worker
    else:  # the RelayEngine: an unusable device target fails the command, not the worker after it started
        from mindspore_relaygr.runtime import probe_device

        probe_device(config.context.device_target)
    env = {**os.environ, **to_env(args.config, args.override, dataclasses.asdict(settings), args.engine_factory,
                                  args.bundle)}
    conf = Path(__file__).resolve().parent / "gunicorn.conf.py"
    argv = [sys.executable, "-m", "gunicorn", "-c", str(conf)]
    if args.pid_file:
        argv += ["--pid", str(Path(args.pid_file).resolve())]
    if args.log_file:
        argv += ["--error-logfile", str(Path(args.log_file).resolve())]
    if args.daemon:
        argv += ["--daemon"]
    master = f"pid in {args.pid_file}" if args.daemon else f"pid {os.getpid()}"
    print(f"[serve] instance {settings.instance_id} on http://{settings.host}:{settings.port} "
          f"(gunicorn master {master}, {settings.threads} threads)", file=sys.stderr, flush=True)
    os.execve(sys.executable, argv, env)
    return 0  # not reached


def cmd_cluster(args: argparse.Namespace) -> int:
    """Start (or --stop) N instances behind nginx; in the foreground, Ctrl-C stops everything."""
    from serving.cluster import (
        Cluster,
        ClusterSpec,
        default_device_ids,
        registered_run_dir,
        sigterm_interrupts,
        stop_cluster,
    )
    from serving.settings import require_admin_token, resolve_cli_settings

    run_dir = Path(args.run_dir or f"outputs/cluster-{args.port}").resolve()
    if args.stop:
        if args.run_dir is None:  # the cluster on --port, wherever it was started from
            run_dir = registered_run_dir(args.port) or run_dir
        stopped = stop_cluster(run_dir)
        print(f"[cluster] stopped {', '.join(stopped) or 'nothing (already gone)'}", file=sys.stderr)
        return 0
    config = _load(args)
    settings = resolve_cli_settings(config, os.environ, host=args.host)
    require_admin_token(settings)  # the instances bind --host too: reachable on their own ports
    spec = ClusterSpec(port=args.port, num_instances=args.instances, run_dir=run_dir, config_path=args.config,
                       overrides=tuple(args.override), host=args.host, max_fails=args.max_fails,
                       fail_timeout_s=args.fail_timeout, read_timeout_s=args.read_timeout,
                       max_body_bytes=settings.max_content_length, max_conns=settings.threads,
                       max_client_conns=args.client_conns, conns_per_client=args.conns_per_client,
                       client_timeout_s=args.client_timeout,
                       engine_factory=args.engine_factory, bundle=args.bundle, nginx_bin=args.nginx,
                       balance=args.balance, pin_cpus=args.pin_cpus,
                       device_ids=args.device_ids or default_device_ids(config.context, args.instances))
    cluster = Cluster(spec)
    detached = False
    with sigterm_interrupts():  # SIGTERM stops like Ctrl-C
        try:
            print(f"[cluster] starting {spec.num_instances} instances on {', '.join(spec.servers)}; run dir {run_dir}",
                  file=sys.stderr, flush=True)
            cluster.start(args.ready_timeout)
            how = "hash on the X-RelayGR-Affinity header" if spec.balance == "affinity" else "random instance"
            print(f"[cluster] ready: http://{spec.host}:{spec.port} (nginx, {how})", file=sys.stderr, flush=True)
            if args.detach:
                print(f"[cluster] detached; stop with: relaygr cluster --stop --port {spec.port}", file=sys.stderr)
                detached = True
                return 0
            return cluster.monitor()
        except KeyboardInterrupt:
            print("[cluster] stopping", file=sys.stderr, flush=True)
            return 0
        finally:
            if not detached:
                cluster.stop()


def cmd_nginx_config(args: argparse.Namespace) -> int:
    """Write nginx.conf (serving/nginx.conf.template, as `relaygr cluster` renders it) for `--upstream` instances
    started elsewhere, check it with `nginx -t` when nginx is here, and print what each instance must run."""
    from serving.cluster import ClusterSpec, find_nginx, instance_commands, parse_host_port, write_nginx_conf
    from serving.settings import ENV_ADMIN_TOKEN, is_loopback

    host, port = parse_host_port(args.listen)
    run_dir = Path(args.run_dir or f"outputs/nginx-{port}").resolve()
    spec = ClusterSpec(port=port, num_instances=len(args.upstream), run_dir=run_dir, host=host,
                       max_fails=args.max_fails, fail_timeout_s=args.fail_timeout, read_timeout_s=args.read_timeout,
                       max_body_bytes=args.max_body, max_conns=args.max_conns, max_client_conns=args.client_conns,
                       conns_per_client=args.conns_per_client, client_timeout_s=args.client_timeout,
                       nginx_bin=args.nginx, balance=args.balance, upstreams=tuple(args.upstream))
    try:
        nginx = find_nginx(args.nginx)
    except RelayGRError:
        nginx = None
    conf = write_nginx_conf(spec, nginx)
    checked = "checked with nginx -t" if nginx else "not checked: no nginx here"
    print(f"wrote {conf} ({checked}); start nginx with:\n  nginx -p {run_dir} -c {conf}   # stays in the "
          f"foreground (daemon off): run it under systemd or a supervisor; stop it with SIGQUIT (graceful)")
    print("each instance, on its machine, binding the address nginx names it by and told the upstream list:")
    for command in instance_commands(spec, args.serve_args):
        print(f"  {command}")
    if args.balance != "affinity":
        print("(--balance random: leave out serving.upstream_servers; nginx does not route by the affinity hash)")
    if not all(is_loopback(parse_host_port(s)[0]) for s in spec.servers):
        print(f"instances off loopback need an admin token: export {ENV_ADMIN_TOKEN}=... on each "
              f"(docs/serving.md, \"Admin token\")")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`relaygr ...`: every command of the library and of serving."""
    from mindspore_relaygr.cli import build_parser, run_command

    return run_command(build_parser(extend=register), argv)


if __name__ == "__main__":
    sys.exit(main())
