"""The zygote: the first program of a warm sandbox (:class:`autograder.sandbox.warm.WarmSandbox`), root inside it,
which imports the lessons' libraries once and forks each of the student's notebooks a kernel.

It runs inside the sandbox, which cannot see ``autograder/``: the warm sandbox reads this file and hands its text to
the launcher as ``python -c``, after the syscall profile's loader (``syscall_profile.LOADER``, which defines
``load_seccomp``). So it imports the standard library only, and its arguments come on the command line:
``PREIMPORT UID MEMORY_BYTES PREIMPORT_TORCH KERNEL_PROFILE_HEX``.

It reads one command per line on stdin: ``clean`` empties ``/tmp``, ``/dev/shm`` and ``$HOME`` (what the previous
notebook left) and answers ``clean``; ``fork TORCH CONNECTION_FILE`` forks, and the child becomes an IPython kernel
in a session of its own, stdin and stdout on ``/dev/null``; the zygote answers ``forked PID`` and, when a kernel
ends, ``exit PID STATUS``. End of stdin ends it.
"""

import ctypes
import importlib
import os
import resource
import select
import shutil
import sys

# decoder_course, which the zygote imports before any kernel's shell exists, registers its figures' ``text/html``
# form (an ``<img>`` with its description as ``alt``) only once there is a shell: each kernel runs this line first, so
# that a figure drawn with plt alone reaches the feedback page with its description (a statement: it shows nothing).
DESCRIBE_FIGURES = ("--IPKernelApp.exec_lines="
                    "if 'decoder_course' in __import__('sys').modules: "
                    "__import__('decoder_course').describe_figures_in_notebooks()")


def preimport(names: str) -> None:
    for name in names.split(","):
        try:
            importlib.import_module(name)
        except Exception:
            pass


def empty(top: str, mounts: list[str]) -> None:
    """Remove what is under ``top``, except what bwrap bound there (``mounts``)."""
    for entry in os.listdir(top):
        path = os.path.join(top, entry)
        if path in mounts:
            continue
        if any(m.startswith(path + "/") for m in mounts):
            if os.path.isdir(path) and not os.path.islink(path):
                empty(path, mounts)
            continue
        try:  # nothing of the notebook runs any more: no link can be swapped in under this
            if os.path.isdir(path) and not os.path.islink(path):
                for root, dirs, _ in os.walk(path):
                    for d in dirs:
                        if not os.path.islink(os.path.join(root, d)):
                            os.chmod(os.path.join(root, d), 0o700)
                os.chmod(path, 0o700)
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except OSError:
            pass


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def become_kernel(connection_file: str, uid: int, memory: int, kernel_profile: str, load_seccomp) -> None:
    """In the forked child: this notebook's limits, IPC namespace, uid and syscall profile, then the kernel."""
    # the address space the libraries take (a cold kernel maps them as it imports them), plus the limit
    with open("/proc/self/status") as handle:
        mapped = next(int(line.split()[1]) for line in handle if line.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, mapped + memory))
    libc = ctypes.CDLL(None, use_errno=True)
    # this notebook's own SysV IPC and POSIX message queues, gone with its last process (root only)
    if libc.unshare(0x08000000) != 0:  # CLONE_NEWIPC
        raise OSError(ctypes.get_errno(), "a fresh IPC namespace for the kernel was refused")
    if os.getuid() == 0:  # the uid of a cold kernel: from here on no process of the notebook is root
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE, as after an exec
    refused = load_seccomp(kernel_profile)  # on top of the zygote's: unshare is refused from here on
    if refused:
        raise OSError(f"sandbox: {refused}: nothing runs without it")
    os.setsid()
    null = os.open("/dev/null", os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    os.chdir(os.environ["HOME"])
    sys.argv = ["ipykernel_launcher", "-f", connection_file, DESCRIBE_FIGURES]
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


def main(load_seccomp) -> None:
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # as ipykernel sets it
    preimport(sys.argv[1])
    later = sys.argv[4]  # torch and what needs it: see fork
    uid, memory = int(sys.argv[2]), int(sys.argv[3])  # the kernels' uid and RLIMIT_AS beyond the libraries
    kernel_profile = sys.argv[5]  # the syscall profile each kernel loads on top of the zygote's
    with open("/proc/self/mountinfo") as handle:  # what bwrap bound (kernel sockets, font list): never emptied
        mounts = [line.split()[4] for line in handle]

    say("ready")
    pending = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.1)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            say(f"exit {pid} {status}")
        if not ready:
            continue
        data = os.read(0, 4096)
        if not data:
            os._exit(0)
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            words = line.decode("utf-8", "replace").split(" ", 2)
            if words == ["clean"]:  # what the last notebook left: the grader then asks the kernel what is left
                for top in ("/tmp", "/dev/shm", os.environ["HOME"]):
                    try:
                        empty(top, mounts)
                    except BaseException:  # a tree too deep to walk: the grader sees it left, and retires us
                        pass
                say("clean")
                continue
            if words[0] != "fork" or len(words) != 3:
                continue
            if words[1] == "1" and later:  # this notebook uses torch: import it before the fork
                preimport(later)
                later = ""
            pid = os.fork()
            if pid == 0:
                try:
                    become_kernel(words[2], uid, memory, kernel_profile, load_seccomp)
                except BaseException:
                    import traceback

                    traceback.print_exc()
                    os._exit(1)
                os._exit(0)
            say(f"forked {pid}")


if __name__ == "__main__":  # run as `python -c LOADER+this`: the loader's text defined load_seccomp just before
    main(globals()["load_seccomp"])
