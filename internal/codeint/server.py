#!/usr/bin/python3
"""clade's code interpreter server (runs inside a sandbox of the
code-interpreter image; installed there by clade, see internal/codeint).

It speaks the wire of E2B's code interpreter on port 49999:

  POST   /execute               {code, context_id, language, env_vars, timeout}
                                -> newline-delimited JSON: stdout, stderr,
                                   result, error, number_of_executions,
                                   end_of_execution
  POST   /contexts              {language, cwd} -> {id, language, cwd}
  GET    /contexts              -> [{id, language, cwd}]
  DELETE /contexts/{id}
  POST   /contexts/{id}/restart
  GET    /health                -> {"ok": true, ...}

Each context is one kernel: Python is an ipykernel kernel driven through
jupyter_client (ipc transport: unix sockets, which a sandbox's checkpoint,
restore and fork keep), bash a persistent bash process, JavaScript a
persistent Node process running a small driver of this file. Everything a
client sends is treated as hostile: bodies are bounded, output is bounded
(MAX_STREAM, MAX_RESULT: past them a marker says what was dropped), a
context id names only this server's contexts, and a run ends at its
timeout or when its client goes away: the kernel is interrupted, and one
that does not come back within INTERRUPT_GRACE is killed (with every
process it started) and restarted, its state lost.
"""

import codecs
import hashlib
import json
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ.get("CLADE_CODEINT_PORT", "49999"))
RUN_DIR = "/run/clade-codeint"
MAX_BODY = 8 << 20  # a request body (the code) at most
MAX_STREAM = 8 << 20  # stdout+stderr bytes of one execution at most
MAX_RESULT = 32 << 20  # rich result bytes of one execution at most
MAX_CONTEXTS = 64
# How long a kernel has to come back after an interrupt (a timeout, a
# client gone) before it is killed and restarted.
INTERRUPT_GRACE = float(os.environ.get("CLADE_CODEINT_GRACE", "5"))
# How often a run that streams output checks whether its client is gone.
GONE_EVERY = 0.1
# A client that takes none of a run's output for this long is gone.
WRITE_TIMEOUT = 60.0
WRITE_MIN = 10.0
LANGUAGES = ("python", "bash", "js")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ALIASES = {"python": "python", "python3": "python", "py": "python",
           "bash": "bash", "sh": "bash", "shell": "bash",
           "js": "js", "javascript": "js", "node": "js", "nodejs": "js",
           "typescript": None, "ts": None, "r": None, "java": None, "deno": None}

# Jupyter MIME types as the E2B client names them.
MIME_KEYS = {
    "text/plain": "text", "text/html": "html", "text/markdown": "markdown",
    "image/svg+xml": "svg", "image/png": "png", "image/jpeg": "jpeg",
    "application/pdf": "pdf", "text/latex": "latex", "application/json": "json",
    "application/javascript": "javascript",
}


