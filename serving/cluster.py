"""`relaygr cluster`: N instances (one gunicorn each) behind a real nginx, owned by one run directory.

Instances listen on port+1..port+N, nginx on port; everything binds `host` (127.0.0.1 by default).
The run directory holds the generated nginx.conf, nginx's prefix (pid, temp dirs), every log and
`cluster.json` (the PIDs), so `relaygr cluster --stop` can stop a cluster started elsewhere. Every
process is started in its own session and stopped by PID (its process group: master + workers),
and only after checking that the PID still runs a command line naming this run directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from mindspore_relaygr.config import ContextConfig
from mindspore_relaygr.errors import RelayGRError
from mindspore_relaygr.relay.router import NginxConsistentHash
from serving import headers

logger = logging.getLogger(__name__)

TEMPLATE = Path(__file__).with_name("nginx.conf.template")
STATE_FILE = "cluster.json"
ENV_REGISTRY = "RELAYGR_CLUSTER_REGISTRY"  # where running clusters are recorded by port (for --stop --port)
DEFAULT_REGISTRY = "~/.cache/mindspore-relaygr/clusters"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
BALANCES = ("affinity", "random")  # affinity: consistent hash on the affinity header; random: no affinity


class ClusterError(RelayGRError, RuntimeError):
    """A cluster could not be started, or its run directory is not usable."""


@dataclass(frozen=True)
class ClusterSpec:
    """What to start; instance k is "i<k>" on port + 1 + k."""

    port: int
    num_instances: int
    run_dir: Path
    config_path: str | None = None
    overrides: tuple[str, ...] = ()
    host: str = "127.0.0.1"
    # Failed attempts within fail_timeout_s that take a server out of the ring. 0: never; nginx counts an
    # overload 503 as a failed attempt, and ejecting a busy instance would move all its users (and their
    # caches' hits) to its neighbour for fail_timeout_s, or leave no live upstream when both refused once.
    # A dead instance costs a refused connect per request instead (nginx then tries the next server).
    max_fails: int = 0
    fail_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    max_body_bytes: int = 4 * 1024 * 1024
    # Connections nginx opens to one instance at most: its serving.threads, so a request never waits in
    # an instance's accept queue, unseen by its admission control (nginx tries the next server instead).
    max_conns: int = 64
    # Client connections nginx is sized for (worker_connections adds the connections to the instances).
    max_client_conns: int = 4096
    # Requests one client address may have in progress at once (nginx limit_conn; 429 past it).
    conns_per_client: int = 1024
    # nginx's client_header_timeout, client_body_timeout and send_timeout.
    client_timeout_s: float = 10.0
    engine_factory: str | None = None  # "module:callable" instead of RelayEngine.from_config
    bundle: str | None = None  # serving bundle directory instead of config_path
    nginx_bin: str | None = None
    balance: str = "affinity"  # one of BALANCES; "random" is the no-affinity ablation
    # One core per instance (instance k on the k-th usable core, modulo their number), the CPU form of one
    # device per instance: a saturated instance cannot slow its neighbours, as on separate devices. Each
    # instance's MindSpore runs one thread unless context.num_threads is overridden.
    pin_cpus: bool = False
    # context.device_id of each instance (None: the config's, shared by every instance, as on CPU).
    # `relaygr cluster` gives instance k device k on a device target (default_device_ids).
    device_ids: tuple[int, ...] | None = None
    # Instances started elsewhere (`relaygr nginx-config`: other machines), as HOST:PORT; (): this cluster's own
    # instances on host, port+1..port+N.
    upstreams: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.upstreams:
            if len(self.upstreams) != self.num_instances or len(set(self.upstreams)) != len(self.upstreams):
                raise ClusterError(f"upstreams {list(self.upstreams)}: give {self.num_instances} distinct HOST:PORT")
            for server in self.upstreams:
                parse_host_port(server)
        if self.balance not in BALANCES:
            raise ClusterError(f"balance={self.balance!r}: must be one of {BALANCES}")
        if self.num_instances < 1:
            raise ClusterError(f"num_instances={self.num_instances}: must be >= 1")
        if not 0 < self.port < 65536 - (0 if self.upstreams else self.num_instances):
            raise ClusterError(f"port={self.port}: ports port..port+{self.num_instances} must be valid")
        if self.max_fails < 0 or self.fail_timeout_s <= 0 or self.read_timeout_s <= 0 or self.max_conns < 1:
            raise ClusterError("max_fails must be >= 0, fail_timeout_s and read_timeout_s > 0, max_conns >= 1")
        if self.max_client_conns < 1 or self.conns_per_client < 1 or self.client_timeout_s <= 0:
            raise ClusterError("max_client_conns and conns_per_client must be >= 1, client_timeout_s > 0")
        if self.device_ids is not None:
            if len(self.device_ids) != self.num_instances:
                raise ClusterError(f"device ids {list(self.device_ids)}: give one device id per instance "
                                   f"({self.num_instances})")
            if min(self.device_ids) < 0:
                raise ClusterError(f"device ids {list(self.device_ids)}: a device id is >= 0")

    @property
    def instance_ids(self) -> list[str]:
        return [f"i{k}" for k in range(self.num_instances)]

    @property
    def instance_ports(self) -> list[int]:
        return [self.port + 1 + k for k in range(self.num_instances)]

    @property
    def servers(self) -> list[str]:
        """Upstream servers exactly as written in nginx.conf (what nginx hashes, what each instance must be told in
        serving.upstream_servers)."""
        return list(self.upstreams) or [f"{self.host}:{p}" for p in self.instance_ports]

    @property
    def upstream_keepalive(self) -> int:
        """Idle connections nginx keeps to the instances: as many as they take at once."""
        return self.num_instances * self.max_conns

    @property
    def worker_connections(self) -> int:
        """nginx's connection slots: every client, every active and kept-alive connection to an instance, a margin."""
        return self.max_client_conns + self.num_instances * self.max_conns + self.upstream_keepalive + 64

    @property
    def nofile_limit(self) -> int:
        """nginx's open files: two per connection (a buffered request body may need a temp file), plus logs."""
        return 2 * self.worker_connections + 64

    def cpu_set(self, index: int) -> set[int] | None:
        """The cores instance `index` is pinned to (None: not pinned)."""
        if not self.pin_cpus:
            return None
        cores = sorted(os.sched_getaffinity(0))
        return {cores[index % len(cores)]}

    def ring(self) -> NginxConsistentHash:
        """The Python port of nginx's choice for this cluster's upstream block."""
        return NginxConsistentHash(self.servers)


