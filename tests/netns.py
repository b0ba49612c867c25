"""Several "hosts" on one machine, for tests: a `dask scheduler` and each `dask worker` in a
network namespace of its own, joined by veth pairs to a bridge that lives in a namespace of its
own too (so the machine's firewall never sees the traffic between them), with the test process
(the driver) on that bridge through one more veth pair. Each worker also gets its own mount
namespace with a private tmpfs on /dev/shm: replicas on different hosts share no memory.

Every name carries the creating process's pid (namespaces `ldmh-<pid>-<role>`, the driver's
interface `lm<pid hex>d`), so parallel runs never collide and a later run can remove what a
killed one left behind (`remove_orphans`). Addresses: a free 10.213.X.0/24, the driver .1, the
scheduler .2, worker i .(10 + i).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from distributed import Client

PREFIX = "ldmh"
SHM_SIZE = "256m"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (a skip reason), or None: tries to make one."""
    if os.name != "posix" or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 / util-linux)"
    probe = f"{PREFIX}-{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"this machine cannot make network namespaces: {made.stderr.strip()}"
    try:
        shm = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--mount", "sh", "-c",
                              f"mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm"],
                             capture_output=True, text=True, timeout=30)
    finally:
        _delete_namespace(probe)
    if shm.returncode != 0:
        return f"this machine cannot give a namespace its own /dev/shm: {shm.stderr.strip()}"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(ns: str) -> None:
    """SIGKILL whatever still runs in namespace `ns` (only processes a run of ours started)."""
    for pid in _ip("netns", "pids", ns, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _delete_namespace(ns: str) -> None:
    _kill_inside(ns)
    _ip("netns", "del", ns, check=False)


def remove_orphans() -> list[str]:
    """Delete the namespaces (and the processes in them) of runs whose process is gone."""
    removed = []
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{PREFIX}-(\d+)-\w+", name)
        if m and not _alive(int(m.group(1))):
            _delete_namespace(name)
            removed.append(name)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        m = re.search(r"^\d+: (lm([0-9a-f]+)d)[@:]", line)
        if m and not _alive(int(m.group(2), 16)):
            _ip("link", "del", m.group(1), check=False)
            removed.append(m.group(1))
    return removed


def _free_subnet() -> str:
    """A 10.213.X prefix no interface of this namespace uses, tried from X = pid % 256 on (two
    runs starting at once rarely pick the same)."""
    used = set(re.findall(r"inet 10\.213\.(\d+)\.", _ip("-o", "-4", "addr").stdout))
    start = os.getpid() % 256
    for x in (*range(start, 256), *range(start)):
        if str(x) not in used:
            return f"10.213.{x}"
    raise RuntimeError("no free 10.213.X.0/24 subnet")


class NetnsCluster:
    """A scheduler and `n_workers` workers, each on its own "host". `close` removes it all,
    whatever state it was left in."""

    def __init__(self, n_workers: int, bin_dir: Path, log_dir: Path,
                 start_timeout: float = 90.0):
        self.tag = f"{PREFIX}-{os.getpid()}"
        self.bridge_ns = f"{self.tag}-br"
        self.driver_if = f"lm{os.getpid():x}d"
        self.subnet = _free_subnet()
        self.scheduler_ip = f"{self.subnet}.2"
        self.address = f"tcp://{self.scheduler_ip}:8786"
        self.worker_ips = [f"{self.subnet}.{10 + i}" for i in range(n_workers)]
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self._bin = bin_dir
        self._log_dir = log_dir
        try:
            self._network(n_workers)
            self._start(start_timeout)
        except BaseException:
            self.close()
            raise

    # -- the network -------------------------------------------------------------------------
    def _namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _network(self, n_workers: int) -> None:
        self._namespace(self.bridge_ns)
        _ip("-n", self.bridge_ns, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge_ns, "link", "set", "br0", "up")
        # the driver (this namespace) on the bridge
        _ip("link", "add", self.driver_if, "type", "veth", "peer", "name", "drv",
            "netns", self.bridge_ns)
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.driver_if)
        _ip("link", "set", self.driver_if, "up")
        self._plug("drv")
        self._host("s", "sched", self.scheduler_ip)
        for i, address in enumerate(self.worker_ips):
            self._host(f"w{i}", f"w{i}", address)

    def _plug(self, port: str) -> None:
        _ip("-n", self.bridge_ns, "link", "set", port, "master", "br0")
        _ip("-n", self.bridge_ns, "link", "set", port, "up")

    def _host(self, role: str, port: str, address: str) -> None:
        """A namespace `<tag>-<role>` whose eth0 (at `address`) is plugged into the bridge as
        `port`."""
        ns = f"{self.tag}-{role}"
        self._namespace(ns)
        _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port,
            "netns", self.bridge_ns)
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        self._plug(port)

    def cut(self, worker: int) -> None:
        """Pull worker `worker`'s cable: its bridge port goes down, nothing is sent either way
        (no reset: connections just stop, as when a host or a switch dies)."""
        _ip("-n", self.bridge_ns, "link", "set", f"w{worker}", "down")

    def mend(self, worker: int) -> None:
        _ip("-n", self.bridge_ns, "link", "set", f"w{worker}", "up")

    # -- the processes -------------------------------------------------------------------------
    def _spawn(self, ns: str, name: str, command: list[str]) -> None:
        """`command` in namespace `ns`, in a mount namespace of its own with a private tmpfs on
        /dev/shm (unshare and sh exec: the Popen's pid is dask's own)."""
        script = f'mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm && exec "$@"'
        self.logs.append(self._log_dir / f"{name}.log")
        # the tests' own modules importable there, as on a LocalCluster's workers (steps
        # defined in a test module are pickled by reference): tests/ and its folders
        here = Path(__file__).parent
        tests = [here, *sorted(d for d in here.iterdir() if d.is_dir() and d.name[0] != "_")]
        path = [*map(str, tests), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        with open(self.logs[-1], "wb") as log:
            self.procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--propagation", "private",
                 "sh", "-c", script, "sh", *command],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env))

    def _start(self, timeout: float) -> None:
        dask = str(self._bin / "dask")
        self._spawn(f"{self.tag}-s", "scheduler",
                    [dask, "scheduler", "--host", self.scheduler_ip, "--port", "8786",
                     "--no-dashboard", "--idle-timeout", "600s"])
        for i, address in enumerate(self.worker_ips):
            self._spawn(f"{self.tag}-w{i}", f"worker-{i}",
                        [dask, "worker", self.address, "--host", address, "--nthreads", "1",
                         "--no-nanny", "--no-dashboard", "--death-timeout", "60s"])
        deadline = time.monotonic() + timeout
        while True:
            dead = [log.stem for p, log in zip(self.procs, self.logs, strict=True)
                    if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead[0]} exited at start-up\n{self.log_tail()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the namespaced cluster at {self.address} did not show "
                                   f"{len(self.worker_ips)} workers in {timeout:g} s\n"
                                   f"{self.log_tail()}")
            try:
                with Client(self.address, timeout=min(5, left), set_as_default=False) as c:
                    c.wait_for_workers(len(self.worker_ips), timeout=max(1, left))
                    self.workers = sorted(c.scheduler_info(n_workers=-1)["workers"])
                return
            except (OSError, TimeoutError):
                time.sleep(0.3)

    def worker_pid(self, worker: int) -> int:
        return self.procs[1 + worker].pid

    def log_tail(self, n: int = 1500) -> str:
        out = []
        for path in self.logs:
            with contextlib.suppress(OSError):
                out.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-n:]}")
        return "\n".join(out)

    def close(self) -> None:
        """Stop the processes (workers first), delete the namespaces and the driver's link."""
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        deadline = time.monotonic() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                p.wait(timeout=10)
        for ns in reversed(self.namespaces):
            _delete_namespace(ns)  # the veth pairs go with their namespaces
        self.namespaces = []
        _ip("link", "del", self.driver_if, check=False)