class ClientError(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


def default_cwd():
    for d in ("/home/user",):
        if os.path.isdir(d):
            return d
    return "/root" if os.path.isdir("/root") else "/"


# ---------------------------------------------------------------- kernels

class Emitter:
    """Bounds what one execution sends and writes it as NDJSON lines."""

    def __init__(self, write):
        self.write = write
        self.stream_bytes = 0
        self.result_bytes = 0
        self.truncated = False
        self.broken = False

    def send(self, obj):
        if self.broken:
            return
        try:
            self.write((json.dumps(obj) + "\n").encode())
        except (BrokenPipeError, ConnectionError, OSError):
            self.broken = True

    def stream(self, name, text):
        if not text:
            return
        n = len(text.encode("utf-8", "replace"))
        if self.stream_bytes + n > MAX_STREAM:
            if not self.truncated:
                self.truncated = True
                room = MAX_STREAM - self.stream_bytes
                self.stream_bytes = MAX_STREAM
                if room > 0:
                    self.send({"type": name, "text": text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore"), "timestamp": now()})
                self.send({"type": "stderr", "text": "\n[clade: output truncated: more than %d bytes of stdout and stderr]\n" % MAX_STREAM,
                           "timestamp": now()})
            return
        self.stream_bytes += n
        self.send({"type": name, "text": text, "timestamp": now()})

    def result(self, data, main):
        out = {"type": "result", "is_main_result": bool(main)}
        size = 0
        for mime, v in data.items():
            if not isinstance(v, str):
                v = json.dumps(v)
            size += len(v)
            key = MIME_KEYS.get(mime, mime)
            out[key] = v
        if self.result_bytes + size > MAX_RESULT:
            self.send({"type": "stderr", "text": "[clade: a result of %d bytes dropped: results are limited to %d bytes a run]\n" % (size, MAX_RESULT),
                       "timestamp": now()})
            return
        self.result_bytes += size
        self.send(out)

    def error(self, name, value, tb):
        self.send({"type": "error", "name": name, "value": value, "traceback": tb})


def now():
    return int(time.time() * 1e6)


class KernelDied(Exception):
    pass


class Stuck(Exception):
    """A kernel did not come back within INTERRUPT_GRACE of an interrupt."""

    def __init__(self, why):
        super().__init__(why)
        self.why = why


class Watch:
    """Ends a run: interrupts its kernel at its deadline or when its client
    is gone, and raises Stuck when the kernel does not come back within
    INTERRUPT_GRACE. check() is called on every turn of a run's loop,
    whether output flows or not."""

    def __init__(self, kernel, em, deadline, gone, stopped=None):
        self.kernel = kernel
        self.em = em
        self.deadline = deadline
        self.gone = gone
        # stopped, when given, tells whether the kernel has ended the run
        # even though its output is not all read yet: a kernel that
        # printed without pause leaves a backlog that a loaded machine
        # takes longer than INTERRUPT_GRACE to drain, and a kernel that
        # did stop must not be killed (and its state lost) for that.
        self.stopped = stopped
        self.drain = False
        self.interrupted = None
        self.at = 0.0
        self.next_gone = 0.0

    def check(self):
        t = time.monotonic()
        if self.interrupted is not None:
            if not self.drain and t > self.at + INTERRUPT_GRACE:
                if self.stopped is not None and self.stopped():
                    self.drain = True  # what is left is finite: read it
                    return
                raise Stuck(self.interrupted)
            return
        why = None
        if self.deadline is not None and t > self.deadline:
            why = "timeout"
        elif self.em.broken:
            why = "client"
        elif t >= self.next_gone:
            self.next_gone = t + GONE_EVERY
            if self.gone():
                why = "client"
        if why is not None:
            self.interrupted, self.at = why, t
            self.kernel.interrupt()


def kill_tree(pid):
    """SIGKILLs process pid, its process group and every process below
    it (children that left the group: setsid, a daemon's first fork)."""
    if not pid:
        return
    for _ in range(2):
        children = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % d, "rb") as f:
                    st = f.read()
                ppid = int(st[st.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d))
        todo, seen = [pid], []
        while todo:
            p = todo.pop()
            seen.append(p)
            todo.extend(children.get(p, []))
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        for p in seen:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


class PythonKernel:
    language = "python"

    def __init__(self, cwd):
        from jupyter_client import KernelManager
        os.makedirs(RUN_DIR, mode=0o700, exist_ok=True)
        self.cwd = cwd
        self.tag = uuid.uuid4().hex[:12]
        self.km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(RUN_DIR, "k-" + self.tag),
                                connection_file=os.path.join(RUN_DIR, "k-%s.json" % self.tag))
        env = dict(os.environ)
        env.pop("CLADE_CODEINT_PORT", None)
        self.km.start_kernel(cwd=cwd, env=env)
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def alive(self):
        return self.km.is_alive()

    def pid(self):
        proc = getattr(getattr(self.km, "provisioner", None), "process", None) or getattr(self.km, "kernel", None)
        return getattr(proc, "pid", None)

    def interrupt(self):
        try:
            self.km.interrupt_kernel()
        except Exception:
            pass

    def shutdown(self):
        pid = self.pid()
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        kill_tree(pid)
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass
        for f in os.listdir(RUN_DIR):
            if f.startswith("k-" + self.tag):
                try:
                    os.unlink(os.path.join(RUN_DIR, f))
                except OSError:
                    pass

    def _quiet(self, code):
        """Runs code silently (env set and restore), waiting for its end."""
        mid = self.kc.execute(code, silent=True, store_history=False)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                m = self.kc.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.alive():
                    return
                continue
            if m["parent_header"].get("msg_id") == mid and m["msg_type"] == "status" and m["content"]["execution_state"] == "idle":
                return

    def run(self, code, env, em, deadline, gone):
        if env:
            self._quiet("import os as _clade_os\n_clade_env_saved = {k: _clade_os.environ.get(k) for k in %r}\n"
                        "_clade_os.environ.update(%r)\ndel _clade_os" % (list(env), env))
        restore = True
        try:
            return self._run(code, em, deadline, gone)
        except (Stuck, KernelDied):
            restore = False
            raise
        finally:
            if env and restore and self.alive():
                self._quiet("import os as _clade_os\nfor _k, _v in _clade_env_saved.items():\n"
                            "    _clade_os.environ.pop(_k, None) if _v is None else _clade_os.environ.__setitem__(_k, _v)\n"
                            "del _clade_os, _clade_env_saved, _k, _v")

    def _replied(self, mid):
        """Whether the kernel answered execute request mid on its shell
        channel: it has ended that run (its reply follows the run's last
        output and comes before its idle status)."""
        while True:
            try:
                m = self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return False
            if m["parent_header"].get("msg_id") == mid:
                return True

    def _run(self, code, em, deadline, gone):
        mid = self.kc.execute(code)
        count = None
        w = Watch(self, em, deadline, gone, lambda: self._replied(mid))
        while True:
            w.check()
            try:
                m = self.kc.get_iopub_msg(timeout=0.25)
            except queue.Empty:
                if not self.alive():
                    raise KernelDied("the python kernel died")
                continue
            if m["parent_header"].get("msg_id") != mid:
                continue
            t, c = m["msg_type"], m["content"]
            if t == "stream":
                em.stream(c.get("name", "stdout"), c.get("text", ""))
            elif t == "execute_input":
                count = c.get("execution_count")
            elif t == "execute_result":
                em.result(c.get("data", {}), True)
            elif t == "display_data":
                em.result(c.get("data", {}), False)
            elif t == "error":
                if w.interrupted == "timeout" and c.get("ename") == "KeyboardInterrupt":
                    continue
                em.error(c.get("ename", "Error"), c.get("evalue", ""), "\n".join(c.get("traceback", [])))
            elif t == "status" and c.get("execution_state") == "idle":
                break
        return count, w.interrupted


class StreamKernel:
    """A persistent process reading code and writing stdout and stderr,
    with a marker after each run (bash, and Node through a driver)."""

    def __init__(self, cwd):
        self.cwd = cwd
        self.count = 0
        # Bounded: a process that prints without pause is held back by its
        # pipe rather than filling the server's memory.
        self.q = queue.Queue(maxsize=64)
        self.proc = None
        self.start()

    def start(self):
        env = dict(os.environ)
        env.pop("CLADE_CODEINT_PORT", None)
        self.proc = subprocess.Popen(self.argv(), cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_sigint)
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(name, f), daemon=True).start()

    def _pump(self, name, f):
        while True:
            try:
                b = os.read(f.fileno(), 65536)
            except OSError:
                b = b""
            self.q.put((name, b))
            if not b:
                return

    def alive(self):
        return self.proc.poll() is None

    def interrupt(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def shutdown(self):
        kill_tree(self.proc.pid)
        try:
            self.proc.wait(5)
        except Exception:
            pass
        # The pumps end at their pipes' EOF; take what they still hold so
        # that they are not left blocked on the bounded queue.
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        ends, until = 0, time.monotonic() + 30
        while ends < 2 and time.monotonic() < until:
            try:
                _, b = self.q.get(timeout=1)
            except queue.Empty:
                continue
            if not b:
                ends += 1

    def run(self, code, env, em, deadline, gone):
        self.count += 1
        marker = "\x00clade-end-%s\x00" % uuid.uuid4().hex
        self.send(code, env, marker)
        bufs = {"stdout": b"", "stderr": b""}
        done = {"stdout": False, "stderr": False}
        # Output is sent as it comes, a character split across reads
        # whole with its second part.
        dec = {n: codecs.getincrementaldecoder("utf-8")("replace") for n in bufs}
        status = None
        w = Watch(self, em, deadline, gone)
        mk = marker.encode()
        while not (done["stdout"] and done["stderr"]):
            w.check()
            try:
                name, b = self.q.get(timeout=0.25)
            except queue.Empty:
                if not self.alive():
                    raise KernelDied("the %s kernel died (exit status %s)" % (self.language, self.proc.returncode))
                continue
            if not b:
                # The end of one of its pipes: the kernel exited, or it
                # closed its stdout or stderr (exec >&-), after which it can
                # no longer mark a run's end: either way it is done.
                done[name] = True
                try:
                    self.proc.wait(1)
                except subprocess.TimeoutExpired:
                    pass
                for n, rest in bufs.items():
                    em.stream(n, dec[n].decode(rest, final=True))
                if self.alive():
                    raise KernelDied("the %s kernel closed its %s, so it can no longer report its runs" % (self.language, name))
                raise KernelDied("the %s kernel died (exit status %s)" % (self.language, self.proc.returncode))
            if done[name]:
                continue
            buf = bufs[name] + b
            i = buf.find(mk)
            if i >= 0:
                tail = buf[i + len(mk):]
                buf = buf[:i]
                done[name] = True
                if name == "stdout":
                    line = tail.split(b"\n", 1)[0]
                    status = line.decode("utf-8", "replace").strip()
                em.stream(name, dec[name].decode(buf, final=True))
                bufs[name] = b""
                continue
            # Hold back what could be the start of a marker split across
            # reads (a tail from a NUL on that the marker begins with);
            # send the rest as it comes, on whole UTF-8 characters.
            cut = len(buf)
            i = buf.find(b"\x00", max(0, len(buf) - len(mk) + 1))
            while i >= 0:
                if mk.startswith(buf[i:]):
                    cut = i
                    break
                i = buf.find(b"\x00", i + 1)
            em.stream(name, dec[name].decode(buf[:cut]))
            bufs[name] = buf[cut:]
        self.finish(status, em, w.interrupted)
        return self.count, w.interrupted

    def finish(self, status, em, interrupted):
        pass


class BashKernel(StreamKernel):
    language = "bash"

    def argv(self):
        return ["/bin/bash", "--noprofile", "--norc"]

    def start(self):
        super().start()
        # SIGINT interrupts the running command, not the shell.
        self.proc.stdin.write(b"trap 'true' INT\n")
        self.proc.stdin.flush()

    def send(self, code, env, marker):
        fd, path = tempfile.mkstemp(prefix="cell-", suffix=".sh", dir=RUN_DIR)
        with os.fdopen(fd, "w") as f:
            f.write(code)
            if not code.endswith("\n"):
                f.write("\n")
        exports = "".join("export %s=%s\n" % (k, shq(v)) for k, v in env.items())
        script = ("(" if env else "{ ") + exports + ". %s\n" % shq(path) + (")" if env else "}") + " </dev/null\n"
        script += "__clade_rc=$?; rm -f %s; printf '%s%%s\\n' \"$__clade_rc\"; printf '%s\\n' >&2\n" % (
            shq(path), marker.replace("\x00", "\\0"), marker.replace("\x00", "\\0"))
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()

    def finish(self, status, em, interrupted):
        if status and status != "0" and interrupted is None:
            em.error("ExitCode", "exit status " + status, "the command exited with status " + status)


def default_sigint():
    # A server started in the background of a shell inherits SIGINT
    # ignored; a kernel must be interruptible.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shq(s):
    return "'" + str(s).replace("'", "'\\''") + "'"


NODE_DRIVER = r"""
const vm = require('vm'), util = require('util'), fs = require('fs');
const ctx = vm.createContext({require, console, process, Buffer, setTimeout, clearTimeout, setInterval, clearInterval,
  setImmediate, clearImmediate, URL, TextEncoder, TextDecoder, fetch: globalThis.fetch, module: {exports: {}}, __dirname: process.cwd()});
ctx.globalThis = ctx;
process.on('SIGINT', () => {});
let buf = '';
const ctl = fs.createWriteStream(null, {fd: Number(process.env.CLADE_CTL_FD)});
async function run(msg) {
  const saved = {};
  for (const [k, v] of Object.entries(msg.env || {})) { saved[k] = process.env[k]; process.env[k] = v; }
  const out = {};
  try {
    let code = msg.code, r;
    try { r = vm.runInContext(code, ctx, {breakOnSigint: true, filename: 'cell'}); }
    catch (e) {
      if (e && e.name === 'SyntaxError' && /await/.test(code)) {
        r = await vm.runInContext('(async () => {' + code + '\n})()', ctx, {breakOnSigint: true, filename: 'cell'});
      } else throw e;
    }
    if (r && typeof r.then === 'function') r = await r;
    if (r !== undefined) out.result = util.inspect(r);
  } catch (e) {
    out.error = {name: (e && e.name) || 'Error', value: (e && e.message) || String(e), traceback: (e && e.stack) || String(e)};
  } finally {
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
  }
  ctl.write(JSON.stringify(out) + '\n');
  process.stdout.write(msg.marker + '0\n');
  process.stderr.write(msg.marker + '\n');
}
let chain = Promise.resolve();
process.stdin.on('data', d => {
  buf += d;
  let i;
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i); buf = buf.slice(i + 1);
    const msg = JSON.parse(line);
    chain = chain.then(() => run(msg));
  }
});
"""


class NodeKernel(StreamKernel):
    language = "js"

    def argv(self):
        return ["node", "-e", NODE_DRIVER]

    def start(self):
        self.ctl_buf = b""
        self.ctl_r, w = os.pipe()
        env = dict(os.environ)
        env.pop("CLADE_CODEINT_PORT", None)
        env["CLADE_CTL_FD"] = str(w)
        self.proc = subprocess.Popen(self.argv(), cwd=self.cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, pass_fds=(w,), preexec_fn=default_sigint)
        os.close(w)
        for name, f in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._pump, args=(name, f), daemon=True).start()

    def send(self, code, env, marker):
        self.proc.stdin.write((json.dumps({"code": code, "env": env, "marker": marker}) + "\n").encode())
        self.proc.stdin.flush()

    def finish(self, status, em, interrupted):
        while b"\n" not in self.ctl_buf:
            r, _, _ = select.select([self.ctl_r], [], [], 5)
            if not r:
                return
            b = os.read(self.ctl_r, 1 << 20)
            if not b:
                return
            self.ctl_buf += b
        line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
        out = json.loads(line)
        if "result" in out:
            em.result({"text/plain": out["result"]}, True)
        if "error" in out:
            e = out["error"]
            em.error(e["name"], e["value"], e["traceback"])

    def shutdown(self):
        super().shutdown()
        try:
            os.close(self.ctl_r)
        except OSError:
            pass