def parse_host_port(text: str) -> tuple[str, int]:
    """"10.0.0.2:8081" (or "[::1]:8081", "node1:8081") -> (host, port); ClusterError otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in text):
        raise ClusterError(f"{text!r}: expected HOST:PORT, e.g. 10.0.0.2:8081")
    return host, int(port)


def instance_commands(spec: ClusterSpec, serve_args: str = "--bundle BUNDLE") -> list[str]:
    """The `relaygr serve` command line each upstream instance of `spec` must run: it binds the address nginx
    names it by and knows the upstream list (serving.upstream_servers), for last-try admission."""
    servers = json.dumps(spec.servers, separators=(",", ":"))
    out = []
    for k, server in enumerate(spec.servers):
        host, port = parse_host_port(server)
        out.append(f"relaygr serve {serve_args} --host {host} --port {port} --instance-id i{k} "
                   f"-o 'serving.upstream_servers={servers}'")
    return out


def default_device_ids(context: ContextConfig, num_instances: int) -> tuple[int, ...] | None:
    """One device per instance where devices exist: on a device target (Ascend, GPU) instance k gets
    context.device_id + k; on CPU None (every instance shares the host)."""
    if context.device_target == "CPU":
        return None
    return tuple(context.device_id + k for k in range(num_instances))


def find_nginx(explicit: str | None = None) -> str:
    """The nginx binary: `explicit`, else PATH, else the Debian locations."""
    found = explicit or shutil.which("nginx") or next((p for p in NGINX_CANDIDATES if os.access(p, os.X_OK)), None)
    if not found or not os.access(found, os.X_OK):
        raise ClusterError("nginx not found: install it (apt-get install -y nginx) or pass --nginx PATH")
    return found


def balance_directive(balance: str) -> str:
    """The upstream block's balancing directive for ClusterSpec.balance."""
    if balance == "random":
        return "random;"
    return f"hash {headers.nginx_variable(headers.AFFINITY)} consistent;"


