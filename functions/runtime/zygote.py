"""`python -m functions.runtime.zygote`: a fork server (protocol: contract/zygote.py). It imports the modules
in $STELLARIS_ZYGOTE_PRELOAD (default: the function runtime's, PRELOAD), then forks a ready interpreter for each
request, which runs `python -m <module> <args>` as a fresh one would. The process backend starts function
instances from one, the control plane its serverful actors (`functions.actor.loop`). A fresh instance spends about
1.5 s importing torch, NumPy, the envs and the handlers before it can serve; a fork of this process, which imported
them once, served after 0.013-0.016 s here, its pages shared with the server until written to.

The server runs no Python thread and never builds a model or steps an env, so no thread pool of torch's or
OpenMP's exists to be lost by a fork (NumPy's OpenBLAS starts one worker at import and handles forks itself). It
refuses to fork once an import started a Python thread or CUDA is initialised in it. The child puts on the
process's environment, working directory, memory limit, stdout and command line, then runs its module as
`__main__`; it never returns into the server's loop.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import resource
import runpy
import selectors
import socket
import sys
import threading
from typing import NoReturn

from contract.runtime_http import READY_PREFIX
from contract.zygote import MAX_MESSAGE_BYTES, ZYGOTE_FD_ENV, ZYGOTE_PRELOAD_ENV, SpawnRequest
from host.lifetime import die_with_parent, quick_exit

# Loaded as the server starts: what every function instance imports. The module a request runs and its handler
# are loaded at the first request that names them, before that fork, so a server costs what one fresh instance
# would, and no more, whatever handlers its gateway serves.
PRELOAD = ("functions.runtime.cli",)
# Loaded with a module: torch imports its compiler front end (torch._dynamo, about 1 s) when the first optimizer is
# built, in every parameter instance's first call.
COMPANIONS = {"functions.handlers.parameter": ("torch._dynamo",)}
log = logging.getLogger("stellaris.zygote")


def _preload(module: str) -> None:
    if module in sys.modules:
        return
    try:
        importlib.import_module(module)
    except Exception as exc:  # the forked process fails to load it itself, with the error in its log
        print(f"zygote: cannot preload {module}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return
    for companion in COMPANIONS.get(module, ()):
        _preload(companion)


class Unforkable(RuntimeError):
    """The server can fork no more: what it loaded runs a thread, or CUDA (its users start fresh interpreters)."""


def _cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _become_instance(request: SpawnRequest, stdout_fd: int, inherited: set[int], became: int, server: int) -> int:
    """In the child: put on the instance's process state (then close `became`, which the server waits on), then
    run its module as `python -m` runs one; its exit code."""
    die_with_parent(server)  # the server's death, also one before this line, ends us; and a session of our own
    for fd in inherited:
        with contextlib.suppress(OSError):
            os.close(fd)
    limit = request["memory_bytes"]
    if limit is not None:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_DATA, (int(limit), int(limit)))
    os.dup2(stdout_fd, 1)
    os.close(stdout_fd)
    if request["cwd"]:
        os.chdir(request["cwd"])
    with contextlib.suppress(ImportError):  # else `ps` shows the server's command line instead
        import setproctitle

        setproctitle.setproctitle(request["title"])  # before the env changes: it moves the env out of argv's way
    os.environ.clear()
    os.environ.update(request["env"])
    # A fresh interpreter's global generators start from fresh entropy; a fork's would repeat the server's (Python's
    # own `random` reseeds itself at a fork).
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    os.close(became)
    sys.argv = [request["module"], *request["argv"]]  # run_module puts the module's path first, as `-m` does
    # The server imported the module (for its imports); run as `__main__` it is executed again, as `-m` would, and
    # runpy warns about the copy already in sys.modules unless it goes first (what it imported stays loaded).
    for name in (request["module"], f"{request['module']}.__main__"):
        sys.modules.pop(name, None)
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    return 0  # a module that ends without exiting (those here call quick_exit themselves)


def _exit_instance(code: int) -> NoReturn:
    """End the forked process as a `python -m` run ends; never back into the server's loop."""
    try:
        quick_exit(code)
    except SystemExit:  # a thread outlived quick_exit's wait: a normal exit waits for it, however long
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    finally:
        os._exit(code)