KERNELS = {"python": PythonKernel, "bash": BashKernel, "js": NodeKernel}


class DeadKernel:
    """What a context holds when its kernel could not start again."""

    def alive(self):
        return False

    def interrupt(self):
        pass

    def shutdown(self):
        pass


def recovery(cid):
    return ("restart the context for a new kernel (its state is lost): `clade code-context restart SANDBOX %s`, "
            "the API's POST /v1/sandboxes/SANDBOX/code/contexts/%s/restart, the SDK's RestartCodeContext, "
            "or E2B's restartCodeContext" % (cid, cid))


class Context:
    def __init__(self, language, cwd, cid=None):
        self.id = cid or str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.kernel = KERNELS[language](cwd)

    def body(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self):
        """Kills the kernel (and what it started) and starts a new one;
        the caller holds self.lock."""
        old, self.kernel = self.kernel, DeadKernel()
        old.shutdown()
        self.kernel = KERNELS[self.language](self.cwd)


class Contexts:
    def __init__(self):
        self.mu = threading.Lock()
        self.by_id = {}
        self.defaults = {}
        self.starting = 0  # contexts being created, counted in the limit

    def resolve_language(self, lang):
        if lang is None or lang == "":
            return "python"
        if not isinstance(lang, str):
            raise ClientError(400, "language must be a string")
        l = ALIASES.get(lang.lower(), "?")
        if l is None or l == "?":
            raise ClientError(400, "language %r is not served here: this interpreter serves python, bash and js (javascript)" % lang[:64])
        return l

    def create(self, language, cwd):
        language = self.resolve_language(language)
        if cwd is None or cwd == "":
            cwd = default_cwd()
        if not isinstance(cwd, str) or not cwd.startswith("/") or len(cwd) > 4096:
            raise ClientError(400, "cwd must be an absolute path")
        if not os.path.isdir(cwd):
            raise ClientError(400, "cwd %s is not a directory" % cwd[:256])
        # A slot is taken before the kernel starts (which takes seconds),
        # so that concurrent creates cannot pass the limit together.
        with self.mu:
            if len(self.by_id) + self.starting >= MAX_CONTEXTS:
                raise ClientError(429, "too many contexts (%d): remove some first" % MAX_CONTEXTS)
            self.starting += 1
        try:
            c = Context(language, cwd)
        finally:
            with self.mu:
                self.starting -= 1
        with self.mu:
            self.by_id[c.id] = c
        return c

    def default(self, language):
        language = self.resolve_language(language)
        with self.mu:
            c = self.defaults.get(language)
            if c is not None and c.id in self.by_id:
                return c
        c = Context(language, default_cwd(), cid=language)
        with self.mu:
            old = self.defaults.get(language)
            if old is not None and old.id in self.by_id:
                c.kernel.shutdown()
                return old
            self.defaults[language] = c
            self.by_id[c.id] = c
        return c

    def get(self, cid):
        if not isinstance(cid, str) or len(cid) > 128:
            raise ClientError(404, "no such context")
        with self.mu:
            c = self.by_id.get(cid)
        if c is None:
            raise ClientError(404, "context %r not found: list them with GET /contexts" % cid)
        return c

    def remove(self, cid):
        c = self.get(cid)
        with self.mu:
            self.by_id.pop(cid, None)
            if self.defaults.get(c.language) is c:
                del self.defaults[c.language]
        c.kernel.shutdown()

    def list(self):
        with self.mu:
            return [c.body() for c in self.by_id.values()]