def check_file_limit(spec: ClusterSpec) -> None:
    """nginx raises its own open-file limit to spec.nofile_limit (worker_rlimit_nofile), which an account
    other than root can do only up to its hard limit: refuse a cluster that would run out of files."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if os.geteuid() != 0 and hard != resource.RLIM_INFINITY and hard < spec.nofile_limit:
        raise ClusterError(f"nginx needs {spec.nofile_limit} open files for --client-conns {spec.max_client_conns} "
                           f"and {spec.num_instances} instances, above this account's hard limit {hard}: raise it "
                           f"(ulimit -Hn, LimitNOFILE=) or lower --client-conns")


def render_nginx_conf(spec: ClusterSpec, template: Path = TEMPLATE) -> str:
    """Fill the template's @NAME@ placeholders; an unknown or unused placeholder is an error."""
    run_dir = spec.run_dir.resolve()
    values = {
        "RUN_DIR": str(run_dir),
        "HOST": spec.host,
        "PORT": str(spec.port),
        "AFFINITY_VAR": headers.nginx_variable(headers.AFFINITY),
        "BALANCE": balance_directive(spec.balance),
        "RETRY_AFTER_HEADER": headers.RETRY_AFTER,
        "ROUTED_HEADER": headers.ROUTED,
        "BALANCE_NAME": spec.balance,
        "SERVERS": "\n".join(f"        server {s} max_fails={spec.max_fails} fail_timeout={spec.fail_timeout_s:g}s "
                             f"max_conns={spec.max_conns};" for s in spec.servers),
        "MAX_BODY": str(spec.max_body_bytes),
        "READ_TIMEOUT": f"{spec.read_timeout_s:g}",
        "TRIES": str(spec.num_instances),
        "WORKER_CONNECTIONS": str(spec.worker_connections),
        "NOFILE": str(spec.nofile_limit),
        "CLIENT_TIMEOUT": f"{spec.client_timeout_s:g}",
        "CONNS_PER_CLIENT": str(spec.conns_per_client),
        "UPSTREAM_KEEPALIVE": str(spec.upstream_keepalive),
    }
    text = template.read_text()
    used = set(re.findall(r"@([A-Z_]+)@", text))
    if used != set(values):
        raise ClusterError(f"template {template}: placeholders {sorted(used)} != provided {sorted(values)}")
    return re.sub(r"@([A-Z_]+)@", lambda m: values[m.group(1)], text)