class Server:
    """The fork server's loop: requests on the control socket, and each child's exit through its pidfd."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.selector = selectors.DefaultSelector()
        self.selector.register(control, selectors.EVENT_READ, None)
        self.children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, status socket)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                if key.data is None:
                    if not self._request():
                        return
                else:
                    self._reap(key.fd)

    def _request(self) -> bool:
        """Serve one request; False once the control socket is closed (the backend is gone)."""
        try:
            msg, fds, _, _ = socket.recv_fds(self.control, MAX_MESSAGE_BYTES, 2)
        except OSError:
            return False
        if not msg:
            for fd in fds:
                os.close(fd)
            return False
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            log.error("a spawn request came with %d descriptors, not 2: ignored", len(fds))
            return True
        status = socket.socket(fileno=fds[0])
        stdout_fd = fds[1]
        try:
            request: SpawnRequest = json.loads(msg)
            self._spawn(request, status, stdout_fd)
        except Exception as exc:  # a bad request or a failed fork: that spawn fails, the server stays
            reply = {"error": f"{type(exc).__name__}: {exc}", "unforkable": isinstance(exc, Unforkable)}
            with contextlib.suppress(OSError):
                status.send(json.dumps(reply).encode())
            status.close()
        finally:
            with contextlib.suppress(OSError):
                os.close(stdout_fd)
        return True

    def _spawn(self, request: SpawnRequest, status: socket.socket, stdout_fd: int) -> None:
        for module in (request["module"], _handler_module(request["argv"])):
            if module:
                _preload(module)
        if threading.active_count() > 1:
            raise Unforkable("an import started a thread, which a fork would not carry over")
        if _cuda_initialised():
            raise Unforkable("CUDA is initialised in the fork server; a forked process could not use it")
        sys.stdout.flush()
        sys.stderr.flush()
        # What the server imported is never garbage: frozen, no collection of a child's walks it. A child's first
        # full collection otherwise took 230-340 ms here (torch's objects), mid-round in actors and learners.
        gc.freeze()
        waiting, became = os.pipe()
        server = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                # The server's descriptors: an instance holding them would keep the server's sockets open.
                inherited = {self.control.fileno(), status.fileno(), self.selector.fileno(), *self.children}
                inherited |= {s.fileno() for _, s in self.children.values()} | {waiting}
                code = _become_instance(request, stdout_fd, inherited, became, server)
            except SystemExit as exc:  # bad arguments: argparse has said why on stderr
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                logging.getLogger("stellaris.runtime").exception("forked instance failed to start")
            finally:
                _exit_instance(code)
        os.close(became)
        # The pid goes out once the child has its title, env and descriptors (or died trying): whoever looks it up
        # then sees the process it asked for, never this server's copy.
        with contextlib.suppress(OSError):
            os.read(waiting, 1)
        os.close(waiting)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, status)
        self.selector.register(pidfd, selectors.EVENT_READ, pid)
        status.send(json.dumps({"pid": pid}).encode())

    def _reap(self, pidfd: int) -> None:
        pid, status = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, wait_status = os.waitpid(pid, 0)
        with contextlib.suppress(OSError):  # the backend stopped listening: nobody to tell
            status.send(json.dumps({"exit": os.waitstatus_to_exitcode(wait_status)}).encode())
        status.close()


def _handler_module(argv: list[str]) -> str | None:
    with contextlib.suppress(ValueError, IndexError):
        return argv[argv.index("--handler") + 1].partition(":")[0] or None
    return None


def main() -> int:
    raw = os.environ.pop(ZYGOTE_FD_ENV, "")
    if not raw.isdigit():
        print(f"zygote: ${ZYGOTE_FD_ENV} must name the control socket's descriptor, got {raw!r}", file=sys.stderr)
        return 2
    control = socket.socket(fileno=int(raw))
    # From the env, not the command line: `ps` and /proc show every server as `python -m functions.runtime.zygote`,
    # which no one looking for a module's processes by their command line mistakes for one of them.
    for module in os.environ.pop(ZYGOTE_PRELOAD_ENV, "").split() or PRELOAD:
        _preload(module)
    sys.stdout.write(f"{READY_PREFIX}{os.getpid()}\n")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the backend reads no more of it (as the runtime does)
    Server(control).serve()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # its instances die with it (parent-death signal); nothing of the server's needs a teardown