CONTEXTS = Contexts()

try:
    with open(os.path.abspath(__file__), "rb") as _f:
        SERVER_SHA256 = hashlib.sha256(_f.read()).hexdigest()
except OSError:
    SERVER_SHA256 = ""


# ---------------------------------------------------------------- http

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "clade-codeint/1"
    deadline = None

    def log_message(self, *args):
        pass

    def reply(self, status, obj):
        b = json.dumps(obj).encode() if obj is not None else b""
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def body(self):
        n = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raise ClientError(411, "send a Content-Length")
        try:
            n = int(n or "0")
        except ValueError:
            raise ClientError(400, "bad Content-Length")
        if n < 0 or n > MAX_BODY:
            raise ClientError(413, "body larger than %d bytes" % MAX_BODY)
        raw = self.rfile.read(n) if n else b"{}"
        try:
            v = json.loads(raw or b"{}")
        except ValueError:
            raise ClientError(400, "body is not JSON")
        if not isinstance(v, dict):
            raise ClientError(400, "body must be a JSON object")
        return v

    def route(self, method):
        path = self.path.split("?", 1)[0]
        try:
            if method == "GET" and path == "/health":
                return self.reply(200, {"ok": True, "languages": list(LANGUAGES), "server": SERVER_SHA256})
            if method == "POST" and path == "/execute":
                return self.execute()
            if path == "/contexts":
                if method == "GET":
                    return self.reply(200, CONTEXTS.list())
                if method == "POST":
                    b = self.body()
                    return self.reply(200, CONTEXTS.create(b.get("language"), b.get("cwd")).body())
            parts = path.split("/")
            if len(parts) >= 3 and parts[1] == "contexts":
                cid = parts[2]
                if len(parts) == 3 and method == "DELETE":
                    CONTEXTS.remove(cid)
                    return self.reply(204, None)
                if len(parts) == 4 and parts[3] == "restart" and method == "POST":
                    c = CONTEXTS.get(cid)
                    if not c.lock.acquire(timeout=0.5):
                        # A run holds the context (one without a timeout,
                        # whose kernel ignores interrupts): its kernel is
                        # killed, which ends that run.
                        c.kernel.shutdown()
                        c.lock.acquire()
                    try:
                        c.restart()
                    finally:
                        c.lock.release()
                    return self.reply(204, None)
            raise ClientError(404, "no route %s %s" % (method, path[:200]))
        except ClientError as e:
            self.reply(e.status, {"error": str(e), "message": str(e)})
        except Exception as e:
            traceback.print_exc()
            self.reply(500, {"error": "internal error: %s" % e, "message": "internal error: %s" % e})

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def chunk(self, b):
        # A client that stops reading must not hold the run past its
        # deadline (or forever): a write it does not take within that
        # counts it gone.
        # Never less than WRITE_MIN: a client slow for a moment (a loaded
        # host) near the deadline is not gone, and a write cut by the
        # timeout leaves a partial event line behind.
        t = WRITE_TIMEOUT
        if self.deadline is not None:
            t = min(t, max(WRITE_MIN, self.deadline - time.monotonic()))
        self.connection.settimeout(t)
        self.wfile.write(b"%x\r\n%s\r\n" % (len(b), b))
        self.wfile.flush()

    def gone(self):
        try:
            r, _, _ = select.select([self.connection], [], [], 0)
            if r:
                return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True
        return False

    def execute(self):
        b = self.body()
        code = b.get("code")
        if not isinstance(code, str):
            raise ClientError(400, "code must be a string")
        cid, lang = b.get("context_id"), b.get("language")
        if cid and lang:
            raise ClientError(400, "give context_id or language, not both")
        env = b.get("env_vars") or {}
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) and ENV_NAME.fullmatch(k) and "\0" not in v for k, v in env.items()):
            # Names a shell takes (ASCII: bash refuses others and ran the
            # code without them); values without NUL (no process's
            # environment holds one: Python refused it silently).
            raise ClientError(400, "env_vars must map variable names ([A-Za-z_][A-Za-z0-9_]*) to strings without NUL")
        timeout = b.get("timeout")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ClientError(400, "timeout must be a positive number of seconds")
        c = CONTEXTS.get(cid) if cid else CONTEXTS.default(lang)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        deadline = time.monotonic() + timeout if timeout else None
        self.deadline = deadline
        em = Emitter(self.chunk)
        # A run waits for the one before it in the context; its timeout
        # counts from its request, and a client gone while it waits takes
        # its code away: code whose client gave up never runs.
        while not c.lock.acquire(timeout=GONE_EVERY):
            if deadline is not None and time.monotonic() > deadline:
                em.error("TimeoutError", "execution timed out after %gs waiting for the run before it in context %s to end: "
                         "the code did not run" % (timeout, c.id), "")
                return self.end(em)
            if em.broken or self.gone():
                self.close_connection = True
                return
        try:
            try:
                if not c.kernel.alive():
                    raise KernelDied("the %s kernel of context %s is dead" % (c.language, c.id))
                count, interrupted = c.kernel.run(code, env, em, deadline, self.gone)
                if interrupted == "timeout":
                    em.error("TimeoutError", "execution timed out after %gs: the kernel was interrupted; the context keeps its state" % timeout, "")
                if count is not None:
                    em.send({"type": "number_of_executions", "execution_count": count})
            except KernelDied as e:
                # What the dead kernel left (its process group, children)
                # goes too; the context stays dead until restarted.
                c.kernel.shutdown()
                em.error("KernelDied", "%s (it exited or was killed: its state is lost); %s" % (e, recovery(c.id)), "")
            except Stuck as e:
                try:
                    c.restart()
                    state = "the context was restarted: its kernel is new and its state (variables, imports) is lost"
                except Exception as err:
                    state = "its kernel was killed and did not start again (%s); %s" % (err, recovery(c.id))
                if e.why == "timeout":
                    em.error("TimeoutError", "execution timed out after %gs and the kernel did not stop within %gs of an interrupt "
                             "(the code ignores SIGINT or is stuck in native code): %s" % (timeout, INTERRUPT_GRACE, state), "")
                else:
                    em.error("Interrupted", "the client went away and the kernel did not stop within %gs of an interrupt: %s" % (INTERRUPT_GRACE, state), "")
            except Exception as e:
                # The answer has begun: an error goes in it, not as a
                # status. A kernel killed under the run (a restart or a
                # removal of its context) ends up here too.
                if not c.kernel.alive():
                    c.kernel.shutdown()
                    em.error("KernelDied", "the %s kernel of context %s was stopped during the run; %s" % (c.language, c.id, recovery(c.id)), "")
                else:
                    traceback.print_exc()
                    em.error("InternalError", "the interpreter failed: %s" % e, "")
        finally:
            c.lock.release()
        self.end(em)

    def end(self, em):
        em.send({"type": "end_of_execution"})
        if em.broken:
            self.close_connection = True
            return
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    os.makedirs(RUN_DIR, mode=0o700, exist_ok=True)
    # Started in a shell's background, SIGINT is ignored, and kernels would
    # inherit that: interrupts must reach them.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # The default Python context starts ahead, so that the first run does
    # not wait for a kernel: the port listens only once it is up.
    CONTEXTS.default("python")
    srv = Server(("0.0.0.0", PORT), Handler)
    print("clade code interpreter listening on port %d" % PORT, flush=True)
    srv.serve_forever()


if __name__ == "__main__":
    main()