def write_nginx_conf(spec: ClusterSpec, nginx: str | None) -> Path:
    """Render `spec`'s nginx.conf into its run directory (with the logs/ and tmp/ it names) and, with an `nginx`
    binary, check it with `nginx -t`; returns the file."""
    run_dir = spec.run_dir.resolve()
    for sub in ("logs", "tmp"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    conf = run_dir / "nginx.conf"
    conf.write_text(render_nginx_conf(spec))
    if nginx is not None:
        error_log = str(run_dir / "logs" / "nginx-error.log")
        check = subprocess.run([nginx, "-t", "-q", "-p", str(run_dir), "-c", str(conf), "-e", error_log],
                               capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise ClusterError(f"nginx -t rejected {conf}:\n{check.stderr.strip()}")
    return conf


@dataclass
class Member:
    """One process of the cluster (nginx or an instance's gunicorn master)."""

    name: str
    port: int
    pid: int
    log: str
    proc: subprocess.Popen | None = field(default=None, repr=False, compare=False)

    def to_json(self) -> dict:
        return {"name": self.name, "port": self.port, "pid": self.pid, "log": self.log}


class Cluster:
    """Start, watch and stop the processes of one cluster."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.run_dir = spec.run_dir.resolve()
        self.members: list[Member] = []

    # ------------------------------------------------------------------ start
    def start(self, ready_timeout_s: float = 600.0) -> None:
        """Instances first (until /readyz), then nginx; on any failure stop what was started."""
        self._prepare_run_dir()
        try:
            for index in range(self.spec.num_instances):
                self._start_instance(index)
            self._write_state()
            deadline = time.monotonic() + ready_timeout_s
            for member in self.members:
                _wait_http(f"http://{self.spec.host}:{member.port}/readyz", deadline, member)
            self._start_nginx()
            self._write_state()
            _wait_listening(self.spec.host, self.spec.port, time.monotonic() + 30, self.members[-1])
        except BaseException:
            self.stop()
            raise
        logger.info("cluster up: nginx on %s:%d, instances %s", self.spec.host, self.spec.port,
                    ", ".join(self.spec.servers))

    def member(self, name: str) -> Member:
        """The running member called `name` (an instance id or "nginx")."""
        found = next((m for m in self.members if m.name == name), None)
        if found is None:
            raise ClusterError(f"no member {name!r} in this cluster ({', '.join(m.name for m in self.members)})")
        return found

    def kill_instance(self, name: str, timeout_s: float = 10.0) -> int:
        """SIGKILL instance `name`'s process group (gunicorn master and worker: an instance dying, not a
        graceful stop) and reap it; returns the PID it had. nginx routes around it until it is restarted."""
        member = self.member(name)
        if name == "nginx":
            raise ClusterError("kill_instance kills instances, not nginx")
        _signal_group(member.pid, signal.SIGKILL)
        if not _wait_gone(member, time.monotonic() + timeout_s):
            raise ClusterError(f"{name} (pid {member.pid}) still runs {timeout_s:g} s after SIGKILL")
        (self.run_dir / f"{name}.pid").unlink(missing_ok=True)  # gunicorn's pid file of the dead master
        return member.pid

    def restart_instance(self, name: str) -> Member:
        """Start instance `name` again (same port, config and cores; a new process) after it has exited; the
        state file records the new PID, so `stop` stops it. Wait for it with `wait_ready`."""
        old = self.member(name)
        if old.proc is not None and old.proc.poll() is None:
            raise ClusterError(f"{name} (pid {old.pid}) is still running")
        at = self.members.index(old)
        self._start_instance(self.spec.instance_ids.index(name))  # appended
        new = self.members.pop()
        self.members[at] = new
        self._write_state()
        return new

    def wait_ready(self, name: str, ready_timeout_s: float = 600.0) -> None:
        """Block until instance `name` answers /readyz with 200 (ClusterError if it exits or times out)."""
        member = self.member(name)
        _wait_http(f"http://{self.spec.host}:{member.port}/readyz", time.monotonic() + ready_timeout_s, member)

    def _prepare_run_dir(self) -> None:
        if (self.run_dir / STATE_FILE).exists():
            alive = [m for m in read_state(self.run_dir) if _owned(m.pid, self.run_dir)]
            if alive:
                raise ClusterError(f"{self.run_dir} already runs a cluster ({', '.join(m.name for m in alive)}); "
                                   f"stop it with `relaygr cluster --stop --run-dir {self.run_dir}`")
        for sub in ("logs", "tmp"):
            (self.run_dir / sub).mkdir(parents=True, exist_ok=True)

    def instance_command(self, index: int) -> list[str]:
        """The `relaygr serve` command line of instance `index`."""
        instance_id, port = self.spec.instance_ids[index], self.spec.instance_ports[index]
        pid_file = str(self.run_dir / f"{instance_id}.pid")
        cmd = [sys.executable, "-m", "serving.cli", "serve", "--host", self.spec.host,
               "--port", str(port), "--instance-id", instance_id, "--pid-file", pid_file]
        if self.spec.bundle:
            cmd += ["--bundle", str(Path(self.spec.bundle).resolve())]
        elif self.spec.config_path:
            cmd += ["--config", str(Path(self.spec.config_path).resolve())]
        if self.spec.balance == "affinity":  # the instance learns when a rank is on its last try
            cmd += ["-o", f"serving.upstream_servers={json.dumps(self.spec.servers)}"]
        cpus = self.spec.cpu_set(index)
        if cpus is not None and not any(o.startswith("context.num_threads=") for o in self.spec.overrides):
            cmd += ["-o", f"context.num_threads={len(cpus)}"]
        for override in self.spec.overrides:
            cmd += ["-o", override]
        if self.spec.device_ids is not None:  # after the overrides: one device per instance
            cmd += ["-o", f"context.device_id={self.spec.device_ids[index]}"]
        if self.spec.engine_factory:
            cmd += ["--engine-factory", self.spec.engine_factory]
        return cmd

    def _start_instance(self, index: int) -> None:
        name, port = self.spec.instance_ids[index], self.spec.instance_ports[index]
        self.members.append(self._spawn(name, port, self.instance_command(index), self.spec.cpu_set(index)))

    def _start_nginx(self) -> None:
        nginx, conf, error_log = self._write_nginx_conf(self.spec)
        self.members.append(self._spawn("nginx", self.spec.port,
                                        [nginx, "-p", str(self.run_dir), "-c", str(conf), "-e", error_log]))

    def _write_nginx_conf(self, spec: ClusterSpec) -> tuple[str, Path, str]:
        """Render nginx.conf for `spec` and check it with `nginx -t`; returns (nginx, conf, error log)."""
        nginx = find_nginx(spec.nginx_bin)
        check_file_limit(spec)
        conf = write_nginx_conf(spec, nginx)
        return nginx, conf, str(self.run_dir / "logs" / "nginx-error.log")

    def set_balance(self, balance: str, timeout_s: float = 30.0) -> None:
        """Switch the running nginx to another balancing method, keeping the instances (and their
        warm graphs): rewrite and check nginx.conf, then reload (SIGHUP: a new worker takes the
        new config, the old one finishes its requests and exits). Returns once the old worker is gone."""
        if balance == self.spec.balance:
            return
        nginx = next((m for m in self.members if m.name == "nginx"), None)
        if nginx is None or (nginx.proc is not None and nginx.proc.poll() is not None):
            raise ClusterError("nginx is not running: start the cluster first")
        spec = replace(self.spec, balance=balance)
        self._write_nginx_conf(spec)
        old = set(_children(nginx.pid))
        os.kill(nginx.pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while True:
            _check_running(nginx)
            now = set(_children(nginx.pid))
            if now and not now & old:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"nginx did not reload within {timeout_s:g} s; see {nginx.log}")
            time.sleep(0.05)
        self.spec = spec
        logger.info("nginx reloaded: balance=%s", balance)

    def _spawn(self, name: str, port: int, cmd: list[str], cpus: set[int] | None = None) -> Member:
        log_path = self.run_dir / "logs" / f"{name}.log"
        # Pinned before exec, so every thread and worker process of the member inherits the mask.
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=pin)  # own process group: stopped as a unit
        logger.info("started %s (pid %d) on port %d%s, log %s", name, proc.pid, port,
                    f", cores {sorted(cpus)}" if cpus else "", log_path)
        return Member(name, port, proc.pid, str(log_path), proc)

    def _write_state(self) -> None:
        state = {"owner_pid": os.getpid(), "host": self.spec.host, "port": self.spec.port,
                 "servers": self.spec.servers, "members": [m.to_json() for m in self.members]}
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.run_dir / STATE_FILE)
        register_run_dir(self.spec.port, self.run_dir)

    # ------------------------------------------------------------------ run, stop
    def monitor(self, poll_s: float = 0.5) -> int:
        """Block while nginx runs (Ctrl-C / SIGTERM stop the cluster); log instances that exit."""
        reported: set[str] = set()
        while True:
            for member in self.members:
                code = member.proc.poll() if member.proc is not None else None
                if code is None or member.name in reported:
                    continue
                reported.add(member.name)
                if member.name == "nginx":
                    if code == 0:
                        logger.info("nginx stopped (relaygr cluster --stop?)")
                        return 0
                    logger.error("nginx exited with code %s; see %s", code, member.log)
                    return 1
                log = logger.info if code == 0 else logger.warning
                log("instance %s (pid %d) exited with code %s; nginx routes around it", member.name, member.pid, code)
            if len(reported) == len(self.members) - 1:
                logger.error("every instance has exited")
                return 1
            time.sleep(poll_s)

    def stop(self, timeout_s: float = 20.0) -> list[str]:
        """nginx first (no new traffic), then the instances; returns the names stopped."""
        stopped = stop_members(list(reversed(self.members)), self.run_dir, timeout_s)
        (self.run_dir / STATE_FILE).unlink(missing_ok=True)
        unregister_run_dir(self.spec.port, self.run_dir)
        return stopped


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While the block runs, SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so the `finally` of a command that
    started a cluster stops its nginx and instances instead of leaving them running."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def registry_dir() -> Path:
    return Path(os.environ.get(ENV_REGISTRY) or DEFAULT_REGISTRY).expanduser()


def register_run_dir(port: int, run_dir: Path) -> None:
    """Record that the cluster on `port` keeps its state in `run_dir`, so `relaygr cluster --stop --port`
    finds it from any working directory. Best effort: a read-only home only loses that convenience."""
    try:
        registry_dir().mkdir(parents=True, exist_ok=True)
        (registry_dir() / f"{port}.json").write_text(json.dumps({"run_dir": str(Path(run_dir).resolve())}))
    except OSError as exc:
        logger.warning("could not record the cluster in %s (%s); stop it with --run-dir %s", registry_dir(), exc,
                       run_dir)


def _recorded_run_dir(port: int) -> Path | None:
    try:
        return Path(json.loads((registry_dir() / f"{port}.json").read_text())["run_dir"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def registered_run_dir(port: int) -> Path | None:
    """The run directory recorded for a cluster on `port`, if it still holds a cluster state file."""
    run_dir = _recorded_run_dir(port)
    return run_dir if run_dir is not None and (run_dir / STATE_FILE).exists() else None


def unregister_run_dir(port: int, run_dir: Path) -> None:
    """Forget the record of `port` if it names `run_dir` (another cluster may have taken the port since)."""
    if _recorded_run_dir(port) == Path(run_dir).resolve():
        (registry_dir() / f"{port}.json").unlink(missing_ok=True)


def read_state(run_dir: Path) -> list[Member]:
    """The members recorded in `run_dir`/cluster.json."""
    path = Path(run_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
        return [Member(**m) for m in state["members"]]
    except FileNotFoundError:
        raise ClusterError(f"{path} does not exist: no cluster was started with this run directory") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} is not a cluster state file: {exc}") from None


def stop_cluster(run_dir: Path, timeout_s: float = 20.0) -> list[str]:
    """Stop a cluster from its run directory (`relaygr cluster --stop`); returns the names stopped."""
    run_dir = Path(run_dir).resolve()
    members = read_state(run_dir)
    nginx_first = sorted(members, key=lambda m: m.name != "nginx")
    stopped = stop_members(nginx_first, run_dir, timeout_s)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    port = next((m.port for m in members if m.name == "nginx"), None)
    if port is not None:
        unregister_run_dir(port, run_dir)
    return stopped


def stop_members(members: list[Member], run_dir: Path, timeout_s: float) -> list[str]:
    """SIGTERM each member's process group, wait, then SIGKILL what is left; skip PIDs not ours."""
    stopped = []
    for member in members:
        if member.proc is not None and member.proc.poll() is not None:
            continue  # already exited (and reaped)
        if member.proc is None and not _owned(member.pid, run_dir):
            logger.warning("pid %d (%s) no longer runs this cluster's command; not signalling it", member.pid,
                           member.name)
            continue
        _signal_group(member.pid, signal.SIGTERM)
        stopped.append(member.name)
    deadline = time.monotonic() + timeout_s
    for member in members:
        if not _wait_gone(member, deadline):
            logger.warning("%s (pid %d) ignored SIGTERM; killing its process group", member.name, member.pid)
            _signal_group(member.pid, signal.SIGKILL)
            _wait_gone(member, time.monotonic() + 5)
    return stopped


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # a session leader we started: master and its workers
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(member: Member, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if member.proc is not None:
            if member.proc.poll() is not None:
                return True
        elif not _alive(member.pid):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone for our purposes
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def live_processes(parent: int | None = None, group: int | None = None) -> list[int]:
    """PIDs of the live (non-zombie) processes, from /proc, whose parent is `parent` and/or whose process
    group is `group`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, ppid, pgid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state != "Z" and parent in (None, int(ppid)) and group in (None, int(pgid)):
            out.append(int(entry.name))
    return out


def _children(pid: int) -> list[int]:
    """Live (non-zombie) child PIDs of `pid`."""
    return live_processes(parent=pid)


def _owned(pid: int, run_dir: Path) -> bool:
    """True if `pid` is alive and its command line names `run_dir` (guards against PID reuse)."""
    if not _alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True  # no /proc: trust the state file
    return str(run_dir) in cmdline


def _tail(path: str, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _check_running(member: Member) -> None:
    if member.proc is not None and member.proc.poll() is not None:
        raise ClusterError(f"{member.name} exited with code {member.proc.returncode} during start-up; "
                           f"last lines of {member.log}:\n{_tail(member.log)}")


def warmup_progress(log_path: str) -> str | None:
    """The instance's last "warm-up: graph k of N compiled ..." log message, if any."""
    found = None
    for line in _tail(log_path, 200).splitlines():
        at = line.find("warm-up: graph ")
        if at >= 0:
            found = line[at + len("warm-up: "):]
    return found


def _wait_http(url: str, deadline: float, member: Member, report_every_s: float = 5.0) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never an env proxy
    next_report, reported = time.monotonic() + report_every_s, None
    while True:
        _check_running(member)
        if time.monotonic() >= next_report:  # an instance compiles its graphs for tens of seconds: show where
            progress = warmup_progress(member.log)
            if progress and progress != reported:
                logger.info("%s warming up: %s", member.name, progress)
                reported = progress
            next_report = time.monotonic() + report_every_s
        try:
            with opener.open(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise ClusterError(f"{member.name} was not ready at {url} in time; last lines of {member.log}:\n"
                               f"{_tail(member.log)}")
        time.sleep(0.2)


def _wait_listening(host: str, port: int, deadline: float, member: Member) -> None:
    while True:
        _check_running(member)
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise ClusterError(f"{member.name} did not listen on {host}:{port}") from None
            time.sleep(0.05)
