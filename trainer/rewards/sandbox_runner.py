"""The unit_tests sandbox's runner, copied into each run's temporary directory (outside the sandbox) and
run there by `python -I -S -B`. It is a standalone script: it must not import zoo (the sandboxed
interpreter runs with -I) and uses the standard library only.

argv: sandbox dir, solution module, test module, JSON list of test names, CPU s, address-space bytes,
file-size bytes. stdin: the nonce. Its last act is one line "<nonce> <json>" on a private copy of fd 1.
"""

# Kept as written when it was a string in rewards.py, which no linter or formatter saw.
# ruff: noqa: E401, I001, SIM105, UP031
# fmt: off
import importlib, json, os, sys


def main():
    nonce = sys.stdin.readline().strip()
    out = os.dup(1)
    dumps = json.dumps  # bound before the solution runs, which may replace json's functions
    sandbox, solution, tests, names, cpu_s, mem, fsize = sys.argv[1:8]
    names = json.loads(names)
    _limit_resources(int(cpu_s), int(mem), int(fsize))

    root = os.path.realpath(sandbox)
    blocked = []
    hook = _audit_hook(root, blocked)
    report = {"nonce": nonce, "passed": [], "failed": {}, "error": None, "blocked": blocked}
    sys.path.insert(0, root)
    sys.addaudithook(hook)
    try:
        _import_and_test(report, solution, tests, names)
    finally:
        try:
            line = nonce + " " + dumps(report) + "\n"
        except BaseException:
            line = nonce + ' {"error": "runner could not encode its report"}\n'
        try:
            os.write(out, line.encode("utf-8", "replace"))
        finally:
            os._exit(0)  # skip atexit handlers and finalisers the completion may have registered


def _limit_resources(cpu_s, mem, fsize):
    import resource

    limits = [
        (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
        (resource.RLIMIT_AS, mem, mem),
        (resource.RLIMIT_FSIZE, fsize, fsize),
        (resource.RLIMIT_NOFILE, 64, 64),
        (resource.RLIMIT_CORE, 0, 0),
        (resource.RLIMIT_NPROC, 0, 0),
    ]
    for kind, soft, hard in limits:
        try:
            resource.setrlimit(kind, (soft, hard))
        except (ValueError, OSError):
            pass  # a limit already lower than ours (hard limits can only go down) stays as it is


def _audit_hook(root, blocked):
    """The audit hook that keeps writes inside root and denies processes, sockets, ctypes and signals to
    others; each denial (the first 20) is noted in blocked. Its rules live in this closure, not in module
    globals the solution could reach and change."""
    me, group = os.getpid(), os.getpgrp()
    busy = []
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    # event -> (path argument index, dir_fd argument index or None) for each path the event carries
    path_events = {
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
        "os.rename": ((0, 2), (1, 3)), "os.link": ((0, 2), (1, 3)), "os.symlink": ((0, None), (1, 2)),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.truncate": ((0, None),),
        "os.setxattr": ((0, None),), "os.removexattr": ((0, None),), "os.chflags": ((0, None),),
        "os.lchflags": ((0, None),), "shutil.rmtree": ((0, None),),
    }
    denied = {
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
        "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr", "ctypes.dlopen",
        "ctypes.dlsym", "ctypes.cdata", "ctypes.string_at", "ctypes.wstring_at", "resource.setrlimit",
        "resource.prlimit", "signal.pthread_kill",
    }
    denied_imports = {"_ctypes", "ctypes", "_posixsubprocess"}

    def resolve(path, dir_fd=None):
        if isinstance(path, int):
            return os.readlink("/proc/self/fd/%d" % path)
        path = os.fsdecode(path)
        if dir_fd is not None and not os.path.isabs(path):
            path = os.path.join(os.readlink("/proc/self/fd/%d" % dir_fd), path)
        return os.path.realpath(path)

    def inside(path, dir_fd=None):
        try:
            real = resolve(path, dir_fd)
        except Exception:
            return False
        return real == root or real.startswith(root + os.sep)

    def deny(what):
        if len(blocked) < 20:
            blocked.append(what)
        raise PermissionError("sandbox: %s is not allowed" % what)

    def hook(event, args):
        if busy:
            return
        busy.append(1)
        try:
            check(event, args)
        finally:
            busy.pop()

    def check(event, args):
        if event == "open":
            path, mode, flags = args
            if isinstance(path, int) or path is None:
                return  # an already open descriptor (stdout, a pipe)
            if isinstance(flags, int) and flags >= 0:
                writing = bool(flags & write_flags)
            else:
                writing = isinstance(mode, str) and any(c in mode for c in "wax+")
            if inside(path) or os.fsdecode(path) == "/dev/null":
                return
            if writing:
                deny("write to %r" % os.fsdecode(path))
            if os.path.isdir(path):
                deny("opening directory %r" % os.fsdecode(path))  # its fd would allow dir_fd escapes
        elif event in path_events:
            for index, fd_index in path_events[event]:
                path = args[index]
                dir_fd = args[fd_index] if fd_index is not None else None
                if path is not None and not inside(path, dir_fd):
                    shown = path if isinstance(path, int) else os.fsdecode(path)
                    deny("%s of %r" % (event, shown))
        elif event in denied:
            deny(event)
        elif event in ("os.kill", "os.killpg"):
            target = args[0]
            if target not in (0, me, group, -group):
                deny("%s(%r)" % (event, target))
        elif event == "import" and args[0] in denied_imports:
            deny("import of %s" % args[0])

    return hook


def _describe(exc):
    try:
        text = str(exc)
    except BaseException:
        text = "?"
    return (type(exc).__name__ + (": " + text if text else ""))[:300]


def _import_and_test(report, solution, tests, names):
    """Import the solution, then the tests, and call each named test, filling in report."""
    try:
        importlib.import_module(solution)
    except SyntaxError as exc:  # IndentationError and TabError too
        report["error"] = "solution does not compile: %s: %s (line %s)" % (
            type(exc).__name__, exc.msg, exc.lineno)
    except BaseException as exc:
        report["error"] = "solution raised %s on import" % _describe(exc)
    if report["error"] is None:
        try:
            module = importlib.import_module(tests)
        except BaseException as exc:
            report["error"] = "tests raised %s on import" % _describe(exc)
        else:
            for name in names:
                try:
                    getattr(module, name)()
                except BaseException as exc:
                    report["failed"][name] = _describe(exc)
                else:
                    report["passed"].append(name)


if __name__ == "__main__":  # importing this module must not run it (main reads stdin and calls os._exit)
    main()
